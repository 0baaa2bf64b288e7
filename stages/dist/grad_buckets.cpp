#include "stages/dist/grad_buckets.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace slipstream::dist {

GradBuckets::GradBuckets(const std::vector<Parameter*>& params, size_t bucket_elems,
                         size_t first_bucket_elems)
    : params_(params), bucket_(std::max<size_t>(1, bucket_elems)) {
  const size_t first_cap = first_bucket_elems > 0 ? std::min(first_bucket_elems, bucket_) : bucket_;
  auto cap = [&](size_t i) { return i == 0 ? first_cap : bucket_; };
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
    if (!p->grad.defined() || p->grad.dtype() != DType::f32)
      throw std::runtime_error("allreduce: parameter '" + p->name + "' needs an f32 gradient");
    if (k == 0) device_ = p->grad.device();
    if (p->grad.device() != device_)
      throw std::runtime_error("allreduce: parameter '" + p->name + "' has its gradient on " +
                               p->grad.device().str() + ", '" + params[0]->name + "' on " +
                               device_.str() +
                               ": one reduction needs every gradient on one device");
    float* first = p->grad.data<float>();
    float* last = first + p->grad.numel();  // the part not yet in a bucket is [first, last)
    // A store listed last parameter first is walked from its end down: take this parameter from
    // its tail when its neighbours in the list sit just above or below it in one allocation.
    // Placement within one allocation is the same on every rank, so every rank cuts the same
    // buckets.
    auto adjacent_below = [&](size_t j) {  // params[j] ends where this one starts
      return j < params.size() && params[j]->grad.defined() &&
             params[j]->grad.dtype() == DType::f32 && params[j]->grad.same_block(p->grad) &&
             params[j]->grad.data<float>() + params[j]->grad.numel() == first;
    };
    auto adjacent_above = [&](size_t j) {  // params[j] starts where this one ends
      return j < params.size() && params[j]->grad.defined() &&
             params[j]->grad.dtype() == DType::f32 && params[j]->grad.same_block(p->grad) &&
             params[j]->grad.data<float>() == last;
    };
    const bool descending = adjacent_below(k + 1) || (k > 0 && adjacent_above(k - 1));
    while (first < last) {
      if (buckets_.empty() || buckets_.back().size == cap(buckets_.size() - 1)) {
        close();
        buckets_.emplace_back();
      }
      Bucket& b = buckets_.back();
      const size_t take =
          std::min(static_cast<size_t>(last - first), cap(buckets_.size() - 1) - b.size);
      float* piece = first;
      if (descending) {
        piece = last - take;
        last -= take;
      } else {
        first += take;
      }
      if (b.pieces.empty()) {
        block_of = &p->grad;
        lo = piece, hi = piece + take, tiled = true;
      } else if (block_of->same_block(p->grad) && piece + take == lo) {
        lo = piece;
      } else if (block_of->same_block(p->grad) && piece == hi) {
        hi = piece + take;
      } else {
        tiled = false;
      }
      b.pieces.push_back(
          {piece, b.size, take, k, static_cast<size_t>(piece - p->grad.data<float>())});
      b.size += take;
      if (of_param_[k].empty() || of_param_[k].back() != buckets_.size() - 1) {
        of_param_[k].push_back(buckets_.size() - 1);
        ++b.params;
      }
    }
    total_ += static_cast<size_t>(p->grad.numel());
  }
  close();
  // Weights in the gradients' arrangement: the bucket's values are one block too.
  for (Bucket& b : buckets_) {
    if (!b.block) continue;
    const Piece& first = b.pieces.front();
    const Tensor* first_value = &params_[first.param]->value;
    auto usable = [&](const Piece& q) {
      const Tensor& v = params_[q.param]->value;
      return v.defined() && v.dtype() == DType::f32 && v.device() == device_ &&
             v.numel() == params_[q.param]->grad.numel() && v.same_block(*first_value);
    };
    if (!usable(first)) continue;
    float* base = value_of(first) - (first.grad - b.block);
    const bool same = std::all_of(b.pieces.begin(), b.pieces.end(), [&](const Piece& q) {
      return usable(q) && value_of(q) == base + (q.grad - b.block);
    });
    if (same) b.values = base;
  }
}

void GradBuckets::unflatten_range(size_t i, const float* src, size_t begin, size_t n,
                                  float scale) const {
  if (float* block = buckets_[i].block) {
    for (size_t j = 0; j < n; ++j) block[begin + j] = src[j] * scale;
    return;
  }
  for (const Piece& p : buckets_[i].pieces) {
    const size_t lo = std::max(begin, p.offset), hi = std::min(begin + n, p.offset + p.n);
    for (size_t j = lo; j < hi; ++j) p.grad[j - p.offset] = src[j - begin] * scale;
  }
}

std::vector<GradBuckets::Range> GradBuckets::ranges(size_t i, size_t begin, size_t n) const {
  std::vector<std::pair<size_t, Range>> found;  // (buffer position, range)
  for (const Piece& p : buckets_[i].pieces) {
    const size_t o = buffer_offset(i, p);
    const size_t lo = std::max(begin, o), hi = std::min(begin + n, o + p.n);
    if (lo < hi) found.push_back({lo, {params_[p.param], p.at + (lo - o), hi - lo}});
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Range> out;
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

std::vector<GradBuckets::Range> GradBuckets::shard_pieces(int r, int w) const {
  std::vector<Range> out;
  for (size_t i = 0; i < count(); ++i)
    for (const auto& piece : ranges(i, shard_begin(i, r, w), shard_count(i, r, w))) {
      if (!out.empty() && out.back().param == piece.param &&
          out.back().begin + out.back().n == piece.begin)
        out.back().n += piece.n;
      else
        out.push_back(piece);
    }
  return out;
}

void GradBuckets::flatten_values(size_t i, float* dst) const {
  for (const Piece& p : buckets_[i].pieces)
    std::memcpy(dst + buffer_offset(i, p), value_of(p), p.n * sizeof(float));
}

void GradBuckets::unflatten_values(size_t i, const float* src) const {
  for (const Piece& p : buckets_[i].pieces)
    std::memcpy(value_of(p), src + buffer_offset(i, p), p.n * sizeof(float));
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
