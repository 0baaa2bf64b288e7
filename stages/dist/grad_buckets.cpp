#include "stages/dist/grad_buckets.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace slipstream::dist {

GradBuckets::GradBuckets(const std::vector<Parameter*>& params, size_t bucket_elems)
    : bucket_(std::max<size_t>(1, bucket_elems)) {
  of_param_.resize(params.size());
  // The bucket being filled: its pieces tile [lo, hi) of `block_of`'s allocation while `tiled`.
  const Tensor* block_of = nullptr;
  float *lo = nullptr, *hi = nullptr;
  bool tiled = false;
  auto close = [&] {
    if (!buckets_.empty() && tiled) buckets_.back().block = lo;
    block_of = nullptr;
    tiled = false;
  };
  for (size_t k = 0; k < params.size(); ++k) {
    const Parameter* p = params[k];
    if (!p->grad.defined() || p->grad.dtype() != DType::f32 || !p->grad.device().is_cpu())
      throw std::runtime_error("allreduce: parameter '" + p->name + "' needs an f32 CPU gradient");
    float* first = p->grad.data<float>();
    float* last = first + p->grad.numel();  // the part not yet in a bucket is [first, last)
    while (first < last) {
      if (buckets_.empty() || buckets_.back().size == bucket_) {
        close();
        buckets_.emplace_back();
      }
      Bucket& b = buckets_.back();
      const size_t take = std::min(static_cast<size_t>(last - first), bucket_ - b.size);
      // Extend the block downwards when this parameter ends where it starts (a store walked in
      // reverse), else take from the front. Placement within one allocation is the same on
      // every rank, so every rank cuts the same buckets.
      const bool same = block_of && block_of->same_block(p->grad);
      float* piece = first;
      if (same && last == lo) {
        piece = last - take;
        last -= take;
      } else {
        first += take;
      }
      if (b.pieces.empty()) {
        block_of = &p->grad;
        lo = piece, hi = piece + take, tiled = true;
      } else if (same && piece + take == lo) {
        lo = piece;
      } else if (same && piece == hi) {
        hi = piece + take;
      } else {
        tiled = false;
      }
      b.pieces.push_back({piece, b.size, take});
      b.size += take;
      if (of_param_[k].empty() || of_param_[k].back() != buckets_.size() - 1) {
        of_param_[k].push_back(buckets_.size() - 1);
        ++b.params;
      }
    }
    total_ += static_cast<size_t>(p->grad.numel());
  }
  close();
}

size_t GradBuckets::staging_elems() const {
  size_t n = 0;
  for (const Bucket& b : buckets_)
    if (!b.block) n = std::max(n, b.size);
  return n;
}

void GradBuckets::flatten(size_t i, float* dst) const {
  for (const Piece& p : buckets_[i].pieces)
    std::memcpy(dst + p.offset, p.grad, p.n * sizeof(float));
}

void GradBuckets::unflatten(size_t i, const float* src, float scale) const {
  for (const Piece& p : buckets_[i].pieces)
    for (size_t j = 0; j < p.n; ++j) p.grad[j] = src[p.offset + j] * scale;
}

void GradBuckets::scale(size_t i, float scale) const {
  for (const Piece& p : buckets_[i].pieces)
    for (size_t j = 0; j < p.n; ++j) p.grad[j] *= scale;
}

}  // namespace slipstream::dist
