// Depthwise causal conv1d on CUDA; math and layouts of the CPU reference
// (kernels/causal_conv1d_cpu.cpp), which with silu_forward/backward is what it is tested against.
// Every thread owns a channel of one or more (b, t) rows (forward) or one (b, c, time block)
// (backward); the channel is the fastest index, so a warp reads 32 consecutive channels.
#include "kernels/causal_conv1d.h"
#include "kernels/cuda_common.cuh"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

constexpr int kThreads = 256;
constexpr int kTimeBlock = 16;  // time steps per backward thread
constexpr int kMaxK = kConvMaxWidth;

// x at (b, t, c) for t in [-(K - 1), L): x's (rows xld apart), the prefix's before it, or zero
// without one.
template <class DT>
__device__ __forceinline__ float input_at(const DT* x, const DT* prefix, int b, int t, int c, int L,
                                          int C, int K, int xld) {
  if (t >= 0) return to_f32(x[(size_t(b) * L + t) * xld + c]);
  return prefix ? to_f32(prefix[(size_t(b) * (K - 1) + (K - 1 + t)) * C + c]) : 0.f;
}

// bias + sum_k w[k] x[t - K + 1 + k] at (b, t, c), left padding the prefix or zeros.
template <class DT>
__device__ __forceinline__ float conv_at(const DT* x, const DT* prefix, const float* w,
                                         const float* bias, int b, int t, int c, int L, int C,
                                         int K, int xld) {
  float acc = bias ? bias[c] : 0.f;
  for (int k = 0; k < K; ++k) {
    const int ts = t - K + 1 + k;
    if (ts >= 0 || prefix)
      acc += w[size_t(c) * K + k] * input_at(x, prefix, b, ts, c, L, C, K, xld);
  }
  return acc;
}

template <class DT>
__global__ void __launch_bounds__(kThreads)
    conv_forward_kernel(const DT* x, const DT* prefix, const float* w, const float* bias, DT* y,
                        __nv_bfloat16* y_bf, int B, int L, int C, int K, bool silu, int xld,
                        DT* last) {
  // A thread a channel (blockIdx.x's), rows (b, t) from blockIdx.y on: no 64-bit division per
  // element (with a flat index's i % C, i / C % L a launch took 76 µs at production on an H200,
  // 62 µs without them).
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  const int rows = B * L;
  for (int row = int(blockIdx.y); row < rows; row += int(gridDim.y)) {
    const int t = row % L, b = row / L;
    const size_t i = size_t(row) * C + c;
    const float v = conv_at(x, prefix, w, bias, b, t, c, L, C, K, xld);
    const DT yv = from_f32<DT>(silu ? siluf_(v) : v);
    y[i] = yv;
    if (y_bf) y_bf[i] = from_f32<__nv_bfloat16>(to_f32(yv));  // as fp32_to_bf16 of y rounds it
    // The last step's window holds the next window's prefix (its inputs but the oldest); a
    // value and back (to_f32, from_f32) is exact.
    if (last && t == L - 1)
      for (int j = 0; j < K - 1; ++j)
        last[(size_t(b) * (K - 1) + j) * C + c] =
            from_f32<DT>(input_at(x, prefix, b, L - (K - 1) + j, c, L, C, K, xld));
  }
}

// d loss / d pre-activation for the generic backward kernel (widths without a window kernel),
// stored once so it reads it K times from memory instead of recomputing the convolution K times.
template <class DT>
__global__ void __launch_bounds__(kThreads)
    conv_dpre_kernel(const DT* x, const DT* prefix, const float* w, const float* bias, const DT* dy,
                     float* dpre, int B, int L, int C, int K, int xld) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * L * C) return;
  const int c = int(i % C), t = int(i / C % L), b = int(i / (size_t(C) * L));
  dpre[i] = to_f32(dy[i]) * silu_gradf_(conv_at(x, prefix, w, bias, b, t, c, L, C, K, xld));
}

// Thread (b, time block, c): dx over the block, and its partial of dweight and dbias.
template <class DT>
__global__ void __launch_bounds__(kThreads)
    conv_backward_kernel(const DT* x, const DT* prefix, const float* w, const DT* dy,
                         const float* dpre, DT* dx, __nv_bfloat16* dx_bf, float* dw_part,
                         float* db_part, int L, int C, int K, int xld) {
  const int c = int(blockIdx.x) * kThreads + int(threadIdx.x);
  const int tb = int(blockIdx.y), b = int(blockIdx.z);
  if (c >= C) return;
  const size_t base = size_t(b) * L * C + c;
  const size_t xbase = size_t(b) * L * xld + c;  // dx's rows, like x's
  auto g = [&](int t) {
    return dpre ? dpre[base + size_t(t) * C] : to_f32(dy[base + size_t(t) * C]);
  };
  float dw[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) dw[k] = 0.f;
  float db = 0.f;
  const int t0 = tb * kTimeBlock, t1 = L < t0 + kTimeBlock ? L : t0 + kTimeBlock;
  for (int t = t0; t < t1; ++t) {
    float acc = 0.f;  // dx[t] = sum_k w[k] g[t + K - 1 - k]
    for (int k = 0; k < K; ++k) {
      const int tg = t + K - 1 - k;
      if (tg < L) acc += w[size_t(c) * K + k] * g(tg);
    }
    const DT dxv = from_f32<DT>(acc);
    if (dx) dx[xbase + size_t(t) * xld] = dxv;  // null where only the copy is read
    if (dx_bf) dx_bf[xbase + size_t(t) * xld] = from_f32<__nv_bfloat16>(to_f32(dxv));
    const float gt = g(t);
    db += gt;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {  // dw[k] += g[t] x[t - K + 1 + k]
      const int ts = t - K + 1 + k;
      if (k < K && (ts >= 0 || prefix)) dw[k] += gt * input_at(x, prefix, b, ts, c, L, C, K, xld);
    }
  }
  const size_t part = size_t(b) * gridDim.y + tb;
#pragma unroll
  for (int k = 0; k < kMaxK; ++k)
    if (k < K) dw_part[(part * C + c) * K + k] = dw[k];
  db_part[part * C + c] = db;
}

// The same for a width KC known at compile time (Mamba's 4): the K gradients dx[t] reads and the
// inputs dw reads slide through registers, one load of each a step instead of K. With `silu`
// the gradient of the pre-activation, dy · silu'(conv(x) + bias), is made here as the window
// slides (the pre-activation from the inputs already in registers, in conv_at's order), so no
// separate launch stores it and no pass reads it back. Sums in the generic kernel's order;
// terms past either end are zeros (x + 0 is x).
template <class DT, int KC>
__global__ void __launch_bounds__(kThreads)
    conv_backward_window_kernel(const DT* x, const DT* prefix, const float* w, const float* bias,
                                const DT* dy, int silu, DT* dx, __nv_bfloat16* dx_bf,
                                float* dw_part, float* db_part, int L, int C, int xld) {
  const int c = int(blockIdx.x) * kThreads + int(threadIdx.x);
  const int tb = int(blockIdx.y), b = int(blockIdx.z);
  if (c >= C) return;
  const size_t base = size_t(b) * L * C + c;
  const size_t xbase = size_t(b) * L * xld + c;  // dx's rows, like x's
  auto xs = [&](int t) { return t < L ? input_at(x, prefix, b, t, c, L, C, KC, xld) : 0.f; };
  const int t0 = tb * kTimeBlock, t1 = L < t0 + kTimeBlock ? L : t0 + kTimeBlock;
  constexpr int kSpan = 2 * KC - 1;
  // At step t: gw[j] = g[t + j]; xw[j] = x[t - KC + 1 + j], the inputs dw[k] reads (j < KC) and
  // those of the pre-activations of the gradients still to come (j >= KC).
  float wr[KC], dw[KC], gw[KC], xw[kSpan];
  const float bc = bias ? bias[c] : 0.f;
  // g at t0 + j + off, whose inputs are xw[off + j + k]: dy there (zero past the end), times
  // silu' of the pre-activation with silu.
  auto g_at = [&](int t, int first) {
    if (t >= L) return 0.f;
    const float d = to_f32(dy[base + size_t(t) * C]);
    if (!silu) return d;
    float pre = bc;
#pragma unroll
    for (int k = 0; k < KC; ++k) pre += wr[k] * xw[first + k];
    return d * silu_gradf_(pre);
  };
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    wr[k] = w[size_t(c) * KC + k];
    dw[k] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < kSpan; ++j) xw[j] = xs(t0 - KC + 1 + j);
#pragma unroll
  for (int j = 0; j < KC; ++j) gw[j] = g_at(t0 + j, j);
  float db = 0.f;
  for (int t = t0; t < t1; ++t) {
    float acc = 0.f;  // dx[t] = sum_k w[k] g[t + K - 1 - k]
#pragma unroll
    for (int k = 0; k < KC; ++k) acc += wr[k] * gw[KC - 1 - k];
    const DT dxv = from_f32<DT>(acc);
    if (dx) dx[xbase + size_t(t) * xld] = dxv;  // null where only the copy is read
    if (dx_bf) dx_bf[xbase + size_t(t) * xld] = from_f32<__nv_bfloat16>(to_f32(dxv));
    const float gt = gw[0];
    db += gt;
#pragma unroll
    for (int k = 0; k < KC; ++k) dw[k] += gt * xw[k];  // dw[k] += g[t] x[t - K + 1 + k]
#pragma unroll
    for (int k = 0; k + 1 < KC; ++k) gw[k] = gw[k + 1];
#pragma unroll
    for (int j = 0; j + 1 < kSpan; ++j) xw[j] = xw[j + 1];
    xw[kSpan - 1] = xs(t + KC);
    gw[KC - 1] = g_at(t + KC, KC - 1);  // its inputs x[t + 1 .. t + KC]
  }
  const size_t part = size_t(b) * gridDim.y + tb;
#pragma unroll
  for (int k = 0; k < KC; ++k) dw_part[(part * C + c) * KC + k] = dw[k];
  db_part[part * C + c] = db;
}

template <class DT>
__global__ void __launch_bounds__(kThreads)
    conv_step_kernel(DT* state, const DT* x, const float* w, const float* bias, DT* y, int B, int C,
                     int K, bool silu) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * C) return;
  const int c = int(i % C), b = int(i / C);
  DT* st = state + size_t(b) * (K - 1) * C + c;
  const float xc = to_f32(x[i]);
  float acc = (bias ? bias[c] : 0.f) + w[size_t(c) * K + K - 1] * xc;
  for (int k = 0; k < K - 1; ++k) acc += w[size_t(c) * K + k] * to_f32(st[size_t(k) * C]);
  for (int k = 0; k + 1 < K - 1; ++k) st[size_t(k) * C] = st[size_t(k + 1) * C];
  if (K > 1) st[size_t(K - 2) * C] = from_f32<DT>(xc);
  y[i] = from_f32<DT>(silu ? siluf_(acc) : acc);
}

void check_width(int K, const char* op) {
  if (K < 1 || K > kMaxK)
    throw std::invalid_argument(std::string(op) + ": kernel width " + std::to_string(K) +
                                " is outside [1, " + std::to_string(kMaxK) + "]");
}

int time_blocks(int L) {
  return (L + kTimeBlock - 1) / kTimeBlock;
}

bool has_window_kernel(int K) {
  return K >= 2 && K <= 4;
}

struct ConvWorkspace {
  size_t dpre, dw, db, total;  // offsets in floats
  ConvWorkspace(int B, int L, int C, int K, bool silu) {
    const size_t parts = size_t(B) * time_blocks(L);
    dpre = 0;  // the generic kernel's pre-activation gradients (a window kernel makes its own)
    dw = silu && !has_window_kernel(K) ? size_t(B) * L * C : 0;
    db = dw + parts * C * K;
    total = db + parts * C;
  }
};

}  // namespace

template <class T>
void Kernels::causal_conv1d_forward(const T* x, const T* prefix, const float* weight,
                                    const float* bias, T* y, bfloat16* y_bf, int B, int L, int C,
                                    int K, bool silu, cudaStream_t stream, int x_ld, T* last) {
  check_width(K, "causal_conv1d_forward");
  const size_t n = size_t(B) * L * C;
  if (n == 0) return;
  const int xld = x_ld > 0 ? x_ld : C;
  const auto kernel = &conv_forward_kernel<dev_t<T>>;
  // Whole warps over the channels, at most kThreads a block; a block row each (b, t), up to
  // the grid's y limit.
  const unsigned threads = unsigned(C < kThreads ? ceil_div(size_t(C), 32) * 32 : kThreads);
  const size_t rows = size_t(B) * L;
  const dim3 grid(ceil_div(size_t(C), threads), unsigned(rows < 65535 ? rows : 65535));
  SLIPSTREAM_LAUNCH_AS("conv_forward_kernel", kernel, grid, dim3(threads), stream, dev(x),
                       dev(prefix), weight, bias, dev(y), dev(y_bf), B, L, C, K, silu, xld,
                       dev(last));
  check_launch("causal_conv1d_forward");
}

size_t Kernels::causal_conv1d_backward_workspace_bytes(int B, int L, int C, int K, bool silu) {
  return ConvWorkspace(B, L, C, K, silu).total * sizeof(float);
}

template <class T>
void Kernels::causal_conv1d_backward(const T* x, const T* prefix, const float* weight,
                                     const float* bias, const T* dy, T* dx, bfloat16* dx_bf,
                                     float* dweight, float* dbias, void* workspace, int B, int L,
                                     int C, int K, bool silu, cudaStream_t stream, int x_ld) {
  const char* op = "causal_conv1d_backward";
  check_width(K, op);
  if (!dx && !dx_bf) throw std::invalid_argument(std::string(op) + ": no dx (dx and dx_bf null)");
  const size_t n = size_t(B) * L * C;
  if (n == 0) return;
  const int xld = x_ld > 0 ? x_ld : C;
  const ConvWorkspace lay(B, L, C, K, silu);
  float* ws = static_cast<float*>(workspace);
  const int tbs = time_blocks(L);
  const dim3 grid(ceil_div(size_t(C), kThreads), unsigned(tbs), unsigned(B));
  auto window = [&](auto kernel) {  // the pre-activation's gradient made inside
    SLIPSTREAM_LAUNCH_AS("conv_backward_window_kernel", kernel, grid, dim3(kThreads), stream,
                         dev(x), dev(prefix), weight, bias, dev(dy), silu ? 1 : 0, dev(dx),
                         dev(dx_bf), ws + lay.dw, ws + lay.db, L, C, xld);
  };
  switch (K) {  // the widths with a sliding-window kernel; the others take the generic one
    case 2:
      window(&conv_backward_window_kernel<dev_t<T>, 2>);
      break;
    case 3:
      window(&conv_backward_window_kernel<dev_t<T>, 3>);
      break;
    case 4:
      window(&conv_backward_window_kernel<dev_t<T>, 4>);
      break;
    default: {
      float* dpre = silu ? ws + lay.dpre : nullptr;
      if (silu) {
        const auto kernel = &conv_dpre_kernel<dev_t<T>>;
        SLIPSTREAM_LAUNCH_AS("conv_dpre_kernel", kernel, dim3(ceil_div(n, kThreads)),
                             dim3(kThreads), stream, dev(x), dev(prefix), weight, bias, dev(dy),
                             dpre, B, L, C, K, xld);
        check_launch(op);
      }
      const auto kernel = &conv_backward_kernel<dev_t<T>>;
      SLIPSTREAM_LAUNCH_AS("conv_backward_kernel", kernel, grid, dim3(kThreads), stream, dev(x),
                           dev(prefix), weight, dev(dy), dpre, dev(dx), dev(dx_bf), ws + lay.dw,
                           ws + lay.db, L, C, K, xld);
    }
  }
  check_launch(op);
  const int parts = B * tbs;
  sum_partials_group<float>(
      {{ws + lay.dw, size_t(C) * K, dweight}, {ws + lay.db, size_t(C), dbias}}, parts, true, stream,
      op);
}

template <class T>
void Kernels::causal_conv1d_step(T* conv_state, const T* x, const float* weight, const float* bias,
                                 T* y, int B, int C, int K, bool silu, cudaStream_t stream) {
  check_width(K, "causal_conv1d_step");
  const size_t n = size_t(B) * C;
  if (n == 0) return;
  const auto kernel = &conv_step_kernel<dev_t<T>>;
  SLIPSTREAM_LAUNCH_AS("conv_step_kernel", kernel, dim3(ceil_div(n, kThreads)), dim3(kThreads),
                       stream, dev(conv_state), dev(x), weight, bias, dev(y), B, C, K, silu);
  check_launch("causal_conv1d_step");
}

#define INSTANTIATE(T)                                                                             \
  template void Kernels::causal_conv1d_forward<T>(const T*, const T*, const float*, const float*,  \
                                                  T*, bfloat16*, int, int, int, int, bool,         \
                                                  cudaStream_t, int, T*);                          \
  template void Kernels::causal_conv1d_backward<T>(const T*, const T*, const float*, const float*, \
                                                   const T*, T*, bfloat16*, float*, float*, void*, \
                                                   int, int, int, int, bool, cudaStream_t, int);   \
  template void Kernels::causal_conv1d_step<T>(T*, const T*, const float*, const float*, T*, int,  \
                                               int, int, bool, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bfloat16)
#undef INSTANTIATE

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
