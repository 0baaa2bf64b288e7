// A Mamba stack's frame in one launch (kernels/mamba_frame.h): block r carries row r through the
// input projection, every layer and the final norm, its activations in shared memory, its
// carried state read and written in place of the layer-by-layer path's buffers. Compiled for
// CUDA and for the emulator alike, so its tests run without a GPU.
//
// The math is the layer-by-layer device forward's, op for op (the norm's rsqrt of the mean
// square plus eps, the convolution's bias-first sum, Δ's fmaf chain over dt_rank, the scan's
// exp2 decay as one fma, the gate, bf16 rounding of the linear layers' inputs): only the sums'
// orders differ (a linear layer's dot product is 32 lanes' strided sums and a butterfly, where
// cuBLASLt has its own tiles; the norm's sum is the block's, y's the channel's lanes'), so
// results agree to rounding, and every run gives the same bits.
#include <stdexcept>
#include <string>

#include "kernels/causal_conv1d.h"
#include "kernels/cuda_common.cuh"
#include "kernels/mamba_frame.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

// A block's width: a frame of few games is latency-bound (a row's linear layers are dot products
// whose loads wait on L2, in passes of four rows a warp), so where the games are few enough for
// a block an SM (up to 128) a block takes 4 · d_inner threads, up to 1,024: in_proj's 2 · d_inner
// rows in four passes (more past d_inner 256); 256 for many games (eight blocks an SM: every game
// of a large batch in one wave) and for small models.
constexpr int kFrameMinThreads = 256, kFrameMaxThreads = 1024;
constexpr int kFrameWideRows = 128;  // games up to which a block may be wider than the minimum
constexpr int kFrameMaxWarps = kFrameMaxThreads / 32;
int frame_threads(int rows, int d_inner) {
  if (rows > kFrameWideRows) return kFrameMinThreads;
  const int t = (4 * d_inner + 31) / 32 * 32;
  return t < kFrameMinThreads ? kFrameMinThreads : t > kFrameMaxThreads ? kFrameMaxThreads : t;
}
// Threads a channel in the scan's step: the block's threads over its channels, a power of two up
// to 8 (a lane group of a warp).
__device__ __forceinline__ int scan_lanes(int threads, int channels) {
  int g = 1;
  while (g < 8 && 2 * g * channels <= threads) g *= 2;
  return g;
}
constexpr int kDotRows = 4;  // outputs a warp sums at once: four rows' loads in flight
constexpr int kMaxProj = Kernels::kScanMaxDtRank + 2 * Kernels::kScanMaxState;
constexpr float kLog2e = 1.4426950408889634f;

static_assert(sizeof(Kernels::MambaFrame) == 10 * sizeof(int) + 14 * sizeof(size_t),
              "MambaFrame without padding (a launch's key hashes its bytes)");

struct FrameArgs {
  Kernels::MambaFrame m;
  const float* x;
  const float* w;
  const void* wb;  // the bf16 shadow (the kernel's WT), or null
  const float* conv_in;
  float* conv_out;
  const float* scan_in;
  float* scan_out;
  float* y;
  __nv_bfloat16* y_bf;
};

// A value as the linear layers take it: rounded to bf16 where they read the bf16 shadow.
template <class WT>
__device__ __forceinline__ float operand(float v) {
  if constexpr (std::is_same_v<WT, float>)
    return v;
  else
    return to_f32(from_f32<__nv_bfloat16>(v));
}

// Sum of v over the block, the same order every run: each warp's butterfly, then the warps' sums
// in order. `red` holds a float a warp; every thread gets the sum.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = group_sum<32>(v);
  if ((int(threadIdx.x) & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int k = 0; k < int(blockDim.x >> 5); ++k) s += red[k];
  __syncthreads();  // red is free again
  return s;
}

// out(o, W[o] · v) for o < n, W (n, K) rows K apart from `W`, v (K) in shared memory: warp w takes
// rows w·kDotRows, ... (kDotRows at a time), its lanes striding over K (coalesced reads of the
// rows), a butterfly summing the lanes; lane 0 calls out. No barrier: the caller syncs after.
template <class WT, class Out>
__device__ __forceinline__ void rows_dot(const WT* W, int n, int K, const float* v, Out out) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int stride = int(blockDim.x >> 5) * kDotRows;
  for (int o0 = warp * kDotRows; o0 < n; o0 += stride) {  // warp-uniform
    float acc[kDotRows];
#pragma unroll
    for (int i = 0; i < kDotRows; ++i) acc[i] = 0.f;
#pragma unroll 4  // with kDotRows, 16 loads in flight a lane: a frame of one game is latency-bound
    for (int k = lane; k < K; k += 32) {
      const float vk = v[k];
#pragma unroll
      for (int i = 0; i < kDotRows; ++i)
        if (o0 + i < n)
          acc[i] = fmaf(to_f32(W[size_t(o0 + i) * size_t(K) + size_t(k)]), vk, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < kDotRows; ++i) acc[i] = group_sum<32>(acc[i]);
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < kDotRows; ++i)
        if (o0 + i < n) out(o0 + i, acc[i]);
  }
}

// The RMSNorm of s (D) times w into out, each value passed through `put(j, value)`.
template <class Put>
__device__ __forceinline__ void norm_row(const float* s, const float* w, int D, float eps,
                                         float* red, Put put) {
  float ss = 0.f;
  for (int j = int(threadIdx.x); j < D; j += int(blockDim.x)) ss += s[j] * s[j];
  const float r = rsqrtf(block_sum(ss, red) / float(D) + eps);
  for (int j = int(threadIdx.x); j < D; j += int(blockDim.x)) put(j, s[j] * r * w[j]);
}

template <class WT>
__global__ void __launch_bounds__(kFrameMaxThreads) mamba_frame_kernel(FrameArgs a) {
  const Kernels::MambaFrame& m = a.m;
  const int row = int(blockIdx.x), tid = int(threadIdx.x), nt = int(blockDim.x);
  const int dm = m.d_model, di = m.d_inner, N = m.d_state, R = m.dt_rank, K = m.d_conv;
  const int P = R + 2 * N;
  const float* w = a.w;
  const WT* wl = a.wb ? static_cast<const WT*>(a.wb) : reinterpret_cast<const WT*>(a.w);
  __shared__ float s[Kernels::kFrameMaxModel];       // the residual stream h
  __shared__ float xn[Kernels::kFrameMaxModel];      // the norm's output, as in_proj takes it
  __shared__ float xz[2 * Kernels::kFrameMaxInner];  // x, then u as x_proj takes it | z
  __shared__ float u[Kernels::kFrameMaxInner];       // the convolution's output (fp32)
  __shared__ float ys[Kernels::kFrameMaxInner];      // the gated scan, as out_proj takes it
  __shared__ float dbc[kMaxProj];                    // x_proj's dt | B | C
  __shared__ float red[kFrameMaxWarps];

  // h_0: x W_inᵀ + b (x staged in xz, rounded as the GEMM takes it), or x itself.
  const float* xr = a.x + size_t(row) * size_t(m.din);
  if (m.input_proj) {
    for (int k = tid; k < m.din; k += nt) xz[k] = operand<WT>(xr[k]);
    __syncthreads();
    const float* b = w + m.input_proj_b;
    rows_dot(wl + m.input_proj_w, dm, m.din, xz, [&](int o, float v) { s[o] = v + b[o]; });
  } else {
    for (int j = tid; j < dm; j += nt) s[j] = xr[j];
  }
  __syncthreads();

  for (int l = 0; l < m.layers; ++l) {
    const size_t at = size_t(l) * m.layer_stride;
    norm_row(s, w + m.norm + at, dm, m.eps, red, [&](int j, float v) { xn[j] = operand<WT>(v); });
    __syncthreads();
    rows_dot(wl + m.in_proj + at, 2 * di, dm, xn, [&](int o, float v) { xz[o] = v; });
    __syncthreads();

    // The convolution's step, a thread a channel: the carried inputs, then this frame's.
    const float* cw = w + m.conv_w + at;
    const float* cb = w + m.conv_b + at;
    const size_t conv_row = size_t(l) * m.rows + row;
    for (int c = tid; c < di; c += nt) {
      const float* in = a.conv_in ? a.conv_in + conv_row * (K - 1) * di + c : nullptr;
      float acc = cb[c];
#pragma unroll 4  // no store between: the carried inputs' loads in flight together
      for (int k = 0; k < K - 1; ++k)
        acc += cw[size_t(c) * K + k] * (in ? in[size_t(k) * di] : 0.f);
      const float xc = xz[c];
      acc += cw[size_t(c) * K + K - 1] * xc;
      if (a.conv_out && K > 1) {  // one older (slot k - 1 written after slot k is read: in place)
        float* out = a.conv_out + conv_row * (K - 1) * di + c;
        for (int k = 1; k < K - 1; ++k) out[size_t(k - 1) * di] = in ? in[size_t(k) * di] : 0.f;
        out[size_t(K - 2) * di] = xc;
      }
      const float uc = siluf_(acc);
      u[c] = uc;
      xz[c] = operand<WT>(uc);  // x is read: its place holds x_proj's operand
    }
    __syncthreads();
    rows_dot(wl + m.x_proj + at, P, di, xz, [&](int o, float v) { dbc[o] = v; });
    __syncthreads();

    // The scan's step, G threads a channel (as many as the block has for its channels, up to 8):
    // Δ from dt and dt_proj's weight (each of the G alike), states g, g + G, ... from the carried
    // ones (a thread's loads all in flight at once: a frame of few games waits on them), y's
    // partial sums added over the G lanes, then D and the gate.
    const float* dtw = w + m.dt_w + at;
    const float* dtb = w + m.dt_b + at;
    const float* Alog = w + m.A_log + at;
    const float* Dd = w + m.D + at;
    const size_t scan_row = size_t(l) * m.rows + row;
    const int G = scan_lanes(nt, di), g = tid % G;
    for (int c0 = 0; c0 < di; c0 += nt / G) {  // uniform bounds: every lane reaches the sum
      const int c = c0 + tid / G;
      const bool ok = c < di;
      float y = 0.f, uc = 0.f;
      if (ok) {
        float delta = 0.f;
        for (int r = 0; r < R; ++r) delta = fmaf(dbc[r], dtw[size_t(c) * R + r], delta);
        const float dt = softplusf_(delta + dtb[c]);
        uc = u[c];
        const float dtu = dt * uc;
        const size_t h0 = (scan_row * di + c) * N;
#pragma unroll 4
        for (int n = g; n < N; n += G) {
          const float hp = a.scan_in ? a.scan_in[h0 + n] : 0.f;
          const float A2 = neg_expf_(Alog[size_t(c) * N + n]) * kLog2e;
          const float h = fmaf(exp2_ftz(dt * A2), hp, dtu * dbc[R + n]);
          if (a.scan_out) a.scan_out[h0 + n] = h;
          y += dbc[R + N + n] * h;
        }
      }
      for (int off = G / 2; off > 0; off /= 2) y += __shfl_xor_sync(0xffffffffu, y, off);
      if (ok && g == 0) ys[c] = operand<WT>((y + Dd[c] * uc) * siluf_(xz[di + c]));
    }
    __syncthreads();
    rows_dot(wl + m.out_proj + at, dm, di, ys, [&](int o, float v) { s[o] += v; });
    __syncthreads();
  }

  float* yr = a.y + size_t(row) * dm;
  __nv_bfloat16* ybr = a.y_bf ? a.y_bf + size_t(row) * dm : nullptr;
  norm_row(s, w + m.norm_f, dm, m.eps, red, [&](int j, float v) {
    yr[j] = v;
    if (ybr) ybr[j] = from_f32<__nv_bfloat16>(v);
  });
}

// SLIPSTREAM_MAMBA_FRAME's form: `fused` (this file's kernel), or the layers (unset, empty or
// `layers`).
bool& frame_fused_slot() {
  static bool on =
      second_form_from_environment("SLIPSTREAM_MAMBA_FRAME", "layers", "fused", "a Mamba frame");
  return on;
}

}  // namespace

bool Kernels::mamba_frame_fits(const MambaFrame& m) {
  return m.rows >= 1 && m.layers >= 1 && m.d_model >= 1 && m.d_model <= kFrameMaxModel &&
         m.d_inner >= 1 && m.d_inner <= kFrameMaxInner && m.d_state >= 1 &&
         m.d_state <= kScanMaxState && m.dt_rank >= 1 && m.dt_rank <= kScanMaxDtRank &&
         m.d_conv >= 1 && m.d_conv <= kConvMaxWidth && m.din >= 1 &&
         (m.input_proj ? m.din <= kFrameMaxInput : m.din == m.d_model);
}

void Kernels::mamba_frame_forward(const MambaFrame& m, const float* x, const float* w,
                                  const bfloat16* wb, const float* conv_in, float* conv_out,
                                  const float* scan_in, float* scan_out, float* y, bfloat16* y_bf,
                                  cudaStream_t stream) {
  const char* name = "mamba_frame_forward";
  if (!mamba_frame_fits(m))
    throw std::invalid_argument(
        std::string(name) + ": needs d_model <= " + std::to_string(kFrameMaxModel) +
        ", d_inner <= " + std::to_string(kFrameMaxInner) + ", din <= " +
        std::to_string(kFrameMaxInput) + ", d_state <= " + std::to_string(kScanMaxState) +
        ", dt_rank <= " + std::to_string(kScanMaxDtRank) +
        ", d_conv <= " + std::to_string(kConvMaxWidth) +
        " (got d_model=" + std::to_string(m.d_model) + " d_inner=" + std::to_string(m.d_inner) +
        " din=" + std::to_string(m.din) + " d_state=" + std::to_string(m.d_state) +
        " dt_rank=" + std::to_string(m.dt_rank) + " d_conv=" + std::to_string(m.d_conv) + ")");
  auto a = zero_filled<FrameArgs>();  // padding too: a launch's key hashes it
  a.m = m;                            // MambaFrame has none
  a.x = x;
  a.w = w;
  a.wb = wb;
  a.conv_in = conv_in;
  a.conv_out = conv_out;
  a.scan_in = scan_in;
  a.scan_out = scan_out;
  a.y = y;
  a.y_bf = dev(y_bf);
  const auto kernel = wb ? &mamba_frame_kernel<__nv_bfloat16> : &mamba_frame_kernel<float>;
  SLIPSTREAM_LAUNCH_AS("mamba_frame_kernel", kernel, dim3(unsigned(m.rows)),
                       dim3(unsigned(frame_threads(m.rows, m.d_inner))), stream, a);
}

void Kernels::set_mamba_frame_fused(bool on) {
  frame_fused_slot() = on;
}
bool Kernels::mamba_frame_fused() {
  return frame_fused_slot();
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
