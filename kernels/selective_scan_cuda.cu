// Selective scan on CUDA; the math, layouts and gradient conventions are those of the CPU
// reference (kernels/selective_scan_cpu.cpp), against which it is tested.
//
// The forward and backward run threads per (b, d) channel with its states in registers (below,
// "channel kernels"; the forward's thread up to 16 states, the backward's up to 8). The one-frame
// step for inference runs a thread per (b, d, n): the lanes of a warp are kLanes states (kLanes = N
// rounded up to a power of two) of 32 / kLanes consecutive channels, sums over the state are
// butterfly shuffles inside the group.
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda_common.cuh"
#include "kernels/selective_scan.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

using ScanBackwardVariant = Kernels::ScanBackwardVariant;

namespace {

constexpr int kScanWarps = 8;

template <class DT>
struct ScanArgs {
  const DT *u, *delta;
  const float* A;  // (D, N): A, or A_log with a_log (the kernels make A = −exp(A_log))
  const DT *Bm, *Cm;
  const float *Dskip, *delta_bias;
  const DT* z;
  const float* h0;    // (B, D, N) state before the first step, or null: zero
  const DT* dt;       // with dt_w: Δ's low-rank form, rows ldbc apart (the forward makes Δ)
  const float* dt_w;  // (D, R): dt_proj's weight
  int R;
  bool softplus;
  bool a_log;
  int B, L, D, N;
  int ldbc;  // elements from one row (b, t) of Bm and Cm to the next: N, or more in a wider tensor
  int zld;   // the same for z (and the backward's dz): D, or more
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
    A = ok ? a.A[size_t(d) * a.N + n] : 0.f;  // the one-frame step takes A itself
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
    s.Bn = to_f32(a.Bm[row * a.ldbc + q.n]);
    s.Cn = to_f32(a.Cm[row * a.ldbc + q.n]);
  }
  return s;
}

// ---- Forward and backward: one thread per (b, d) channel, its states in registers ----------
//
// A thread holds kNS states of one channel (kG threads per channel when N > kNS), so sums over
// the state are in-thread (plus one shuffle when kG = 2), per-channel work (softplus, the gate)
// is done once, and the loads of u, delta, z, dout and the stores of du, ddelta, dz are
// coalesced across channels. A block is kChanThreads threads of one batch row; B and C rows,
// shared by the block, are staged in shared memory. exp(dt A) is exp2(dt A log2 e).

constexpr int kChanThreads = 128;
constexpr int kChanWarps = kChanThreads / 32;
constexpr int kStage = 32;    // steps of Bm, Cm staged at a time
constexpr int kPrefetch = 8;  // steps whose inputs are loaded before their recurrence
constexpr int kMaxPad = Kernels::kScanMaxState;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Channels per block for kG threads per channel.
template <int kG>
constexpr int kChanPerBlock = kChanThreads / kG;

// Where thread (b, d, state subset s) is, and its channel's constants.
template <int kNS, int kG>
struct ChanLane {
  int tid, lane, warp, s, d, b;
  bool dok;
  float A2[kNS];  // A log2(e), zero for padding states
  float Dd, bias;
  template <class DT>
  __device__ explicit ChanLane(const ScanArgs<DT>& a) {
    tid = int(threadIdx.x);
    lane = tid & 31;
    warp = tid >> 5;
    s = tid % kG;
    d = int(blockIdx.x) * kChanPerBlock<kG> + tid / kG;
    b = int(blockIdx.y);
    dok = d < a.D;
    if (a.a_log) {
      // A = −exp(A_log) made once an element for the block, into shared memory, and read from
      // there as a given A is from memory: each lane making its own (sm_90, ptxas 13) took the
      // forward at d_state 32 from 128 registers to 158–167 and the backward to 152.
      constexpr int kPerChan = kNS * kG;
      __shared__ float sA[kChanPerBlock<kG> * kPerChan];
      const int d0 = int(blockIdx.x) * kChanPerBlock<kG>;
      for (int k = tid; k < kChanPerBlock<kG> * kPerChan; k += kChanThreads) {
        const int dd = d0 + k / kPerChan, n = k % kPerChan;
        sA[k] = (dd < a.D && n < a.N) ? neg_expf_(a.A[size_t(dd) * a.N + n]) : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kNS; ++i) A2[i] = sA[(tid / kG) * kPerChan + s * kNS + i] * kLog2e;
    } else {
#pragma unroll
      for (int i = 0; i < kNS; ++i) {
        const int n = s * kNS + i;
        A2[i] = (dok && n < a.N) ? a.A[size_t(d) * a.N + n] * kLog2e : 0.f;
      }
    }
    Dd = (dok && a.Dskip) ? a.Dskip[d] : 0.f;
    bias = (dok && a.delta_bias) ? a.delta_bias[d] : 0.f;
  }
  // The channel's states before the first step: initial_state's, or zeros.
  template <class DT>
  __device__ void initial(const ScanArgs<DT>& a, float (&h)[kNS]) const {
#pragma unroll
    for (int i = 0; i < kNS; ++i) {
      const int n = s * kNS + i;
      h[i] = (a.h0 && dok && n < a.N) ? a.h0[(size_t(b) * a.D + d) * a.N + n] : 0.f;
    }
  }
};

// Rows t0 .. t0 + tn of the block's Bm and Cm into shared memory, zero past N (padding states).
template <class DT, int kNP>
__device__ __forceinline__ void stage_bc(const ScanArgs<DT>& a, int b, int t0, int tn,
                                         float (*sB)[kMaxPad], float (*sC)[kMaxPad]) {
  for (int k = int(threadIdx.x); k < tn * kNP; k += kChanThreads) {
    const int j = k / kNP, n = k - j * kNP;
    const size_t o = (size_t(b) * a.L + t0 + j) * a.ldbc + n;
    sB[j][n] = n < a.N ? to_f32(a.Bm[o]) : 0.f;
    sC[j][n] = n < a.N ? to_f32(a.Cm[o]) : 0.f;
  }
}

// One channel's inputs at step t (zeros outside the problem, which keep its state at 0).
struct ChanIn {
  float u, raw, dt;
};
template <class DT>
__device__ __forceinline__ ChanIn load_chan(const ScanArgs<DT>& a, bool dok, size_t i, float bias) {
  ChanIn c{0.f, 0.f, 0.f};
  if (dok) {
    c.u = to_f32(a.u[i]);
    c.raw = to_f32(a.delta[i]) + bias;
    c.dt = a.softplus ? softplusf_(c.raw) : c.raw;
  }
  return c;
}
// The same with Δ given (made from its low-rank form) rather than read.
template <class DT>
__device__ __forceinline__ ChanIn chan_with_delta(const ScanArgs<DT>& a, bool dok, size_t i,
                                                  float delta, float bias) {
  ChanIn c{0.f, 0.f, 0.f};
  if (dok) {
    c.u = to_f32(a.u[i]);
    c.raw = delta + bias;
    c.dt = a.softplus ? softplusf_(c.raw) : c.raw;
  }
  return c;
}

// h_t = exp(dt A) h_{t-1} + dt u B_t (dtA2 = dt A log2 e, dub = dt u B_t) as one explicit fma: the
// forward, the backward's first pass and its recomputation then round alike whatever the compiler
// would contract, so the chunk states the forward keeps are the ones the backward would find.
// The decay is exp2_ftz (the SFU's ex2.approx.ftz): exp2f's bits wherever it is a normal float, 0
// below 2^-126, without exp2f's compare and predicated multiplies for denormal results (measured
// on an H100 and an H200, 2026-11-28: exp2f's backward took 1.04-1.13x its time).
__device__ __forceinline__ float decay(float dtA2) {
  return exp2_ftz(dtA2);
}
__device__ __forceinline__ float next_state(float dtA2, float h, float dub) {
  return fmaf(decay(dtA2), h, dub);
}

// One halving round of channel_sum: lanes with bit kOff keep the upper kHalf values, the others
// the lower, each adding its partner's copy of the ones it keeps. The choice is lane_select's:
// written as `?:`, nvcc 13 computed the first round's values on two branches (lanes 0-15 and
// 16-31), and every shuffle of that round ran in its collective slow form on each half (sm_90
// SASS: 48 BRA.DIV / 124 WARPSYNC.COLLECTIVE in the default backward; none with selp; that form
// took 1.7-1.8x the backward's time on an H100 and an H200, 2026-11-28).
template <int kHalf, int kOff, int kNS>
__device__ __forceinline__ void channel_sum_round(float (&v)[kNS], int lane, int& idx) {
  const bool upper = (lane & kOff) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = lane_select(upper, v[i], v[i + kHalf]);
    const float keep = lane_select(upper, v[i + kHalf], v[i]);
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
  }
  if (upper) idx += kHalf;
  if constexpr (kHalf > 1) channel_sum_round<kHalf / 2, kOff / 2>(v, lane, idx);
}
// Sum over the warp's channels of kNS values per lane (lanes with the same state subset
// s = lane % kG): log2(kNS) rounds that halve the values each lane holds, then plain butterfly
// rounds over the remaining channel bits. Returns the sum of value `idx` of every channel.
template <int kNS, int kG>
__device__ __forceinline__ float channel_sum(float (&v)[kNS], int lane, int& idx) {
  idx = 0;
  channel_sum_round<kNS / 2, 16>(v, lane, idx);
  float sum = v[0];
#pragma unroll
  for (int off = 16 / kNS; off >= kG; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  return sum;
}
// Lanes whose channel_sum is a copy of another lane's (the plain rounds' partners): the bits
// of those rounds' offsets.
template <int kNS, int kG>
constexpr int kChannelSumCopies = 16 / kNS >= kG ? 2 * (16 / kNS) - kG : 0;

// With `chunks` (the layout of ScanGrads::chunk_states for the backward's kT = save_every), the
// forward also keeps h at the start of every chunk, so the backward need not run the recurrence
// a second time to find them. Held to 4 blocks an SM (128 registers): at d_state 32 ptxas 13
// would take 158-164 (3 blocks) since the kernel makes A from A_log. kProj: Δ made from dt and
// dt_w (ScanArgs::dt_w) instead of read, the block's rows of dt staged beside Bm's and its
// channels' dt_w once, in shared memory (a separate instantiation: the other keeps its
// shared memory and registers).
// A step's out: y gated by SiLU(z) where the scan has z, stored, and its bf16 copy beside it.
template <class DT>
__device__ __forceinline__ void store_out(const ScanArgs<DT>& a, DT* out, __nv_bfloat16* out_bf,
                                          size_t i, float y, float z) {
  const DT yv = from_f32<DT>(a.z ? y * siluf_(z) : y);
  if (out) out[i] = yv;                                         // null where only the copy is read
  if (out_bf) out_bf[i] = from_f32<__nv_bfloat16>(to_f32(yv));  // as the cast rounds it
}

// kLean: Kernels::scan_forward_lean's form (chunk states from a running offset, y as four sums,
// and with kG threads a channel the channel work shared out among them).
template <class DT, int kNS, int kG, bool kProj = false, bool kLean = false>
__global__ void __launch_bounds__(kChanThreads, 4)
    scan_forward_chan_kernel(ScanArgs<DT> a, DT* out, __nv_bfloat16* out_bf, float* last_state,
                             float* chunks, int save_every) {
  constexpr int kNP = kNS * kG;
  constexpr int kRows = kProj ? kStage : 1, kRank = kProj ? Kernels::kScanMaxDtRank : 1;
  __shared__ float sB[kStage][kMaxPad], sC[kStage][kMaxPad];
  __shared__ float sDt[kRows][kRank], sW[kRank][kProj ? kChanPerBlock<kG> : 1];
  const ChanLane<kNS, kG> q(a);
  if constexpr (kProj) {
    const int d0 = int(blockIdx.x) * kChanPerBlock<kG>;
    for (int k = q.tid; k < a.R * kChanPerBlock<kG>; k += kChanThreads) {
      const int r = k / kChanPerBlock<kG>, c = k - r * kChanPerBlock<kG>;
      sW[r][c] = d0 + c < a.D ? a.dt_w[size_t(d0 + c) * a.R + r] : 0.f;
    }  // read after the window loop's first __syncthreads
  }
  // kSpread: the lean form's channel work shared out among a channel's threads (below).
  constexpr bool kSpread = kLean && kG > 1 && !kProj;
  constexpr int kOwn = kSpread ? kPrefetch / kG : kPrefetch;
  const int nchunk = chunks ? (a.L + save_every - 1) / save_every : 0;
  // kLean: the next chunk start's place in `chunks` (this thread's first state) and the steps
  // until it.
  size_t chunk_at = chunks ? ((size_t(q.b) * nchunk) * a.N + size_t(q.s) * kNS) * a.D + q.d : 0;
  int until_chunk = 0;
  float h[kNS];
  q.initial(a, h);
  for (int t0 = 0; t0 < a.L; t0 += kStage) {
    const int tn = a.L - t0 < kStage ? a.L - t0 : kStage;
    __syncthreads();
    stage_bc<DT, kNP>(a, q.b, t0, tn, sB, sC);
    if constexpr (kProj)
      for (int k = q.tid; k < tn * a.R; k += kChanThreads) {
        const int j = k / a.R, r = k - j * a.R;
        sDt[j][r] = to_f32(a.dt[(size_t(q.b) * a.L + t0 + j) * a.ldbc + r]);
      }
    __syncthreads();
    // Steps in groups of kPrefetch: the group's loads are issued before its recurrence. With
    // kSpread a group's steps are shared out among the channel's kG threads for their channel
    // work: thread s loads steps s, s + kG, ... (slot m: step s + kG m) and makes their dt, the
    // others take each step's dt and u by shuffles, and each thread gates and stores its own
    // steps' out after the group. A warp then issues that work kPrefetch / kG times a group
    // instead of kPrefetch; the same values, so the same bits.
    for (int g0 = 0; g0 < tn; g0 += kPrefetch) {
      ChanIn in[kOwn];
      float zz[kOwn];
#pragma unroll
      for (int m = 0; m < kOwn; ++m) {
        const int j = kSpread ? q.s + kG * m : m;
        const size_t i = (size_t(q.b) * a.L + t0 + g0 + j) * a.D + q.d;
        const bool ok = q.dok && g0 + j < tn;
        if constexpr (kProj) {
          float delta = 0.f;
          if (ok)
            for (int r = 0; r < a.R; ++r) delta = fmaf(sDt[g0 + j][r], sW[r][q.tid / kG], delta);
          in[m] = chan_with_delta(a, ok, i, delta, q.bias);
        } else {
          in[m] = load_chan(a, ok, i, q.bias);
        }
        const size_t iz = (size_t(q.b) * a.L + t0 + g0 + j) * a.zld + q.d;
        zz[m] = (ok && a.z) ? to_f32(a.z[iz]) : 0.f;
      }
      float sdt[kSpread ? kPrefetch : 1], su[kSpread ? kPrefetch : 1], own_y[kOwn];
      if constexpr (kSpread) {
        const int first = q.lane & ~(kG - 1);  // the channel's first lane
#pragma unroll
        for (int j = 0; j < kPrefetch; ++j) {
          sdt[j] = __shfl_sync(0xffffffffu, in[j / kG].dt, first | (j % kG));
          su[j] = __shfl_sync(0xffffffffu, in[j / kG].u, first | (j % kG));
        }
#pragma unroll
        for (int m = 0; m < kOwn; ++m) own_y[m] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < kPrefetch; ++j) {
        if (g0 + j >= tn) break;  // block-uniform
        const int t = t0 + g0 + j;
        if constexpr (kLean) {
          if (chunks) {
            if (until_chunk == 0) {
              if (q.dok)
#pragma unroll
                for (int k = 0; k < kNS; ++k)
                  if (q.s * kNS + k < a.N) chunks[chunk_at + size_t(k) * a.D] = h[k];
              chunk_at += size_t(a.N) * a.D;
              until_chunk = save_every;
            }
            --until_chunk;
          }
        } else if (chunks && t % save_every == 0 && q.dok) {
#pragma unroll
          for (int k = 0; k < kNS; ++k) {
            const int n = q.s * kNS + k;
            if (n < a.N)
              chunks[((size_t(q.b) * nchunk + t / save_every) * a.N + n) * a.D + q.d] = h[k];
          }
        }
        float dt, u;
        if constexpr (kSpread) {
          dt = sdt[j];
          u = su[j];
        } else {
          dt = in[j].dt;
          u = in[j].u;
        }
        const float dtu = dt * u;
        constexpr int kSums = kLean ? 4 : 1;
        float ys[kSums];
#pragma unroll
        for (int k = 0; k < kSums; ++k) ys[k] = 0.f;
#pragma unroll
        for (int k = 0; k < kNS; ++k) {
          const int n = q.s * kNS + k;
          h[k] = next_state(dt * q.A2[k], h[k], dtu * sB[g0 + j][n]);
          ys[k % kSums] += sC[g0 + j][n] * h[k];
        }
        float y = ys[0];
        if constexpr (kSums == 4) y = (ys[0] + ys[1]) + (ys[2] + ys[3]);
        y = group_sum<kG>(y) + q.Dd * u;
        if constexpr (kSpread) {  // step j's thread keeps y for its gate and store below
          own_y[j / kG] = lane_select(q.s == j % kG, y, own_y[j / kG]);
        } else {  // inline, not store_out: through it ptxas 13 spilled 4 bytes in kProj's form
          const size_t i = (size_t(q.b) * a.L + t0 + g0 + j) * a.D + q.d;
          if (q.dok && q.s == 0) {
            const DT yv = from_f32<DT>(a.z ? y * siluf_(zz[j]) : y);
            if (out) out[i] = yv;  // null where only the copy is read
            if (out_bf) out_bf[i] = from_f32<__nv_bfloat16>(to_f32(yv));  // as the cast rounds it
          }
        }
      }
      if constexpr (kSpread)
#pragma unroll
        for (int m = 0; m < kOwn; ++m) {
          const int j = q.s + kG * m;
          if (q.dok && g0 + j < tn)
            store_out(a, out, out_bf, (size_t(q.b) * a.L + t0 + g0 + j) * a.D + q.d, own_y[m],
                      zz[m]);
        }
    }
  }
  if (last_state && q.dok)
#pragma unroll
    for (int k = 0; k < kNS; ++k) {
      const int n = q.s * kNS + k;
      if (n < a.N) last_state[(size_t(q.b) * a.D + q.d) * a.N + n] = h[k];
    }
}

// shared_sums's swizzle: the 4-float unit c of channel ch's row lies at unit c ^ this. A
// quarter-warp (8 threads: 8 / kG channels, kG state subsets each) then stores its float4s to 8
// distinct units modulo 8, i.e. every bank once: with kG = 2 the channels' two low bits go to
// the unit's bits 0 and 2 (a subset's units are 2s + c, bit 1), with kG = 4 the channel's low bit
// to bit 0 (units 2s + c, bits 1 and 2).
template <int kG>
__device__ __forceinline__ int shared_sums_swizzle(int ch) {
  if constexpr (kG == 2)
    return (ch & 1) | ((ch & 2) << 1);
  else
    return ch & 1;
}

struct ScanGrads {
  float* chunk_states;  // (B, nchunk, N, D): h before each chunk's first step, pass 1's
  const float* saved;   // the same from the forward (pass 1 skipped), or null
  float* dA_part;       // (B, D, N)
  float* dD_part;       // (B, D)
  float* dbias_part;    // (B, D)
  float* dB_part;       // (tiles, B, L, N)
  float* dC_part;       // (tiles, B, L, N)
  // dΔ's and dz's bf16 copies for the backward GEMMs (may be null), rounded as fp32_to_bf16 of
  // the stored values: no cast launches. At d_state 16 the default shape stays at 127 registers
  // (128 in bf16).
  __nv_bfloat16* ddelta_bf;
  __nv_bfloat16* dz_bf;
};

// One step's channel gradients from its sums over the channel's states (sus = Σ g B, gsa = Σ da
// A log2 e), its inputs and its dz (dzv): returns dΔ (before the bias's sum); where `store`,
// writes du, dΔ and dz (and their bf16 copies) at the step's row (b L + t) and channel d. Both
// of the backward's ways of sharing the channel work (every thread every step, or a thread its
// steps) call it, so they compute the same values the same way.
template <class DT>
__device__ __forceinline__ float finish_step(const ScanArgs<DT>& a, const ScanGrads& w, DT* du,
                                             DT* ddelta, DT* dz, bool store, size_t row, int d,
                                             float Dd, float sus, float gsa, const ChanIn& x,
                                             float dy, float dzv) {
  const float ddt = gsa * kLn2 + sus * x.u;
  const float dd = a.softplus ? ddt * softplus_gradf_(x.raw) : ddt;
  if (store) {
    const size_t i = row * size_t(a.D) + d;
    du[i] = from_f32<DT>(sus * x.dt + dy * Dd);
    const DT ddv = from_f32<DT>(dd);
    ddelta[i] = ddv;
    if (w.ddelta_bf) w.ddelta_bf[i] = from_f32<__nv_bfloat16>(to_f32(ddv));
    if (a.z) {  // dz, its copy, or both (dz null where only the copy is read)
      const DT dzd = from_f32<DT>(dzv);
      const size_t iz = row * size_t(a.zld) + d;
      if (dz) dz[iz] = dzd;
      if (w.dz_bf) w.dz_bf[iz] = from_f32<__nv_bfloat16>(to_f32(dzd));
    }
  }
  return dd;
}

// Pass 1 runs the recurrence and keeps h at the start of every kT-step chunk, the first chunk's
// too (pass 2 then reads every chunk's start the same way, which at d_state 16 keeps the kernel
// at 127-128 registers, 4 blocks an SM, where a separate initial-state branch took 139 and 3); when
// the forward kept them (w.saved) there is no pass 1. Pass 2 takes the chunks last to first,
// recomputes a chunk's states into registers and runs the adjoint recurrence through it. dBm,
// dCm are summed over the warp's channels by channel_sum, over the block's warps in shared
// memory (fixed order), and over blocks by sum_partials.
// The split shapes (8 states a thread, 2 or 4 threads a channel) are held to 4 blocks an SM (128
// registers): left to itself ptxas 13 gave production's (d_state 32) 139-152 after small changes
// elsewhere in the kernel (3 blocks), and now fits 128 without a spill. The shapes of d_state up
// to 8 keep ptxas's own choice (a minimum of 0 blocks is none: an explicit 1 let a shape grow
// from 127 registers to 162).
// kShared (ScanBackwardVariant::shared_sums, the split shapes only): dBm and dCm summed over the
// block's channels through shared memory a chunk at a time instead of by channel_sum's shuffles
// each step: each thread stores its 2 kNS products of a step (float4 stores, swizzled so that a
// quarter-warp's stores hit every bank once), and after the chunk a thread a column sums them
// over the channels in a fixed order (four running sums, then their sum). No shuffles, selects or
// dependent rounds a step; two barriers a chunk. The same shared memory as the warps' sums.
// kSharedWhole (ScanBackwardVariant::shared_whole_chunks): kShared with no test between the
// steps of a whole chunk (run_chunk's kFull), at the split shapes' 128 registers (ptxas 13,
// sm_90: no spill at d_state 16, 8-24 bytes at 32).
// kSpread (ScanBackwardVariant::spread_steps): a chunk's steps shared out among the channel's kG
// threads for their channel work (loads, softplus, the gate, du, dΔ, dz): thread s loads steps s,
// s + kG, ..., the others take their dt, u and dy by shuffles, and after the chunk each thread
// finishes its own steps' gradients (finish_step) from the sums it kept. A warp then issues that
// work once a chunk (kG = 4) or twice (kG = 2) instead of once a step.
template <class DT, int kNS, int kG, int kT, bool kShared = false, bool kSharedWhole = false,
          bool kSpread = false>
__global__ void __launch_bounds__(kChanThreads, kNS == 8 && kG > 1 ? 4 : 0)
    scan_backward_chan_kernel(ScanArgs<DT> a, const DT* dout, DT* du, DT* ddelta, DT* dz,
                              ScanGrads w) {
  constexpr int kNP = kNS * kG;
  static_assert(kStage % kT == 0, "a window holds whole chunks");
  static_assert(!kShared || (kNS == 8 && kG > 1), "shared_sums is a form of the split shapes");
  static_assert(!kSharedWhole || kShared, "shared_whole_chunks is a form of shared_sums");
  static_assert(kChanPerBlock<kG> % 4 == 0, "shared_sums sums four channels at a time");
  static_assert(!kSpread || (kNS == 8 && kG > 1 && kT % kG == 0 && !kShared),
                "spread_steps is a form of the split shapes, a chunk's steps shared out evenly");
  __shared__ float sB[kStage][kMaxPad], sC[kStage][kMaxPad];
  constexpr int kW = kShared ? 1 : kChanWarps, kS = kShared ? 1 : kStage;
  __shared__ float rB[kW][kS][kMaxPad], rC[kW][kS][kMaxPad];
  // kShared: a row of 2 kNP products (dBm's then dCm's) per step of the chunk and channel.
  constexpr int kCols = 2 * kNP, kChan = kChanPerBlock<kG>;
  alignas(16) __shared__ float raw[kShared ? kT * kChan * kCols : 4];
  const ChanLane<kNS, kG> q(a);
  const int L = a.L, D = a.D, N = a.N, tile = int(blockIdx.x);
  const int nchunk = (L + kT - 1) / kT;
  auto state_at = [&](int c, int n) { return ((size_t(q.b) * nchunk + c) * N + n) * D + q.d; };
  const float* starts = w.saved ? w.saved : w.chunk_states;

  // Pass 1.
  if (!w.saved) {
    float h[kNS];
    q.initial(a, h);
    for (int t0 = 0; t0 < L; t0 += kStage) {
      const int tn = L - t0 < kStage ? L - t0 : kStage;
      __syncthreads();
      stage_bc<DT, kNP>(a, q.b, t0, tn, sB, sC);
      __syncthreads();
      for (int g0 = 0; g0 < tn; g0 += kPrefetch) {
        ChanIn in[kPrefetch];
#pragma unroll
        for (int j = 0; j < kPrefetch; ++j)
          in[j] =
              load_chan(a, q.dok && g0 + j < tn, (size_t(q.b) * L + t0 + g0 + j) * D + q.d, q.bias);
#pragma unroll
        for (int j = 0; j < kPrefetch; ++j) {
          const int t = t0 + g0 + j;
          if (g0 + j >= tn) break;  // block-uniform
          if (t % kT == 0 && q.dok)
#pragma unroll
            for (int k = 0; k < kNS; ++k) {
              const int n = q.s * kNS + k;
              if (n < N) w.chunk_states[state_at(t / kT, n)] = h[k];
            }
          const float dtu = in[j].dt * in[j].u;
#pragma unroll
          for (int k = 0; k < kNS; ++k)
            h[k] = next_state(in[j].dt * q.A2[k], h[k], dtu * sB[g0 + j][q.s * kNS + k]);
        }
      }
    }
  }

  // Pass 2, over windows of kStage steps (Bm, Cm staged once a window), last to first, and
  // their chunks last to first. g is d loss / d h_t flowing back from step t + 1.
  float g[kNS], dA_acc[kNS];
#pragma unroll
  for (int k = 0; k < kNS; ++k) g[k] = dA_acc[k] = 0.f;
  float dD_acc = 0.f, dbias_acc = 0.f;
  for (int w0 = (L - 1) / kStage * kStage; w0 >= 0; w0 -= kStage) {
    const int wn = L - w0 < kStage ? L - w0 : kStage;
    __syncthreads();
    stage_bc<DT, kNP>(a, q.b, w0, wn, sB, sC);
    __syncthreads();
    for (int jc = (wn - 1) / kT * kT; jc >= 0; jc -= kT) {  // the chunk's first step in the window
      const int t0 = w0 + jc, c = t0 / kT, tn = wn - jc < kT ? wn - jc : kT;
      // Everything the chunk reads from memory, issued at once: every step's channel inputs, or
      // with kSpread this thread's steps' (slot m: step s + kG m), the others' then shuffled in.
      constexpr int kOwn = kSpread ? kT / kG : kT;
      ChanIn in[kOwn];
      float go[kOwn], zz[kOwn];
      float hs[kT + 1][kNS];  // hs[j] = h before step t0 + j
#pragma unroll
      for (int k = 0; k < kNS; ++k) {
        const int n = q.s * kNS + k;
        hs[0][k] = (q.dok && n < N) ? starts[state_at(c, n)] : 0.f;
      }
#pragma unroll
      for (int m = 0; m < kOwn; ++m) {
        const int j = kSpread ? q.s + kG * m : m;
        const size_t i = (size_t(q.b) * L + t0 + j) * D + q.d;
        const bool ok = q.dok && j < tn;
        in[m] = load_chan(a, ok, i, q.bias);
        go[m] = ok ? to_f32(dout[i]) : 0.f;
        zz[m] = (ok && a.z) ? to_f32(a.z[(size_t(q.b) * L + t0 + j) * a.zld + q.d]) : 0.f;
      }
      // kSpread: every step's dt, u and dy from the thread that loaded it (zeros past tn, as the
      // loads give), and this thread's steps' sums over the states, kept for their gradients.
      float sdt[kSpread ? kT : 1], su[kSpread ? kT : 1], sdy[kSpread ? kT : 1];
      float own_dy[kSpread ? kOwn : 1], own_sus[kSpread ? kOwn : 1], own_sa[kSpread ? kOwn : 1],
          own_y[kSpread ? kOwn : 1];
      if constexpr (kSpread) {
        const int first = q.lane & ~(kG - 1);  // the channel's first lane
#pragma unroll
        for (int m = 0; m < kOwn; ++m) {
          own_dy[m] = a.z ? go[m] * siluf_(zz[m]) : go[m];
          own_sus[m] = own_sa[m] = own_y[m] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < kT; ++j) {
          sdt[j] = __shfl_sync(0xffffffffu, in[j / kG].dt, first | (j % kG));
          su[j] = __shfl_sync(0xffffffffu, in[j / kG].u, first | (j % kG));
          sdy[j] = __shfl_sync(0xffffffffu, own_dy[j / kG], first | (j % kG));
        }
      }
      // With kSharedWhole a whole chunk runs with no test between its steps (kFull), so the
      // compiler can overlap one step's shuffles and loads with the next step's arithmetic; only a
      // window's last, shorter chunk checks each step. (The split form's own such variant, held
      // to 168 registers and 3 blocks an SM, took 1.14-1.43x the default's time on an H100 and
      // an H200, 2026-11-28.)
      auto run_chunk = [&](auto full) {
        constexpr bool kFull = decltype(full)::value;
#pragma unroll
        for (int j = 0; j < kT; ++j) {
          if constexpr (!kFull)
            if (j >= tn) break;  // block-uniform
          float dt, dtu;
          if constexpr (kSpread) {
            dt = sdt[j];
            dtu = dt * su[j];
          } else {
            dt = in[j].dt;
            dtu = dt * in[j].u;
          }
#pragma unroll
          for (int k = 0; k < kNS; ++k) {
            const float e = decay(dt * q.A2[k]);  // next_state's
            hs[j + 1][k] = fmaf(e, hs[j][k], dtu * sB[jc + j][q.s * kNS + k]);
          }
        }
#pragma unroll
        for (int j = kT - 1; j >= 0; --j) {
          if constexpr (!kFull)
            if (j >= tn) continue;  // block-uniform: the shuffles below stay uniform
          float cB[kNS], cC[kNS], sa = 0.f, sb = 0.f;
          // y before the gate at step j, and the adjoint through the step's states (its dt, u and
          // dy), as every form runs them.
          auto ypre_of = [&](float u) {
            float ypre = 0.f;
#pragma unroll
            for (int k = 0; k < kNS; ++k) ypre += sC[jc + j][q.s * kNS + k] * hs[j + 1][k];
            return group_sum<kG>(ypre) + q.Dd * u;
          };
          auto through_states = [&](float dt, float u, float dy) {
#pragma unroll
            for (int k = 0; k < kNS; ++k) {
              const int n = q.s * kNS + k;
              const float Bn = sB[jc + j][n], Cn = sC[jc + j][n];
              const float ea = decay(dt * q.A2[k]);
              const float gn = g[k] + dy * Cn;
              cC[k] = dy * hs[j + 1][k];
              cB[k] = gn * dt * u;
              const float da = gn * hs[j][k] * ea;  // d loss / d (dt A)
              dA_acc[k] += da * dt;
              sa += da * q.A2[k];
              sb += gn * Bn;
              g[k] = ea * gn;
            }
          };
          if constexpr (kSpread) {
            const float u = su[j], dy = sdy[j], ypre = ypre_of(u);
            dD_acc += dy * u;
            through_states(sdt[j], u, dy);
            const float sus = group_sum<kG>(sb), gsa = group_sum<kG>(sa);
            const bool mine = q.s == j % kG;  // step j's thread keeps its sums for its gradients
            own_sus[j / kG] = lane_select(mine, sus, own_sus[j / kG]);
            own_sa[j / kG] = lane_select(mine, gsa, own_sa[j / kG]);
            own_y[j / kG] = lane_select(mine, ypre, own_y[j / kG]);
          } else {
            const ChanIn x = in[j];
            const float ypre = ypre_of(x.u);
            // Selects rather than branches on the (uniform) options keep the steps one block.
            const float sz = siluf_(zz[j]), gz = silu_gradf_(zz[j]);
            const float dy = a.z ? go[j] * sz : go[j];
            const float dzv = a.z ? go[j] * ypre * gz : 0.f;
            dD_acc += dy * x.u;
            through_states(x.dt, x.u, dy);
            const float sus = group_sum<kG>(sb);
            dbias_acc +=
                finish_step(a, w, du, ddelta, dz, q.s == 0 && q.dok, size_t(q.b) * L + t0 + j, q.d,
                            q.Dd, sus, group_sum<kG>(sa), x, dy, dzv);
          }
          if constexpr (kShared) {
            const int ch = q.tid / kG, sw = shared_sums_swizzle<kG>(ch);
            float* row = raw + (j * kChan + ch) * kCols;
#pragma unroll
            for (int c = 0; c < kNS / 4; ++c) {
              const int cb = q.s * kNS / 4 + c, cc = cb + kNP / 4;  // 4-float units of the row
              store_float4(row + ((cb ^ sw) << 2), cB[4 * c], cB[4 * c + 1], cB[4 * c + 2],
                           cB[4 * c + 3]);
              store_float4(row + ((cc ^ sw) << 2), cC[4 * c], cC[4 * c + 1], cC[4 * c + 2],
                           cC[4 * c + 3]);
            }
          } else {
            int idx = 0;
            const float vb = channel_sum<kNS, kG>(cB, q.lane, idx);
            const float vc = channel_sum<kNS, kG>(cC, q.lane, idx);
            if ((q.lane & kChannelSumCopies<kNS, kG>) == 0) {
              rB[q.warp][jc + j][q.s * kNS + idx] = vb;
              rC[q.warp][jc + j][q.s * kNS + idx] = vc;
            }
          }
        }
      };
      if (kSharedWhole && tn == kT)
        run_chunk(std::true_type{});
      else
        run_chunk(std::false_type{});
      if constexpr (kSpread) {
        // Each thread its steps' gradients (once a chunk, where every thread did every step's),
        // then the bias's sum in the order of the other forms: the chunk's steps last to first.
        float own_dd[kOwn];
#pragma unroll
        for (int m = 0; m < kOwn; ++m) {
          const int j = q.s + kG * m;
          own_dd[m] = finish_step(a, w, du, ddelta, dz, q.dok && j < tn, size_t(q.b) * L + t0 + j,
                                  q.d, q.Dd, own_sus[m], own_sa[m], in[m], own_dy[m],
                                  a.z ? go[m] * own_y[m] * silu_gradf_(zz[m]) : 0.f);
        }
        const int first = q.lane & ~(kG - 1);
#pragma unroll
        for (int j = kT - 1; j >= 0; --j)
          if (j < tn)  // block-uniform
            dbias_acc += __shfl_sync(0xffffffffu, own_dd[j / kG], first | (j % kG));
      }
      if constexpr (kShared) {
        __syncthreads();
        // The chunk's dBm and dCm over the block's channels, a thread a column, in channel order
        // (four running sums): this tile's partials of its steps.
        for (int k = q.tid; k < tn * kCols; k += kChanThreads) {
          const int j = k / kCols, col = k - j * kCols, n = col % kNP;
          // Channel 4m + u's unit lies at (col / 4) ^ swizzle(u): four row pointers, then loads
          // at constant offsets (the loop unrolled whole).
          const float* p[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            p[u] = raw + (j * kChan + u) * kCols +
                   (((col >> 2) ^ shared_sums_swizzle<kG>(u)) << 2) + (col & 3);
          float s4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int m = 0; m < kChan / 4; ++m)
#pragma unroll
            for (int u = 0; u < 4; ++u) s4[u] += p[u][m * 4 * kCols];
          if (n < N) {
            const size_t o = ((size_t(tile) * a.B + q.b) * L + t0 + j) * N + n;
            (col < kNP ? w.dB_part : w.dC_part)[o] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
          }
        }
        __syncthreads();  // before the next chunk's products
      }
    }
    if constexpr (!kShared) {  // (shared_sums wrote its partials a chunk at a time)
      __syncthreads();
      // Sum over the block's warps in a fixed order: this tile's partial of dBm, dCm.
      for (int k = q.tid; k < wn * N; k += kChanThreads) {
        const int j = k / N, n = k - j * N;
        float sb = 0.f, sc = 0.f;
#pragma unroll
        for (int wi = 0; wi < kChanWarps; ++wi) {
          sb += rB[wi][j][n];
          sc += rC[wi][j][n];
        }
        const size_t o = ((size_t(tile) * a.B + q.b) * L + w0 + j) * N + n;
        w.dB_part[o] = sb;
        w.dC_part[o] = sc;
      }
    }
  }
  if (q.dok) {
#pragma unroll
    for (int k = 0; k < kNS; ++k) {
      const int n = q.s * kNS + k;
      if (n < N) w.dA_part[(size_t(q.b) * D + q.d) * N + n] = dA_acc[k];
    }
    if (q.s == 0) {
      w.dD_part[size_t(q.b) * D + q.d] = dD_acc;
      w.dbias_part[size_t(q.b) * D + q.d] = dbias_acc;
    }
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
  if (N < 1 || N > Kernels::kScanMaxState)
    throw std::invalid_argument(std::string(op) + ": d_state " + std::to_string(N) +
                                " is outside [1, " + std::to_string(Kernels::kScanMaxState) +
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
                             int B, int L, int D, int N, int ldbc = 0, int zld = 0) {
  auto a = zero_filled<ScanArgs<dev_t<T>>>();  // padding too: a launch's key hashes it
  a.u = dev(u);
  a.delta = dev(delta);
  a.A = A;
  a.Bm = dev(Bm);
  a.Cm = dev(Cm);
  a.Dskip = Dskip;
  a.delta_bias = delta_bias;
  a.z = dev(z);
  a.softplus = sp;
  a.B = B;
  a.L = L;
  a.D = D;
  a.N = N;
  a.ldbc = ldbc > 0 ? ldbc : N;
  a.zld = zld > 0 ? zld : D;
  return a;
}

// The backward's form: set_scan_backward_variant's, else SLIPSTREAM_SCAN_BACKWARD's (a form's
// name, for a whole-step A/B of one build: tools/gpu_check/ab_step.sh), else split. Read at the
// first use, so a name that is none is a call's error, not the process's start's.
constexpr std::pair<ScanBackwardVariant, const char*> kBackwardVariantNames[] = {
    {ScanBackwardVariant::split, "split"},
    {ScanBackwardVariant::shared_sums, "shared_sums"},
    {ScanBackwardVariant::shared_whole_chunks, "shared_whole_chunks"},
    {ScanBackwardVariant::spread_steps, "spread_steps"}};
// SLIPSTREAM_SCAN_BACKWARD's form, or split. Throws for a name that is none (a function-local
// static left unset by a throw is tried again at the next call).
ScanBackwardVariant variant_from_environment() {
  const char* e = std::getenv("SLIPSTREAM_SCAN_BACKWARD");
  if (!e || !*e) return ScanBackwardVariant::split;
  std::string names;
  for (const auto& [v, name] : kBackwardVariantNames) {
    if (std::string(e) == name) return v;
    names += names.empty() ? name : std::string(", ") + name;
  }
  throw std::invalid_argument(std::string("SLIPSTREAM_SCAN_BACKWARD=") + e +
                              " names no form of the scan's backward (" + names + ")");
}
// Initialised once, thread-safely, at the first use; set_scan_backward_variant writes it.
ScanBackwardVariant& backward_variant_slot() {
  static ScanBackwardVariant v = variant_from_environment();
  return v;
}
ScanBackwardVariant backward_variant() {
  return backward_variant_slot();
}

// The channel kernels' shapes for d_state N: kNS states per thread, kG threads per channel,
// kT steps per backward chunk (fewer for more states: the chunk's states live in registers).
// Above 8 states the backward gives a thread 8 states of a channel (two or four threads a
// channel): 1.2-1.5x faster on an H200 than 16 a thread as the forward has (2026-11-26).
struct ChanShape {
  int ns, g, t;
};
ChanShape chan_shape(int N, const char* op, bool backward = false) {
  lanes_for(N, op);  // the range check
  if (N <= 4) return {4, 1, 8};
  if (N <= 8) return {8, 1, 8};
  if (backward) return N <= 16 ? ChanShape{8, 2, 4} : ChanShape{8, 4, 4};
  if (N <= 16) return {16, 1, 4};
  return {16, 2, 4};
}

// The backward kernel of a shape, shared_sums's, shared_whole_chunks's or spread_steps's form for
// the split shapes when that is the variant (each differs from the default in one thing,
// shared_whole_chunks from shared_sums in one).
template <class T, int kNS, int kG, int kT>
auto backward_kernel() {
  if constexpr (kNS == 8 && kG > 1) {
    if (backward_variant() == ScanBackwardVariant::shared_sums)
      return &scan_backward_chan_kernel<dev_t<T>, kNS, kG, kT, true>;
    if (backward_variant() == ScanBackwardVariant::shared_whole_chunks)
      return &scan_backward_chan_kernel<dev_t<T>, kNS, kG, kT, true, true>;
    if (backward_variant() == ScanBackwardVariant::spread_steps)
      return &scan_backward_chan_kernel<dev_t<T>, kNS, kG, kT, false, false, true>;
  }
  return &scan_backward_chan_kernel<dev_t<T>, kNS, kG, kT>;
}

// Calls f(kNS, kG, kT) as integral constants for chan_shape(N, op, kBackward). Only the pass's
// own shapes are instantiated: the forward's 16 states a thread above d_state 8, the backward's 8.
template <bool kBackward, class F>
void with_chan(int N, const char* op, F&& f) {
  using std::integral_constant;
  using One = integral_constant<int, 1>;
  using Two = integral_constant<int, 2>;
  using Four = integral_constant<int, 4>;
  using Eight = integral_constant<int, 8>;
  using Sixteen = integral_constant<int, 16>;
  const ChanShape c = chan_shape(N, op, kBackward);
  if (c.ns == 4) return f(Four{}, One{}, Eight{});
  if (c.ns == 8 && c.g == 1) return f(Eight{}, One{}, Eight{});
  if constexpr (kBackward) {
    if (c.g == 2) return f(Eight{}, Two{}, Four{});
    return f(Eight{}, Four{}, Four{});
  } else {
    if (c.g == 1) return f(Sixteen{}, One{}, Four{});
    return f(Sixteen{}, Two{}, Four{});
  }
}

int chan_tiles(int D, const ChanShape& c) {
  const int per_block = kChanThreads / c.g;
  return (D + per_block - 1) / per_block;
}

struct WorkspaceLayout {
  size_t chunk_states, dA, dD, dbias, dB, dC, total;  // offsets in floats
  WorkspaceLayout(int B, int L, int D, int N) {
    const ChanShape c = chan_shape(N, "selective_scan_backward", true);
    const size_t nchunk = size_t((L + c.t - 1) / c.t);
    const size_t tiles = size_t(chan_tiles(D, c));
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
void Kernels::selective_scan_forward(const T* u, const T* delta, const float* A, const T* Bm,
                                     const T* Cm, const float* Dskip, const T* z,
                                     const float* delta_bias, bool delta_softplus,
                                     const float* initial_state, T* out, bfloat16* out_bf,
                                     float* last_state, float* chunk_states, int B, int L, int D,
                                     int N, cudaStream_t stream, int ldbc, int z_ld, bool a_log,
                                     const T* dt, const float* dt_w, int dt_rank) {
  const char* op = "selective_scan_forward";
  const ChanShape shape = chan_shape(N, op);
  if (!out && !out_bf)
    throw std::invalid_argument(std::string(op) + ": no output (out and out_bf null)");
  if (dt_w && (dt_rank < 1 || dt_rank > kScanMaxDtRank || !dt))
    throw std::invalid_argument(
        std::string(op) + ": Δ's low-rank form needs dt and a rank in [1, " +
        std::to_string(kScanMaxDtRank) + "], got " + std::to_string(dt_rank));
  if (B <= 0 || L <= 0 || D <= 0) return;
  auto a =
      make_args(u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, L, D, N, ldbc, z_ld);
  a.h0 = initial_state;
  a.a_log = a_log;
  if (dt_w) {
    a.dt = dev(dt);
    a.dt_w = dt_w;
    a.R = dt_rank;
  }
  const int save_every = chan_shape(N, op, true).t;
  with_chan<false>(N, op, [&](auto ns, auto g, auto) {
    constexpr int kNS = decltype(ns)::value, kG = decltype(g)::value;
    const auto kernel = dt_w ? &scan_forward_chan_kernel<dev_t<T>, kNS, kG, true>
                        : scan_forward_lean()
                            ? &scan_forward_chan_kernel<dev_t<T>, kNS, kG, false, true>
                            : &scan_forward_chan_kernel<dev_t<T>, kNS, kG>;
    SLIPSTREAM_LAUNCH_AS("scan_forward_chan_kernel", kernel,
                         dim3(unsigned(chan_tiles(D, shape)), unsigned(B)), dim3(kChanThreads),
                         stream, a, dev(out), dev(out_bf), last_state, chunk_states, save_every);
  });
  check_launch(op);
}

// The workspace's first part, which the backward's pass 1 would fill.
size_t Kernels::selective_scan_chunk_states_bytes(int B, int L, int D, int N) {
  const WorkspaceLayout lay(B, L, D, N);
  return (lay.dA - lay.chunk_states) * sizeof(float);
}

namespace {
bool keeps_states_from_environment() {
  // On since an H100 timed it (2026-11-28: the whole step 1.05x at gpu_standard, 1.08-1.10x at
  // production); SLIPSTREAM_SCAN_FORWARD_STATES=0 turns it off for a process.
  const char* e = std::getenv("SLIPSTREAM_SCAN_FORWARD_STATES");
  return !(e && std::string(e) == "0");
}
bool g_forward_keeps_states = keeps_states_from_environment();

// SLIPSTREAM_SCAN_FORWARD's form: lean, or the default (unset, empty or `default`).
bool& forward_lean_slot() {
  static bool lean = second_form_from_environment("SLIPSTREAM_SCAN_FORWARD", "default", "lean",
                                                  "the scan's forward");
  return lean;
}
}  // namespace

void Kernels::set_scan_forward_lean(bool on) {
  forward_lean_slot() = on;
}
bool Kernels::scan_forward_lean() {
  return forward_lean_slot();
}

void Kernels::set_scan_forward_keeps_states(bool on) {
  g_forward_keeps_states = on;
}
bool Kernels::scan_forward_keeps_states() {
  return g_forward_keeps_states;
}

void Kernels::set_scan_backward_variant(ScanBackwardVariant v) {
  backward_variant_slot() = v;
}
Kernels::ScanBackwardVariant Kernels::scan_backward_variant() {
  return backward_variant();
}

template <class T>
int Kernels::selective_scan_backward_blocks_per_sm(int N) {
  int blocks = 0;
#if !defined(SLIPSTREAM_CUDA_EMULATION)
  with_chan<true>(N, "selective_scan_backward", [&](auto ns, auto g, auto t) {
    const auto kernel =
        backward_kernel<T, decltype(ns)::value, decltype(g)::value, decltype(t)::value>();
    const cudaError_t e =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kChanThreads, 0);
    if (e != cudaSuccess)
      throw std::runtime_error(
          std::string("selective_scan_backward: cudaOccupancyMaxActiveBlocksPerMultiprocessor: ") +
          cudaGetErrorString(e));
  });
#else
  (void)N;
#endif
  return blocks;
}

size_t Kernels::selective_scan_backward_workspace_bytes(int B, int L, int D, int N) {
  return WorkspaceLayout(B, L, D, N).total * sizeof(float);
}

template <class T>
void Kernels::selective_scan_backward(const T* u, const T* delta, const float* A, const T* Bm,
                                      const T* Cm, const float* Dskip, const T* z,
                                      const float* delta_bias, bool delta_softplus,
                                      const float* initial_state, const float* chunk_states,
                                      const T* dout, T* du, T* ddelta, float* dA, T* dBm, T* dCm,
                                      float* dDskip, T* dz, float* ddelta_bias, bfloat16* ddelta_bf,
                                      bfloat16* dz_bf, void* workspace, int B, int L, int D, int N,
                                      cudaStream_t stream, int ldbc, bool a_log, int z_ld) {
  const char* name = "selective_scan_backward";
  const ChanShape shape = chan_shape(N, name, true);
  if (B <= 0 || L <= 0 || D <= 0) return;
  const WorkspaceLayout lay(B, L, D, N);
  float* ws = static_cast<float*>(workspace);
  auto w = zero_filled<ScanGrads>();
  w.chunk_states = ws + lay.chunk_states;
  w.saved = chunk_states;
  w.dA_part = ws + lay.dA;
  w.dD_part = ws + lay.dD;
  w.dbias_part = ws + lay.dbias;
  w.dB_part = ws + lay.dB;
  w.dC_part = ws + lay.dC;
  w.ddelta_bf = dev(ddelta_bf);
  w.dz_bf = z ? dev(dz_bf) : nullptr;
  auto a =
      make_args(u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, L, D, N, ldbc, z_ld);
  a.h0 = initial_state;
  a.a_log = a_log;
  const int tiles = chan_tiles(D, shape);
  with_chan<true>(N, name, [&](auto ns, auto g, auto t) {
    const auto kernel =
        backward_kernel<T, decltype(ns)::value, decltype(g)::value, decltype(t)::value>();
    SLIPSTREAM_LAUNCH_AS("scan_backward_chan_kernel", kernel, dim3(unsigned(tiles), unsigned(B)),
                         dim3(kChanThreads), stream, a, dev(dout), dev(du), dev(ddelta), dev(dz),
                         w);
  });
  check_launch(name);
  const char* op = "selective_scan_backward (partial sums)";
  const size_t bln = size_t(B) * L * N;
  // The five sums: dBm and dCm over the channel tiles (stored), dA, dD and the bias over the batch
  // rows (added); one launch where dBm and dCm are fp32 like the others, else two.
  const size_t ld = size_t(a.ldbc), cols = ld == size_t(N) ? 0 : size_t(N);
  PartialSum<float> dA_sum{w.dA_part, size_t(D) * N, dA};
  if (a_log) {  // dA is A_log's gradient: the sum times A = −exp(A_log) (the chain rule)
    dA_sum.scale = A;
    dA_sum.scale_neg_exp = true;
  }
  const PartialSum<float> dD_sum{w.dD_part, size_t(D), Dskip ? dDskip : nullptr};
  const PartialSum<float> dbias_sum{w.dbias_part, size_t(D), delta_bias ? ddelta_bias : nullptr};
  if constexpr (std::is_same_v<dev_t<T>, float>) {
    sum_partials_group<float>({{w.dB_part, bln, dBm, cols, ld, nullptr, tiles, 0},
                               {w.dC_part, bln, dCm, cols, ld, nullptr, tiles, 0},
                               dA_sum,
                               dD_sum,
                               dbias_sum},
                              B, true, stream, op);
  } else {
    sum_partials_group<dev_t<T>>(
        {{w.dB_part, bln, dev(dBm), cols, ld}, {w.dC_part, bln, dev(dCm), cols, ld}}, tiles, false,
        stream, op);
    sum_partials_group<float>({dA_sum, dD_sum, dbias_sum}, B, true, stream, op);
  }
}

template <class T>
void Kernels::selective_scan_step(float* state, const T* u, const T* delta, const float* A,
                                  const T* Bm, const T* Cm, const float* Dskip, const T* z,
                                  const float* delta_bias, bool delta_softplus, T* out, int B,
                                  int D, int N, cudaStream_t stream) {
  const int lanes = lanes_for(N, "selective_scan_step");
  if (B <= 0 || D <= 0) return;
  const auto a = make_args(u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, 1, D, N);
  with_lanes(lanes, [&](auto kl) {
    constexpr int kLanes = decltype(kl)::value;
    const auto kernel = &scan_step_kernel<dev_t<T>, kLanes>;
    SLIPSTREAM_LAUNCH_AS("scan_step_kernel", kernel,
                         dim3(unsigned(tiles_for(D, kLanes)), unsigned(B)), dim3(kScanWarps * 32),
                         stream, a, state, dev(out));
  });
  check_launch("selective_scan_step");
}

#define INSTANTIATE(T)                                                                            \
  template void Kernels::selective_scan_forward<T>(                                               \
      const T*, const T*, const float*, const T*, const T*, const float*, const T*, const float*, \
      bool, const float*, T*, bfloat16*, float*, float*, int, int, int, int, cudaStream_t, int,   \
      int, bool, const T*, const float*, int);                                                    \
  template void Kernels::selective_scan_backward<T>(                                              \
      const T*, const T*, const float*, const T*, const T*, const float*, const T*, const float*, \
      bool, const float*, const float*, const T*, T*, T*, float*, T*, T*, float*, T*, float*,     \
      bfloat16*, bfloat16*, void*, int, int, int, int, cudaStream_t, int, bool, int);             \
  template int Kernels::selective_scan_backward_blocks_per_sm<T>(int);                            \
  template void Kernels::selective_scan_step<T>(                                                  \
      float*, const T*, const T*, const float*, const T*, const T*, const float*, const T*,       \
      const float*, bool, T*, int, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bfloat16)
#undef INSTANTIATE

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
