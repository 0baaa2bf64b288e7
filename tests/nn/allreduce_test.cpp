// GradBuckets: flattening many gradients into fixed-size buckets and back.
#include <gtest/gtest.h>

#include <numeric>

#include "stages/dist/grad_buckets.h"

namespace slipstream::dist {
namespace {

struct Params {
  std::vector<Parameter> storage;
  std::vector<Parameter*> ptrs;
  explicit Params(std::vector<int64_t> sizes) {
    float next = 1;
    for (int64_t n : sizes) {
      Parameter p;
      p.name = "p" + std::to_string(storage.size());
      p.grad = Tensor::empty({n}, DType::f32);
      for (int64_t i = 0; i < n; ++i) p.grad.data<float>()[i] = next++;
      storage.push_back(std::move(p));
    }
    for (auto& p : storage) ptrs.push_back(&p);
  }
};

class GradBucketsTest : public ::testing::TestWithParam<size_t> {};

TEST_P(GradBucketsTest, FlattenCoversEveryGradientOnceInOrder) {
  Params ps({5, 1, 13, 7, 6});
  GradBuckets b(ps.ptrs, GetParam());
  ASSERT_EQ(b.total(), 32u);
  std::vector<float> flat;
  size_t sum = 0;
  for (size_t i = 0; i < b.count(); ++i) {
    std::vector<float> buf(b.size(i), -1.0f);
    b.flatten(i, buf.data());
    flat.insert(flat.end(), buf.begin(), buf.end());
    sum += b.size(i);
    EXPECT_LE(b.size(i), GetParam());
  }
  EXPECT_EQ(sum, 32u);
  std::vector<float> want(32);
  std::iota(want.begin(), want.end(), 1.0f);
  EXPECT_EQ(flat, want);
}

TEST_P(GradBucketsTest, UnflattenWritesScaledValuesBack) {
  Params ps({5, 1, 13, 7, 6});
  GradBuckets b(ps.ptrs, GetParam());
  for (size_t i = 0; i < b.count(); ++i) {
    std::vector<float> buf(b.size(i));
    b.flatten(i, buf.data());
    for (float& v : buf) v *= 3;  // as if three ranks held the same values
    b.unflatten(i, buf.data(), 1.0f / 3);
  }
  float next = 1;
  for (const auto& p : ps.storage)
    for (int64_t i = 0; i < p.grad.numel(); ++i) EXPECT_FLOAT_EQ(p.grad.data<float>()[i], next++);
  // Scale alone: halves every gradient.
  for (size_t i = 0; i < b.count(); ++i) {
    std::vector<float> buf(b.size(i));
    b.flatten(i, buf.data());
    b.unflatten(i, buf.data(), 0.5f);
  }
  EXPECT_FLOAT_EQ(ps.storage[2].grad.data<float>()[0], 7.0f * 0.5f);
}

INSTANTIATE_TEST_SUITE_P(BucketSizes, GradBucketsTest, ::testing::Values(1, 4, 6, 13, 32, 1000));

TEST(GradBuckets, EmptySetHasNoBuckets) {
  GradBuckets b({}, 16);
  EXPECT_EQ(b.count(), 0u);
}

}  // namespace
}  // namespace slipstream::dist
