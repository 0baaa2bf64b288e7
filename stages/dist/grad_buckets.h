// Gradients of many parameters seen as one sequence, in the order given (allreduce gives the
// order the backward pass finishes them: the last stage's last parameter first), cut into
// buckets of at most `bucket_elems` floats, so a collective reduces a few large messages instead
// of one per tensor and can start on the first bucket while the backward is still running.
//
// The gradients may live on the host or on one CUDA device (device pointers are only compared,
// never read here; flatten, unflatten and scale are for host buckets).
//
// A bucket that covers one block of memory (neighbouring parameters of one stage's flat store,
// taken in either direction) is reduced where it lies; one that spans separate blocks goes
// through a staging buffer (flatten, reduce, unflatten). A parameter may straddle two buckets.
#pragma once

#include <cstddef>
#include <vector>

#include "engine/optimizer_shard.h"
#include "engine/stage.h"

namespace slipstream::dist {

class GradBuckets {
 public:
  GradBuckets() = default;
  // The first bucket holds at most `first_bucket_elems` (0: bucket_elems), so that
  // communication starts soon after the backward pass does, as PyTorch DDP's first bucket.
  GradBuckets(const std::vector<Parameter*>& params, size_t bucket_elems,
              size_t first_bucket_elems = 0);

  size_t total() const { return total_; }
  const std::vector<Parameter*>& params() const { return params_; }
  const Device& device() const { return device_; }
  size_t count() const { return buckets_.size(); }
  size_t bucket_elems() const { return bucket_; }
  // Elements in bucket i (the last may be short).
  size_t size(size_t i) const { return buckets_[i].size; }
  // Bucket i's memory when it is one block (reduce in place), else null (stage it).
  float* contiguous(size_t i) const { return buckets_[i].block; }
  // The largest bucket that needs staging (0 when every bucket is one block).
  size_t staging_elems() const;
  // dst[0, size(i)) = the gradients covered by bucket i.
  void flatten(size_t i, float* dst) const;
  // gradients covered by bucket i = src * scale.
  void unflatten(size_t i, const float* src, float scale) const;
  // gradients covered by bucket i *= scale.
  void scale(size_t i, float scale) const;

  // Readiness: parameter k (position in the constructor's list) has a piece in these buckets;
  // bucket i holds pieces of this many distinct parameters.
  size_t param_count() const { return of_param_.size(); }
  const std::vector<size_t>& buckets_of(size_t param) const { return of_param_[param]; }
  size_t params_in(size_t i) const { return buckets_[i].params; }

  struct Piece {
    float* grad;
    size_t offset;  // in the bucket's flat order
    size_t n;
    size_t param;  // position in the constructor's list
    size_t at;     // first element within that parameter
  };
  const std::vector<Piece>& pieces(size_t i) const { return buckets_[i].pieces; }

  // ---- ZeRO-1: ranks reduce disjoint ranges of each bucket's buffer ----
  // A bucket's buffer is its memory when it is one block (memory order), else its staging
  // buffer (flat order); a reduce-scatter gives each rank one range of it.
  size_t buffer_offset(size_t i, const Piece& p) const {
    return buckets_[i].block ? static_cast<size_t>(p.grad - buckets_[i].block) : p.offset;
  }
  // gradients at buffer positions [begin, begin + n) of bucket i = src[0, n) * scale.
  void unflatten_range(size_t i, const float* src, size_t begin, size_t n, float scale) const;
  // The parameters' element ranges at buffer positions [begin, begin + n) of bucket i, in
  // buffer order (a parameter has one piece in a bucket).
  using Range = OptimizerShard::Piece;
  std::vector<Range> ranges(size_t i, size_t begin, size_t n) const;
  // Rank r of w reduces buffer positions [shard_begin, shard_begin + shard_count) of bucket i:
  // the buffer split evenly, [size·r/w, size·(r+1)/w).
  size_t shard_begin(size_t i, int r, int w) const {
    return size(i) * static_cast<size_t>(r) / static_cast<size_t>(w);
  }
  size_t shard_count(size_t i, int r, int w) const {
    return shard_begin(i, r + 1, w) - shard_begin(i, r, w);
  }
  // Rank r's parameter ranges over every bucket, in bucket order (a parameter split between two
  // buckets that continues in r's next range is one range).
  std::vector<Range> shard_pieces(int r, int w) const;
  // The weights (Parameter::value) that bucket i's gradients belong to, when they lie in one
  // block in the same arrangement (the parameter arena's values mirror its gradients): reduce
  // them in place; else null, and flatten_values / unflatten_values stage them.
  float* value_block(size_t i) const { return buckets_[i].values; }
  void flatten_values(size_t i, float* dst) const;
  void unflatten_values(size_t i, const float* src) const;
  // Buffer position of piece p's values (the same as its gradients').
  float* value_of(const Piece& p) const { return params_[p.param]->value.data<float>() + p.at; }

 private:
  struct Bucket {
    std::vector<Piece> pieces;
    size_t size = 0, params = 0;
    float* block = nullptr;   // set when the pieces tile one block of memory
    float* values = nullptr;  // value_block()
  };
  std::vector<Parameter*> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> of_param_;
  size_t total_ = 0, bucket_ = 1;
  Device device_;
};

}  // namespace slipstream::dist
