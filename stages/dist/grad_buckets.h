// Gradients of many parameters seen as one flat vector cut into fixed-size buckets, so a
// collective reduces a few large messages instead of one per tensor. A parameter may straddle
// two buckets; flatten/unflatten copy exactly the bucket's range.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/stage.h"

namespace slipstream::dist {

class GradBuckets {
 public:
  GradBuckets() = default;
  GradBuckets(const std::vector<Parameter*>& params, size_t bucket_elems);

  size_t total() const { return total_; }
  size_t count() const { return total_ == 0 ? 0 : (total_ + bucket_ - 1) / bucket_; }
  size_t bucket_elems() const { return bucket_; }
  // Elements in bucket i (the last may be short).
  size_t size(size_t i) const;
  // dst[0, size(i)) = the gradients covered by bucket i.
  void flatten(size_t i, float* dst) const;
  // gradients covered by bucket i = src * scale.
  void unflatten(size_t i, const float* src, float scale) const;

 private:
  // Calls f(grad pointer, offset in the bucket, n) for each piece of bucket i.
  template <class F>
  void pieces(size_t i, F&& f) const;

  std::vector<float*> grads_;
  std::vector<size_t> begin_;  // flat offset of each parameter
  std::vector<size_t> numel_;
  size_t total_ = 0, bucket_ = 1;
};

}  // namespace slipstream::dist
