// GradBuckets: flattening many gradients into fixed-size buckets and back.
#include <gtest/gtest.h>

#include <algorithm>
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

// Parameters that are views of one store, listed last first (the backward pass's order), as the
// allreduce stage lists a model's: every bucket inside the store is one block, reduced in place.
TEST(GradBuckets, AStoreWalkedInReverseGivesInPlaceBuckets) {
  Tensor store = Tensor::empty({40}, DType::f32);
  for (int i = 0; i < 40; ++i) store.data<float>()[i] = float(i);
  std::vector<Parameter> ps(4);
  const int64_t at[5] = {0, 10, 13, 30, 40};
  for (int k = 0; k < 4; ++k) ps[size_t(k)].grad = store.slice_rows(at[k], at[k + 1]);
  std::vector<Parameter*> order = {&ps[3], &ps[2], &ps[1], &ps[0]};
  GradBuckets b(order, 12, 5);
  ASSERT_EQ(b.total(), 40u);
  EXPECT_EQ(b.size(0), 5u);  // the first bucket's own cap
  size_t covered = 0;
  std::vector<int> seen(40, 0);
  for (size_t i = 0; i < b.count(); ++i) {
    ASSERT_NE(b.contiguous(i), nullptr) << "bucket " << i;
    const float* block = b.contiguous(i);
    for (size_t j = 0; j < b.size(i); ++j) ++seen[size_t(block[j])];
    covered += b.size(i);
  }
  EXPECT_EQ(covered, 40u);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 40);
  // The first bucket starts at the end of the store: the last parameter's tail.
  EXPECT_EQ(b.contiguous(0)[0], 35.0f);
  EXPECT_EQ(b.staging_elems(), 0u);
  // Readiness: parameter 0 of the list (ps[3], 10 floats) lies in buckets 0 and 1.
  EXPECT_EQ(b.buckets_of(0), (std::vector<size_t>{0, 1}));
  size_t pieces = 0;
  for (size_t i = 0; i < b.count(); ++i) pieces += b.params_in(i);
  size_t memberships = 0;
  for (size_t k = 0; k < b.param_count(); ++k) memberships += b.buckets_of(k).size();
  EXPECT_EQ(pieces, memberships);
}

// Separate allocations in one bucket go through staging; scale() and unflatten() agree.
TEST(GradBuckets, SeparateTensorsAreStaged) {
  Params ps({3, 4});
  GradBuckets b(ps.ptrs, 100);
  ASSERT_EQ(b.count(), 1u);
  EXPECT_EQ(b.contiguous(0), nullptr);
  EXPECT_EQ(b.staging_elems(), 7u);
  b.scale(0, 2.0f);
  EXPECT_FLOAT_EQ(ps.storage[1].grad.data<float>()[3], 14.0f);
}

TEST(GradBuckets, EmptySetHasNoBuckets) {
  GradBuckets b({}, 16);
  EXPECT_EQ(b.count(), 0u);
}

}  // namespace
}  // namespace slipstream::dist
