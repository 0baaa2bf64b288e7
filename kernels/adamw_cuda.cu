// The fused multi-tensor AdamW on CUDA; math of the CPU reference (kernels/adamw_cpu.cpp) and
// policy of the CPU optimizer (stages/optim/adamw_optimizer.cpp: norm, skip, clip, schedule),
// against which it is tested. Two launches, no host synchronisation: per-block partial sums of
// squares whose last block sums them and decides the step, and the update (across ranks three:
// the ranks' sums are summed before a one-thread launch decides). Grids are
// (blocks per segment, segments) with a fixed block count, so the norm's summation order, and
// with it every result, does not depend on timing.
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/cuda_common.cuh"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

using AdamWSegment = Kernels::AdamWSegment;
using AdamWHyper = Kernels::AdamWHyper;
using AdamWDeviceState = Kernels::AdamWDeviceState;

namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocksPerSegment = 64;

unsigned blocks_per_segment(size_t max_n) {
  const size_t b = (max_n + kThreads * 4 - 1) / (kThreads * 4);
  return unsigned(b < 1 ? 1 : (b > kMaxBlocksPerSegment ? kMaxBlocksPerSegment : b));
}

// The step from the sum of squares (one thread).
__device__ void decide(double sq, const AdamWHyper& h, const float* lr_table, size_t lr_len,
                       AdamWDeviceState* st) {
  const double norm = sqrt(sq) * double(h.grad_scale);
  st->grad_norm = float(norm);
  const size_t at = size_t(st->step) < lr_len ? size_t(st->step) : lr_len - 1;
  st->lr = lr_table[at];
  st->finite = isfinite(norm) ? 1 : 0;
  double scale = h.grad_scale;
  if (h.clip > 0 && norm > double(h.clip)) scale *= double(h.clip) / norm;
  st->scale = float(scale);
  if (st->finite) st->step += 1;
}

SLIPSTREAM_BLOCK_COUNTER(norm_blocks);

// Each block's partial sum of squares; the last block to finish sums the partials into *sq
// (thread t sums partials t, t + kThreads, ... in double, then a tree in shared memory in a fixed
// order: a serial loop over the thousands of partials of a large model took longer than the
// update itself) and, with `decide_here` (no sum over ranks in between), decides the step.
__global__ void __launch_bounds__(kThreads)
    norm_kernel(const AdamWSegment* segs, float* part, double* sq, AdamWHyper h,
                const float* lr_table, size_t lr_len, AdamWDeviceState* st, int decide_here) {
  __shared__ float warp_sums[kThreads / 32];
  __shared__ double sums[kThreads];
  const AdamWSegment s = segs[blockIdx.y];
  const size_t stride = size_t(gridDim.x) * kThreads;
  float acc = 0.f;
  for (size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x; i < s.n; i += stride)
    acc += s.grad[i] * s.grad[i];
  acc = group_sum<32>(acc);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) t += warp_sums[w];
    part[size_t(blockIdx.y) * gridDim.x + blockIdx.x] = t;
  }
  if (!last_block(&norm_blocks)) return;
  const int K = int(gridDim.x * gridDim.y);
  double total = 0;
  for (int k = int(threadIdx.x); k < K; k += kThreads) total += double(__ldcg(part + k));
  sums[threadIdx.x] = total;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  *sq = sums[0];
  if (decide_here) decide(sums[0], h, lr_table, lr_len, st);
}

// One thread decides from the sum of squares the ranks summed.
__global__ void decide_kernel(const double* sum_sq, AdamWHyper h, const float* lr_table,
                              size_t lr_len, AdamWDeviceState* st) {
  decide(*sum_sq, h, lr_table, lr_len, st);
}

__global__ void __launch_bounds__(kThreads)
    update_kernel(const AdamWSegment* segs, AdamWHyper h, const AdamWDeviceState* st) {
  const AdamWSegment s = segs[blockIdx.y];
  const size_t stride = size_t(gridDim.x) * kThreads;
  const size_t i0 = size_t(blockIdx.x) * kThreads + threadIdx.x;
  if (!st->finite) {
    for (size_t i = i0; i < s.n; i += stride) s.grad[i] = 0.f;
    return;
  }
  // As the CPU: bias corrections in double, then the same float expressions.
  const float lr = st->lr;
  const double bc1 = 1.0 - pow(h.beta1, double(st->step));
  const double bc2 = 1.0 - pow(h.beta2, double(st->step));
  const float step_size = float(double(lr) / bc1);
  const float sqrt_bc2 = float(sqrt(bc2));
  const float shrink = s.decay ? float(1.0 - double(lr) * h.weight_decay) : 1.0f;
  const float scale = st->scale;
  const float b1 = float(h.beta1), one_b1 = float(1.0 - h.beta1);
  const float b2 = float(h.beta2), one_b2 = float(1.0 - h.beta2);
  const float d = float(h.ema_decay), keep = float(1.0 - h.ema_decay);
  for (size_t i = i0; i < s.n; i += stride) {
    const float g = s.grad[i] * scale;
    const float mi = b1 * s.m[i] + one_b1 * g;
    const float vi = b2 * s.v[i] + one_b2 * g * g;
    s.m[i] = mi;
    s.v[i] = vi;
    const float p = s.param[i] * shrink - step_size * mi / (sqrtf(vi) / sqrt_bc2 + h.eps);
    s.param[i] = p;
    if (s.shadow) s.shadow[i] = bfloat16{fp32_to_bf16_bits(p)};
    if (s.ema) s.ema[i] = d * s.ema[i] + keep * p;
    s.grad[i] = 0.f;
  }
}

__global__ void __launch_bounds__(kThreads)
    finish_gathered_kernel(const AdamWSegment* segs, AdamWHyper h, const AdamWDeviceState* st) {
  const AdamWSegment s = segs[blockIdx.y];
  const size_t stride = size_t(gridDim.x) * kThreads;
  const size_t i0 = size_t(blockIdx.x) * kThreads + threadIdx.x;
  const float d = float(h.ema_decay), keep = float(1.0 - h.ema_decay);
  const bool taken = st->finite != 0;
  for (size_t i = i0; i < s.n; i += stride) {
    if (taken) {
      const float p = s.param[i];
      if (s.shadow) s.shadow[i] = bfloat16{fp32_to_bf16_bits(p)};
      if (s.ema) s.ema[i] = d * s.ema[i] + keep * p;
    }
    s.grad[i] = 0.f;
  }
}

// The workspace: the sum of squares (a double), then the per-block partials.
constexpr size_t kSumBytes = 256;

}  // namespace

size_t Kernels::adamw_workspace_bytes(int count, size_t max_n) {
  return kSumBytes + size_t(count) * blocks_per_segment(max_n) * sizeof(float);
}

void Kernels::adamw_step(const AdamWSegment* segments, int count, size_t max_n,
                         const AdamWHyper& hyper, const float* lr_table, size_t lr_len,
                         AdamWDeviceState* state, void* workspace, cudaStream_t stream,
                         const std::function<void(double*)>& sum_over_ranks) {
  if (count <= 0) return;
  if (lr_len == 0) throw std::invalid_argument("adamw_step: empty learning-rate table");
  const unsigned bx = blocks_per_segment(max_n);
  double* sq = static_cast<double*>(workspace);
  float* part = reinterpret_cast<float*>(static_cast<char*>(workspace) + kSumBytes);
  const int decide_here = sum_over_ranks ? 0 : 1;
  SLIPSTREAM_LAUNCH(norm_kernel, dim3(bx, unsigned(count)), dim3(kThreads), stream, segments, part,
                    sq, hyper, lr_table, lr_len, state, decide_here);
  check_launch("adamw_step (gradient norm)");
  if (sum_over_ranks) {
    sum_over_ranks(sq);
    SLIPSTREAM_LAUNCH(decide_kernel, dim3(1), dim3(1), stream, sq, hyper, lr_table, lr_len, state);
    check_launch("adamw_step (decide)");
  }
  SLIPSTREAM_LAUNCH(update_kernel, dim3(bx, unsigned(count)), dim3(kThreads), stream, segments,
                    hyper, state);
  check_launch("adamw_step (update)");
}

void Kernels::adamw_finish_gathered(const AdamWSegment* segments, int count, size_t max_n,
                                    const AdamWHyper& hyper, const AdamWDeviceState* state,
                                    cudaStream_t stream) {
  if (count <= 0) return;
  SLIPSTREAM_LAUNCH(finish_gathered_kernel, dim3(blocks_per_segment(max_n), unsigned(count)),
                    dim3(kThreads), stream, segments, hyper, state);
  check_launch("adamw_finish_gathered");
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
