// Selective scan on CUDA; the math, layouts and gradient conventions are those of the CPU
// reference (kernels/selective_scan_cpu.cpp), against which it is tested.
//
// Thread (b, d, n): the lanes of a warp are kLanes states (kLanes = N rounded up to a power of
// two) of 32 / kLanes consecutive channels, so per-(b, t, d) loads are broadcasts within a lane
// group and consecutive groups read consecutive channels. A block is kScanWarps warps of one
// batch row; the grid is (channel tiles, B). Sums over the state (y, d delta, d u) are
// butterfly shuffles inside the group, which give every lane the same bits.
#include <type_traits>

#include "kernels/cuda_common.cuh"
#include "kernels/selective_scan.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

constexpr int kScanWarps = 8;
constexpr int kChunk = cuda::kScanChunk;

template <class DT>
struct ScanArgs {
  const DT *u, *delta;
  const float* A;
  const DT *Bm, *Cm;
  const float *Dskip, *delta_bias;
  const DT* z;
  bool softplus;
  int B, L, D, N;
};

// Where thread (b, d, n) is, and its channel's constants (zeros outside the problem).
template <int kLanes>
struct ScanLane {
  static constexpr int kDPerWarp = 32 / kLanes;
  static constexpr int kDPerBlock = kScanWarps * kDPerWarp;
  int lane, warp, n, d;
  bool dok, ok;
  float A, Dd, bias;
  template <class DT>
  __device__ explicit ScanLane(const ScanArgs<DT>& a) {
    lane = int(threadIdx.x) & 31;
    warp = int(threadIdx.x) >> 5;
    n = lane % kLanes;
    d = int(blockIdx.x) * kDPerBlock + warp * kDPerWarp + lane / kLanes;
    dok = d < a.D;
    ok = dok && n < a.N;
    A = ok ? a.A[size_t(d) * a.N + n] : 0.f;
    Dd = (dok && a.Dskip) ? a.Dskip[d] : 0.f;
    bias = (dok && a.delta_bias) ? a.delta_bias[d] : 0.f;
  }
};

// The inputs of step t for thread q: u and the raw and final dt are per channel, Bn and Cn per
// state. Threads outside the problem read nothing and get zeros, which keep their state at 0.
struct StepIn {
  float u, raw, dt, Bn, Cn;
};
template <class DT, int kLanes>
__device__ __forceinline__ StepIn load_step(const ScanArgs<DT>& a, const ScanLane<kLanes>& q,
                                            size_t row, float bias) {
  StepIn s{0.f, 0.f, 0.f, 0.f, 0.f};
  if (q.dok) {
    const size_t i = row * a.D + q.d;
    s.u = to_f32(a.u[i]);
    s.raw = to_f32(a.delta[i]) + bias;
    s.dt = a.softplus ? softplusf_(s.raw) : s.raw;
  }
  if (q.ok) {
    s.Bn = to_f32(a.Bm[row * a.N + q.n]);
    s.Cn = to_f32(a.Cm[row * a.N + q.n]);
  }
  return s;
}

template <class DT, int kLanes>
__global__ void __launch_bounds__(kScanWarps * 32)
    scan_forward_kernel(ScanArgs<DT> a, DT* out, float* last_state) {
  const ScanLane<kLanes> q(a);
  const int b = int(blockIdx.y);
  const float A = q.A, Dd = q.Dd, bias = q.bias;
  float h = 0.f;
  for (int t = 0; t < a.L; ++t) {
    const size_t row = size_t(b) * a.L + t;
    const StepIn s = load_step(a, q, row, bias);
    h = expf(s.dt * A) * h + s.dt * s.Bn * s.u;
    const float y = group_sum<kLanes>(s.Cn * h) + Dd * s.u;
    if (q.n == 0 && q.dok) {
      const size_t i = row * a.D + q.d;
      out[i] = from_f32<DT>(a.z ? y * siluf_(to_f32(a.z[i])) : y);
    }
  }
  if (last_state && q.ok) last_state[(size_t(b) * a.D + q.d) * a.N + q.n] = h;
}

struct ScanGrads {
  float* chunk_states;  // (B, nchunk, D, N): h before each chunk's first step
  float* dA_part;       // (B, D, N)
  float* dD_part;       // (B, D)
  float* dbias_part;    // (B, D)
  float* dB_part;       // (tiles, B, L, N)
  float* dC_part;       // (tiles, B, L, N)
};

template <class DT, int kLanes>
__global__ void __launch_bounds__(kScanWarps * 32)
    scan_backward_kernel(ScanArgs<DT> a, const DT* dout, DT* du, DT* ddelta, DT* dz, ScanGrads w) {
  const ScanLane<kLanes> q(a);
  const int b = int(blockIdx.y), tile = int(blockIdx.x);
  const int L = a.L, D = a.D, N = a.N;
  const int nchunk = (L + kChunk - 1) / kChunk;
  const float A = q.A, Dd = q.Dd, bias = q.bias;
  auto state_at = [&](int c) { return ((size_t(b) * nchunk + c) * D + q.d) * N + q.n; };

  // Pass 1: forward, keeping h at the start of every chunk.
  float h = 0.f;
  for (int t = 0; t < L; ++t) {
    if (t % kChunk == 0 && t > 0 && q.ok) w.chunk_states[state_at(t / kChunk)] = h;
    const StepIn s = load_step(a, q, size_t(b) * L + t, bias);
    h = expf(s.dt * A) * h + s.dt * s.Bn * s.u;
  }

  // Pass 2: chunks last to first; g is d loss / d h_t flowing back from step t + 1.
  __shared__ float sdB[kScanWarps][kChunk][32];
  __shared__ float sdC[kScanWarps][kChunk][32];
  float g = 0.f, dA_acc = 0.f, dD_acc = 0.f, dbias_acc = 0.f;
  for (int c = nchunk - 1; c >= 0; --c) {
    const int t0 = c * kChunk, tn = L - t0 < kChunk ? L - t0 : kChunk;
    const float h0 = (c > 0 && q.ok) ? w.chunk_states[state_at(c)] : 0.f;
    float hs[kChunk], eas[kChunk];
    float hh = h0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (j < tn) {
        const StepIn s = load_step(a, q, size_t(b) * L + t0 + j, bias);
        eas[j] = expf(s.dt * A);
        hh = eas[j] * hh + s.dt * s.Bn * s.u;
        hs[j] = hh;
      }
    }
#pragma unroll
    for (int j = kChunk - 1; j >= 0; --j) {
      float cB = 0.f, cC = 0.f;
      if (j < tn) {  // tn is the same for the whole block: the shuffles below stay uniform
        const size_t row = size_t(b) * L + t0 + j;
        const size_t i = row * D + q.d;
        const StepIn s = load_step(a, q, row, bias);
        const float go = q.dok ? to_f32(dout[i]) : 0.f;
        const float hprev = j > 0 ? hs[j - 1] : h0;
        const float ypre = group_sum<kLanes>(s.Cn * hs[j]) + Dd * s.u;
        float dy = go, dzv = 0.f;
        if (a.z) {
          const float zz = q.dok ? to_f32(a.z[i]) : 0.f;
          dy = go * siluf_(zz);
          dzv = go * ypre * silu_gradf_(zz);
        }
        dD_acc += dy * s.u;
        const float gn = g + dy * s.Cn;
        cC = dy * hs[j];
        cB = gn * s.dt * s.u;
        const float da = gn * hprev * eas[j];  // d loss / d (dt A)
        dA_acc += da * s.dt;
        const float ddt = group_sum<kLanes>(da * A + gn * s.Bn * s.u);
        const float dus = group_sum<kLanes>(gn * s.Bn);
        const float dd = a.softplus ? ddt * softplus_gradf_(s.raw) : ddt;
        dbias_acc += dd;
        if (q.n == 0 && q.dok) {
          du[i] = from_f32<DT>(dus * s.dt + dy * Dd);
          ddelta[i] = from_f32<DT>(dd);
          if (dz) dz[i] = from_f32<DT>(dzv);
        }
        g = eas[j] * gn;
      }
      // Sum over this warp's channels: lanes with the same state index.
#pragma unroll
      for (int off = kLanes; off < 32; off *= 2) {
        cB += __shfl_xor_sync(0xffffffffu, cB, off);
        cC += __shfl_xor_sync(0xffffffffu, cC, off);
      }
      if (q.lane < kLanes) {
        sdB[q.warp][j][q.lane] = cB;
        sdC[q.warp][j][q.lane] = cC;
      }
    }
    __syncthreads();
    // Sum over the block's warps in a fixed order: this tile's partial of dBm, dCm.
    for (int k = int(threadIdx.x); k < tn * N; k += int(blockDim.x)) {
      const int j = k / N, n = k % N;
      float sb = 0.f, sc = 0.f;
      for (int wi = 0; wi < kScanWarps; ++wi) {
        sb += sdB[wi][j][n];
        sc += sdC[wi][j][n];
      }
      const size_t o = ((size_t(tile) * a.B + b) * L + t0 + j) * N + n;
      w.dB_part[o] = sb;
      w.dC_part[o] = sc;
    }
    __syncthreads();
  }
  if (q.ok) w.dA_part[(size_t(b) * D + q.d) * N + q.n] = dA_acc;
  if (q.n == 0 && q.dok) {
    w.dD_part[size_t(b) * D + q.d] = dD_acc;
    w.dbias_part[size_t(b) * D + q.d] = dbias_acc;
  }
}

template <class DT, int kLanes>
__global__ void __launch_bounds__(kScanWarps * 32)
    scan_step_kernel(ScanArgs<DT> a, float* state, DT* out) {
  const ScanLane<kLanes> q(a);
  const int b = int(blockIdx.y);
  const float A = q.A, Dd = q.Dd, bias = q.bias;
  const StepIn s = load_step(a, q, size_t(b), bias);  // L = 1: row b
  const size_t si = (size_t(b) * a.D + q.d) * a.N + q.n;
  float h = q.ok ? state[si] : 0.f;
  h = expf(s.dt * A) * h + s.dt * s.Bn * s.u;
  if (q.ok) state[si] = h;
  const float y = group_sum<kLanes>(s.Cn * h) + Dd * s.u;
  if (q.n == 0 && q.dok) {
    const size_t i = size_t(b) * a.D + q.d;
    out[i] = from_f32<DT>(a.z ? y * siluf_(to_f32(a.z[i])) : y);
  }
}

int lanes_for(int N, const char* op) {
  if (N < 1 || N > cuda::kScanMaxState)
    throw std::invalid_argument(std::string(op) + ": d_state " + std::to_string(N) +
                                " is outside [1, " + std::to_string(cuda::kScanMaxState) +
                                "] supported by the CUDA scan");
  int lanes = 1;
  while (lanes < N) lanes *= 2;
  return lanes;
}

int tiles_for(int D, int lanes) {
  return (D + kScanWarps * (32 / lanes) - 1) / (kScanWarps * (32 / lanes));
}

// Calls f(std::integral_constant<int, kLanes>) for the lane count of N.
template <class F>
void with_lanes(int lanes, F&& f) {
  switch (lanes) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    default:
      return f(std::integral_constant<int, 32>{});
  }
}

template <class T>
ScanArgs<dev_t<T>> make_args(const T* u, const T* delta, const float* A, const T* Bm, const T* Cm,
                             const float* Dskip, const T* z, const float* delta_bias, bool sp,
                             int B, int L, int D, int N) {
  return {dev(u), dev(delta), A, dev(Bm), dev(Cm), Dskip, delta_bias, dev(z), sp, B, L, D, N};
}

struct WorkspaceLayout {
  size_t chunk_states, dA, dD, dbias, dB, dC, total;  // offsets in floats
  WorkspaceLayout(int B, int L, int D, int N) {
    const size_t nchunk = size_t((L + kChunk - 1) / kChunk);
    const size_t tiles = size_t(tiles_for(D, lanes_for(N, "selective_scan_backward")));
    chunk_states = 0;
    dA = chunk_states + size_t(B) * nchunk * D * N;
    dD = dA + size_t(B) * D * N;
    dbias = dD + size_t(B) * D;
    dB = dbias + size_t(B) * D;
    dC = dB + tiles * B * L * N;
    total = dC + tiles * B * L * N;
  }
};

}  // namespace

template <class T>
void selective_scan_forward(const T* u, const T* delta, const float* A, const T* Bm, const T* Cm,
                            const float* Dskip, const T* z, const float* delta_bias,
                            bool delta_softplus, T* out, float* last_state, int B, int L, int D,
                            int N, cudaStream_t stream) {
  const int lanes = lanes_for(N, "selective_scan_forward");
  if (B <= 0 || L <= 0 || D <= 0) return;
  const auto a = make_args(u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, L, D, N);
  with_lanes(lanes, [&](auto kl) {
    constexpr int kLanes = decltype(kl)::value;
    const auto kernel = &scan_forward_kernel<dev_t<T>, kLanes>;
    SLIPSTREAM_LAUNCH(kernel, dim3(unsigned(tiles_for(D, kLanes)), unsigned(B)),
                      dim3(kScanWarps * 32), stream, a, dev(out), last_state);
  });
  check_launch("selective_scan_forward");
}

size_t selective_scan_backward_workspace_bytes(int B, int L, int D, int N) {
  return WorkspaceLayout(B, L, D, N).total * sizeof(float);
}

template <class T>
void selective_scan_backward(const T* u, const T* delta, const float* A, const T* Bm, const T* Cm,
                             const float* Dskip, const T* z, const float* delta_bias,
                             bool delta_softplus, const T* dout, T* du, T* ddelta, float* dA,
                             T* dBm, T* dCm, float* dDskip, T* dz, float* ddelta_bias,
                             void* workspace, int B, int L, int D, int N, cudaStream_t stream) {
  const int lanes = lanes_for(N, "selective_scan_backward");
  if (B <= 0 || L <= 0 || D <= 0) return;
  const WorkspaceLayout lay(B, L, D, N);
  float* ws = static_cast<float*>(workspace);
  const ScanGrads w{ws + lay.chunk_states, ws + lay.dA, ws + lay.dD,
                    ws + lay.dbias,        ws + lay.dB, ws + lay.dC};
  const auto a = make_args(u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, L, D, N);
  const int tiles = tiles_for(D, lanes);
  with_lanes(lanes, [&](auto kl) {
    constexpr int kLanes = decltype(kl)::value;
    const auto kernel = &scan_backward_kernel<dev_t<T>, kLanes>;
    SLIPSTREAM_LAUNCH(kernel, dim3(unsigned(tiles), unsigned(B)), dim3(kScanWarps * 32), stream, a,
                      dev(dout), dev(du), dev(ddelta), dev(dz), w);
  });
  check_launch("selective_scan_backward");
  const char* op = "selective_scan_backward (partial sums)";
  const size_t bln = size_t(B) * L * N;
  sum_partials(w.dB_part, tiles, bln, dev(dBm), false, stream, op);
  sum_partials(w.dC_part, tiles, bln, dev(dCm), false, stream, op);
  sum_partials(w.dA_part, B, size_t(D) * N, dA, true, stream, op);
  if (Dskip) sum_partials(w.dD_part, B, size_t(D), dDskip, true, stream, op);
  if (delta_bias) sum_partials(w.dbias_part, B, size_t(D), ddelta_bias, true, stream, op);
}

template <class T>
void selective_scan_step(float* state, const T* u, const T* delta, const float* A, const T* Bm,
                         const T* Cm, const float* Dskip, const T* z, const float* delta_bias,
                         bool delta_softplus, T* out, int B, int D, int N, cudaStream_t stream) {
  const int lanes = lanes_for(N, "selective_scan_step");
  if (B <= 0 || D <= 0) return;
  const auto a = make_args(u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, 1, D, N);
  with_lanes(lanes, [&](auto kl) {
    constexpr int kLanes = decltype(kl)::value;
    const auto kernel = &scan_step_kernel<dev_t<T>, kLanes>;
    SLIPSTREAM_LAUNCH(kernel, dim3(unsigned(tiles_for(D, kLanes)), unsigned(B)),
                      dim3(kScanWarps * 32), stream, a, state, dev(out));
  });
  check_launch("selective_scan_step");
}

#define INSTANTIATE(T)                                                                             \
  template void selective_scan_forward<T>(const T*, const T*, const float*, const T*, const T*,    \
                                          const float*, const T*, const float*, bool, T*, float*,  \
                                          int, int, int, int, cudaStream_t);                       \
  template void selective_scan_backward<T>(const T*, const T*, const float*, const T*, const T*,   \
                                           const float*, const T*, const float*, bool, const T*,   \
                                           T*, T*, float*, T*, T*, float*, T*, float*, void*, int, \
                                           int, int, int, cudaStream_t);                           \
  template void selective_scan_step<T>(float*, const T*, const T*, const float*, const T*,         \
                                       const T*, const float*, const T*, const float*, bool, T*,   \
                                       int, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bfloat16)
#undef INSTANTIATE

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
