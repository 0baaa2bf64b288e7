#include "stages/dist/grad_buckets.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace slipstream::dist {

GradBuckets::GradBuckets(const std::vector<Parameter*>& params, size_t bucket_elems)
    : bucket_(std::max<size_t>(1, bucket_elems)) {
  for (Parameter* p : params) {
    if (!p->grad.defined() || p->grad.dtype() != DType::f32 || !p->grad.device().is_cpu())
      throw std::runtime_error("allreduce: parameter '" + p->name + "' needs an f32 CPU gradient");
    grads_.push_back(p->grad.data<float>());
    begin_.push_back(total_);
    numel_.push_back(static_cast<size_t>(p->grad.numel()));
    total_ += numel_.back();
  }
}

size_t GradBuckets::size(size_t i) const {
  const size_t b = i * bucket_;
  return b >= total_ ? 0 : std::min(bucket_, total_ - b);
}

template <class F>
void GradBuckets::pieces(size_t i, F&& f) const {
  const size_t lo = i * bucket_, hi = lo + size(i);
  // First parameter whose range ends after lo.
  size_t k =
      static_cast<size_t>(std::upper_bound(begin_.begin(), begin_.end(), lo) - begin_.begin());
  k = k == 0 ? 0 : k - 1;
  for (; k < grads_.size() && begin_[k] < hi; ++k) {
    const size_t a = std::max(lo, begin_[k]), e = std::min(hi, begin_[k] + numel_[k]);
    if (a < e) f(grads_[k] + (a - begin_[k]), a - lo, e - a);
  }
}

void GradBuckets::flatten(size_t i, float* dst) const {
  pieces(i, [&](float* g, size_t off, size_t n) { std::memcpy(dst + off, g, n * sizeof(float)); });
}

void GradBuckets::unflatten(size_t i, const float* src, float scale) const {
  pieces(i, [&](float* g, size_t off, size_t n) {
    for (size_t j = 0; j < n; ++j) g[j] = src[off + j] * scale;
  });
}

}  // namespace slipstream::dist
