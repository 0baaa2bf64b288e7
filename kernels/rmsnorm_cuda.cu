// RMSNorm with the fused residual add on CUDA; math of the CPU reference
// (kernels/rmsnorm_cpu.cpp), against which it is tested. Forward and dx: one warp per row, the
// row's sum of squares (or of dy * w * s) a warp reduction. The backward is one launch: each
// block's rows give a dweight partial, the last block sums the partials in a fixed order
// (deterministic: no float atomics).
#include "kernels/cuda_common.cuh"
#include "kernels/rmsnorm.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr size_t kRowBlock = 64;  // rows a backward block: one dweight partial

template <class DT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rms_forward_kernel(const DT* x, const DT* residual, const float* bias, const float* w, DT* y,
                       __nv_bfloat16* y_bf, DT* sum, float* rstd, size_t M, size_t D, float eps) {
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = int(threadIdx.x) & 31;
  if (row >= M) return;  // whole warps leave together: no shuffle loses a lane
  const size_t o = row * D;
  float ss = 0.f;
  // The normed row: x + residual, plus a bias row where given (as if added to x first).
  auto value = [&](size_t j) {
    const float v = to_f32(x[o + j]) + (residual ? to_f32(residual[o + j]) : 0.f);
    return bias ? v + bias[j] : v;
  };
  for (size_t j = lane; j < D; j += 32) {
    const float v = value(j);
    ss += v * v;
  }
  ss = group_sum<32>(ss);
  const float r = rsqrtf(ss / float(D) + eps);
  if (lane == 0) rstd[row] = r;
  for (size_t j = lane; j < D; j += 32) {
    const float v = value(j);
    if (sum) sum[o + j] = from_f32<DT>(v);
    const DT yv = from_f32<DT>(v * r * w[j]);
    if (y) y[o + j] = yv;  // null where only the copy is read
    // The GEMMs' bf16 copy of y, as fp32_to_bf16 of it would round it: no second pass over y.
    if (y_bf) y_bf[o + j] = from_f32<__nv_bfloat16>(to_f32(yv));
  }
}

SLIPSTREAM_BLOCK_COUNTER(rms_backward_blocks);

// Rows [blockIdx.x * kRowBlock, +kRowBlock): first the block's dweight partial (thread j of
// column j over the rows in order; before any ds is written, as ds may alias dy), then ds a warp
// a row; the last block to finish adds the partials onto dweight.
template <class DT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rms_backward_kernel(const DT* s, const float* s_bias, const float* w, const float* rstd,
                        const DT* dy, const DT* dsum, DT* ds, __nv_bfloat16* ds_bf, float* part,
                        float* dweight, size_t M, size_t D) {
  __shared__ float lanes[kWarpsPerBlock * 32];
  // The norm's input: s, plus the bias row the forward added where given.
  auto sv = [&](size_t i, size_t j) { return s_bias ? to_f32(s[i]) + s_bias[j] : to_f32(s[i]); };
  const size_t r0 = size_t(blockIdx.x) * kRowBlock;
  const size_t r1 = M < r0 + kRowBlock ? M : r0 + kRowBlock;
  for (size_t j = threadIdx.x; j < D; j += kWarpsPerBlock * 32) {
    float acc = 0.f;
    for (size_t i = r0; i < r1; ++i) acc += to_f32(dy[i * D + j]) * sv(i * D + j, j) * rstd[i];
    part[size_t(blockIdx.x) * D + j] = acc;
  }
  __syncthreads();
  const int lane = int(threadIdx.x) & 31;
  for (size_t row = r0 + (threadIdx.x >> 5); row < r1; row += kWarpsPerBlock) {
    const size_t o = row * D;
    float dot = 0.f;
    for (size_t j = lane; j < D; j += 32) dot += to_f32(dy[o + j]) * w[j] * sv(o + j, j);
    dot = group_sum<32>(dot);
    const float r = rstd[row];
    const float c = dot * r * r * r / float(D);
    for (size_t j = lane; j < D; j += 32) {
      const float v =
          r * w[j] * to_f32(dy[o + j]) - sv(o + j, j) * c + (dsum ? to_f32(dsum[o + j]) : 0.f);
      const DT dv = from_f32<DT>(v);
      ds[o + j] = dv;
      if (ds_bf) ds_bf[o + j] = from_f32<__nv_bfloat16>(to_f32(dv));  // as fp32_to_bf16 of ds
    }
  }
  if (last_block(&rms_backward_blocks))
    sum_partials_in_block(part, int(gridDim.x), D, dweight, true, lanes);
}

SLIPSTREAM_BLOCK_COUNTER(rms_backward_rows_blocks);

// The backward where a row fits a warp's registers (D <= 32 kPer): a warp a row, the row's dy, s
// (and dsum) read once into kPer values a lane and used for both the dot product and ds; the
// lanes keep their columns' dweight sums over the warp's rows, and the block adds its warps' in
// order into its partial. The two-pass form below read dy and s twice and kept 256 threads on
// one row block's column loop: 157 µs a launch at production's 15,360 x 256 on an H200 (the
// step's norms 10 % of its device time), 73 µs in this form. ds's bits are the two-pass form's (the
// same sums in the same order); dweight's partials add each warp's rows first.
template <class DT, int kPer>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rms_backward_rows_kernel(const DT* s, const float* s_bias, const float* w, const float* rstd,
                             const DT* dy, const DT* dsum, DT* ds, __nv_bfloat16* ds_bf,
                             float* part, float* dweight, size_t M, size_t D) {
  __shared__ float warp_dw[kWarpsPerBlock][kPer * 32];
  __shared__ float lanes[kWarpsPerBlock * 32];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const size_t r0 = size_t(blockIdx.x) * kRowBlock;
  const size_t r1 = M < r0 + kRowBlock ? M : r0 + kRowBlock;
  float wv[kPer], bv[kPer], dw[kPer];
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    const size_t j = size_t(lane) + 32 * c;
    wv[c] = j < D ? w[j] : 0.f;
    bv[c] = s_bias && j < D ? s_bias[j] : 0.f;
    dw[c] = 0.f;
  }
  for (size_t row = r0 + size_t(warp); row < r1; row += kWarpsPerBlock) {
    const size_t o = row * D;
    float g[kPer], x[kPer], add[kPer];
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const size_t j = size_t(lane) + 32 * c;
      const bool in = j < D;
      g[c] = in ? to_f32(dy[o + j]) : 0.f;
      x[c] = in ? (s_bias ? to_f32(s[o + j]) + bv[c] : to_f32(s[o + j])) : 0.f;
      add[c] = in && dsum ? to_f32(dsum[o + j]) : 0.f;
    }
    const float r = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int c = 0; c < kPer; ++c)
      if (size_t(lane) + 32 * c < D) dot += g[c] * wv[c] * x[c];
    dot = group_sum<32>(dot);
    const float cc = dot * r * r * r / float(D);
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const size_t j = size_t(lane) + 32 * c;
      if (j >= D) continue;
      dw[c] += g[c] * x[c] * r;
      const DT dv = from_f32<DT>(r * wv[c] * g[c] - x[c] * cc + add[c]);  // add: 0 without dsum
      ds[o + j] = dv;
      if (ds_bf) ds_bf[o + j] = from_f32<__nv_bfloat16>(to_f32(dv));  // as fp32_to_bf16 of ds
    }
  }
#pragma unroll
  for (int c = 0; c < kPer; ++c) warp_dw[warp][lane + 32 * c] = dw[c];
  __syncthreads();
  for (size_t j = threadIdx.x; j < D; j += kWarpsPerBlock * 32) {
    float acc = 0.f;
    for (int k = 0; k < kWarpsPerBlock; ++k) acc += warp_dw[k][j];
    part[size_t(blockIdx.x) * D + j] = acc;
  }
  if (last_block(&rms_backward_rows_blocks))
    sum_partials_in_block(part, int(gridDim.x), D, dweight, true, lanes);
}

// The widest row the register form takes: D <= 32 kRowsMaxPer.
constexpr size_t kRowsMaxPer = 16;

size_t row_blocks(size_t M) {
  return (M + kRowBlock - 1) / kRowBlock;
}

}  // namespace

template <class T>
void Kernels::rmsnorm_add_forward(const T* x, const T* residual, const float* weight, T* y,
                                  bfloat16* y_bf, T* sum, float* rstd, size_t M, size_t D,
                                  float eps, cudaStream_t stream, const float* bias) {
  if (!y && !y_bf) throw std::invalid_argument("rmsnorm_add_forward: no output (y and y_bf null)");
  if (M == 0 || D == 0) return;
  const auto kernel = &rms_forward_kernel<dev_t<T>>;
  SLIPSTREAM_LAUNCH_AS("rms_forward_kernel", kernel, dim3(ceil_div(M, kWarpsPerBlock)),
                       dim3(kWarpsPerBlock * 32), stream, dev(x), dev(residual), bias, weight,
                       dev(y), dev(y_bf), dev(sum), rstd, M, D, eps);
  check_launch("rmsnorm_add_forward");
}

size_t Kernels::rmsnorm_add_backward_workspace_bytes(size_t M, size_t D) {
  return row_blocks(M) * D * sizeof(float);
}

template <class T>
void Kernels::rmsnorm_add_backward(const T* s, const float* weight, const float* rstd, const T* dy,
                                   const T* dsum, T* ds, bfloat16* ds_bf, float* dweight,
                                   void* workspace, size_t M, size_t D, cudaStream_t stream,
                                   const float* s_bias) {
  const char* op = "rmsnorm_add_backward";
  if (M == 0 || D == 0) return;
  float* part = static_cast<float*>(workspace);
  const dim3 grid(unsigned(row_blocks(M))), block(kWarpsPerBlock * 32);
  auto rows = [&](auto per) {
    const auto kernel = &rms_backward_rows_kernel<dev_t<T>, decltype(per)::value>;
    SLIPSTREAM_LAUNCH_AS("rms_backward_rows_kernel", kernel, grid, block, stream, dev(s), s_bias,
                         weight, rstd, dev(dy), dev(dsum), dev(ds), dev(ds_bf), part, dweight, M,
                         D);
  };
  if (D <= 32 * 4) {
    rows(std::integral_constant<int, 4>{});
  } else if (D <= 32 * 8) {
    rows(std::integral_constant<int, 8>{});
  } else if (D <= 32 * kRowsMaxPer) {
    rows(std::integral_constant<int, int(kRowsMaxPer)>{});
  } else {
    const auto kernel = &rms_backward_kernel<dev_t<T>>;
    SLIPSTREAM_LAUNCH_AS("rms_backward_kernel", kernel, grid, block, stream, dev(s), s_bias, weight,
                         rstd, dev(dy), dev(dsum), dev(ds), dev(ds_bf), part, dweight, M, D);
  }
  check_launch(op);
}

#define INSTANTIATE(T)                                                                           \
  template void Kernels::rmsnorm_add_forward<T>(const T*, const T*, const float*, T*, bfloat16*, \
                                                T*, float*, size_t, size_t, float, cudaStream_t, \
                                                const float*);                                   \
  template void Kernels::rmsnorm_add_backward<T>(const T*, const float*, const float*, const T*, \
                                                 const T*, T*, bfloat16*, float*, void*, size_t, \
                                                 size_t, cudaStream_t, const float*);
INSTANTIATE(float)
INSTANTIATE(bfloat16)
#undef INSTANTIATE

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
