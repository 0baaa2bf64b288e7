#include "engine/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "engine/memory_pool.h"

namespace slipstream {
namespace {

TEST(Shape, Basics) {
  Shape s{256, 60, 128};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 256 * 60 * 128);
  EXPECT_EQ(s.str(), "[256, 60, 128]");
  EXPECT_EQ(s[1], 60);
  EXPECT_EQ(s, (Shape{256, 60, 128}));
  EXPECT_FALSE(s == (Shape{256, 60}));
  EXPECT_FALSE(s == (Shape{256, 61, 128}));
  const int64_t dims[] = {2, 3};
  EXPECT_EQ(Shape(std::span<const int64_t>(dims)), (Shape{2, 3}));
}

TEST(Shape, ScalarAndEmpty) {
  Shape scalar;
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.str(), "[]");
  EXPECT_EQ((Shape{4, 0, 3}).numel(), 0);
}

TEST(Shape, RejectsBadDims) {
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8, 9}), std::invalid_argument);
  EXPECT_THROW((Shape{2, -1}), std::invalid_argument);
  EXPECT_NO_THROW((Shape{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(Tensor, EmptyAndZeros) {
  Tensor t = Tensor::empty({4, 5}, DType::f32);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.dim(1), 5);
  EXPECT_EQ(t.numel(), 20);
  EXPECT_EQ(t.nbytes(), 80u);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);

  Tensor z = Tensor::zeros({3, 7}, DType::bf16);
  for (uint16_t v : z.span<uint16_t>()) EXPECT_EQ(v, 0);
  EXPECT_EQ(z.describe(), "bf16[3, 7] on cpu");
  EXPECT_EQ(Tensor().describe(), "undefined tensor");
}

TEST(Tensor, TypedAccessChecksElementSize) {
  Tensor t = Tensor::empty({2}, DType::f32);
  EXPECT_NO_THROW(t.data<float>());
  EXPECT_NO_THROW(t.data<int32_t>());  // same size: allowed by design
  EXPECT_THROW(t.data<double>(), std::logic_error);
  EXPECT_THROW(t.data<uint16_t>(), std::logic_error);
}

TEST(Tensor, ReshapeSharesStorage) {
  Tensor t = Tensor::empty({2, 6}, DType::i32);
  std::iota(t.span<int32_t>().begin(), t.span<int32_t>().end(), 0);
  Tensor r = t.reshape({3, 4});
  EXPECT_TRUE(r.same_storage(t));
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  r.data<int32_t>()[5] = 100;
  EXPECT_EQ(t.data<int32_t>()[5], 100);
  try {
    (void)t.reshape({5, 3});
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("i32[2, 6] on cpu"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("12 vs 15"), std::string::npos) << e.what();
  }
}

TEST(Tensor, SliceRowsIsAView) {
  Tensor t = Tensor::empty({5, 3}, DType::f64);
  for (int64_t i = 0; i < 15; ++i) t.data<double>()[i] = static_cast<double>(i);
  Tensor s = t.slice_rows(1, 4);
  EXPECT_EQ(s.shape(), (Shape{3, 3}));
  EXPECT_FALSE(s.same_storage(t));  // same storage, different offset
  EXPECT_EQ(s.data<double>()[0], 3.0);
  EXPECT_EQ(s.data<double>()[8], 11.0);
  s.data<double>()[0] = -1;
  EXPECT_EQ(t.data<double>()[3], -1.0);
  Tensor nested = s.slice_rows(2, 3);
  EXPECT_EQ(nested.data<double>()[0], 9.0);
  EXPECT_EQ(t.slice_rows(2, 2).numel(), 0);
  EXPECT_THROW((void)t.slice_rows(3, 6), std::out_of_range);
  EXPECT_THROW((void)t.slice_rows(-1, 2), std::out_of_range);
  EXPECT_THROW((void)t.slice_rows(3, 2), std::out_of_range);
  Tensor scalar = Tensor::empty({}, DType::f32);
  EXPECT_THROW((void)scalar.slice_rows(0, 1), std::invalid_argument);
}

TEST(Tensor, CloneIsDeep) {
  Tensor t = Tensor::empty({4, 2}, DType::u8);
  for (int i = 0; i < 8; ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(i * 3);
  Tensor c = t.slice_rows(1, 3).clone();
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_EQ(c.data<uint8_t>()[0], 6);
  c.data<uint8_t>()[0] = 200;
  EXPECT_EQ(t.data<uint8_t>()[2], 6);
}

TEST(Tensor, CopyFromAndZero) {
  Tensor a = Tensor::empty({3}, DType::i64);
  Tensor b = Tensor::zeros({3}, DType::i64);
  a.data<int64_t>()[0] = 7;
  a.data<int64_t>()[2] = -9;
  b.copy_from(a);
  EXPECT_EQ(b.data<int64_t>()[2], -9);
  b.zero_();
  EXPECT_EQ(b.data<int64_t>()[0], 0);
  EXPECT_THROW(b.copy_from(Tensor::empty({4}, DType::i64)), std::invalid_argument);
  EXPECT_THROW(b.copy_from(Tensor::empty({3}, DType::f64)), std::invalid_argument);
  EXPECT_THROW(Tensor().zero_(), std::logic_error);
}

TEST(Tensor, BorrowIsNotFreedByUs) {
  std::vector<float> buf(6, 1.5f);
  const auto before = Pools::host().stats();
  {
    Tensor t = Tensor::borrow(buf.data(), {2, 3}, DType::f32);
    EXPECT_EQ(t.data<float>(), buf.data());
    t.data<float>()[5] = 2.5f;
  }
  EXPECT_EQ(buf[5], 2.5f);
  EXPECT_EQ(Pools::host().stats().allocations, before.allocations);
}

TEST(Tensor, StorageReturnsToPool) {
  MemoryPool& pool = Pools::host();
  const auto before = pool.stats();
  {
    Tensor t = Tensor::empty({1000}, DType::f32, Device::cpu(), "storage test");
    Tensor view = t.slice_rows(10, 20);
    t = Tensor();
    EXPECT_EQ(pool.stats().in_use_bytes, before.in_use_bytes + pool_size_class(4000));
    (void)view;
  }
  EXPECT_EQ(pool.stats().in_use_bytes, before.in_use_bytes);
}

TEST(Tensor, CudaTensorWithoutDeviceThrowsWithReason) {
  CudaProbe p = probe_cuda();
  if (p.available) GTEST_SKIP() << "a CUDA device is present; covered by core_gpu_test";
  try {
    (void)Tensor::empty({4}, DType::f32, Device::cuda(0));
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(p.reason), std::string::npos) << e.what();
  }
}

}  // namespace
TEST(Tensor, AddF32) {
  Tensor a = Tensor::empty({2, 3}, DType::f32), b = Tensor::empty({2, 3}, DType::f32);
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = float(i), b.data<float>()[i] = 0.5f * float(i);
  Tensor out = Tensor::empty({2, 3}, DType::f32);
  add_f32(a, b, out);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out.data<float>()[i], 1.5f * float(i));
  add_f32(out, b, out);  // in place
  EXPECT_EQ(out.data<float>()[5], 2.0f * 5);
  EXPECT_THROW(add_f32(a, Tensor::empty({3, 2}, DType::f32), out), std::invalid_argument);
  EXPECT_THROW(add_f32(a, b, Tensor::empty({2, 3}, DType::f64)), std::invalid_argument);
}

}  // namespace slipstream
