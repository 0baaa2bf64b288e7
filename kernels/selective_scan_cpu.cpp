// Selective scan on the CPU. One work item is (batch b, block of up to 16 channels); the time
// loop is sequential. The float path is compiled once per x86-64 level (generic, AVX2, AVX-512)
// and chosen at run time. At AVX2 and AVX-512 a vector's lanes are channels (the block in
// sub-blocks of the vector's width, one vector a state: no sum across lanes but dBm's and dCm's);
// below AVX2, and for double (the gradient checks' type), the state dimension n is the lane and
// a block's h (16 x N) lives on the stack. exp(dt A), the softplus of dt and the gates' sigmoids,
// the dominant cost, are vector calls at the level (kernels/vector_math.h: SLEEF).
#include "kernels/selective_scan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "kernels/activations.h"
#include "kernels/parallel.h"
#include "kernels/vector_math.h"

namespace slipstream::kernels {

namespace {

constexpr int kDB = kScanChannelBlock;

template <class T>
struct ScanArgs {
  const T *u, *delta, *A, *Bm, *Cm, *Dskip, *z, *delta_bias;
  bool softplus;
  const T* h0;  // (B, D, N) state before the first step, or null: zero
  int B, L, D, N;
};

// The math of one float level (VecMathGeneric/Avx2/Avx512, vector_math.h), or libm's for
// double (the gradient checks' type).
struct MathScalar {
  template <class T>
  static void exp_scaled_rows(const T* a, const T* s, T* out, int rows, int N) {
    for (int i = 0; i < rows; ++i)
      for (int n = 0; n < N; ++n) out[i * N + n] = std::exp(s[i] * a[i * N + n]);
  }
  template <class T>
  static void softplus(const T* x, T* y, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = softplus_scalar(x[i]);
  }
  template <class T>
  static void sigmoid(const T* x, T* y, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = sigmoid_scalar(x[i]);
  }
};

// h = e h + dtu B over the N states of one channel; returns C·h (the scan's y before D u).
template <class T>
__attribute__((always_inline)) inline T update_state(T* h, const T* e, T dtu, const T* Bt,
                                                     const T* Ct, int N) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int n = 0; n < N; ++n) {
    h[n] = e[n] * h[n] + dtu * Bt[n];
    acc += h[n] * Ct[n];
  }
  return acc;
}

template <class T>
__attribute__((always_inline)) inline T delta_raw(const ScanArgs<T>& a, size_t idx, int d) {
  return a.delta[idx] + (a.delta_bias ? a.delta_bias[d] : T(0));
}

// What the backward's recomputation of one item keeps, per time step: every h_t and
// exp(dt A) (L, kDB, N); the pre-gate y, dt, sigmoid(z) and softplus'(delta + bias) (L, kDB).
template <class T>
struct Recomputed {
  T *states, *aexp, *ypre, *dts, *zsig, *dsoft;
};

// Forward scan of one item into `out`, or (rec given) into the backward's scratch. M is the
// float level's math (or MathScalar); the per-row exp, softplus and gates go through it.
template <class T, class M>
__attribute__((always_inline)) inline void scan_item(const ScanArgs<T>& a, int b, int d0, int w,
                                                     T* out, T* last_state,
                                                     const Recomputed<T>* rec) {
  const int L = a.L, D = a.D, N = a.N;
  T h[kDB * kScanMaxState];
  T ea[kDB * kScanMaxState];
  T dt[kDB], y[kDB], gate[kDB];
  if (a.h0)
    std::copy(a.h0 + (size_t(b) * D + d0) * N, a.h0 + (size_t(b) * D + d0 + w) * N, h);
  else
    std::fill(h, h + w * N, T(0));
  for (int t = 0; t < L; ++t) {
    const size_t row = size_t(b) * L + t;
    const T* ut = a.u + row * D + d0;
    const T* zt = a.z ? a.z + row * D + d0 : nullptr;
    const T* Bt = a.Bm + row * N;
    const T* Ct = a.Cm + row * N;
    for (int i = 0; i < w; ++i) dt[i] = delta_raw(a, row * D + d0 + i, d0 + i);
    if (a.softplus) {
      if (rec) {  // softplus'(x) = sigmoid(x), 1 above the threshold
        T* ds = rec->dsoft + size_t(t) * kDB;
        M::sigmoid(dt, ds, size_t(w));
        for (int i = 0; i < w; ++i)
          if (dt[i] > T(kSoftplusThreshold)) ds[i] = T(1);
      }
      M::softplus(dt, dt, size_t(w));
    }
    T* ear = ea;
    if (rec) {
      std::copy(dt, dt + w, rec->dts + size_t(t) * kDB);
      ear = rec->aexp + size_t(t) * kDB * N;
    }
    M::exp_scaled_rows(a.A + size_t(d0) * N, dt, ear, w, N);
    for (int i = 0; i < w; ++i)
      y[i] = update_state(h + i * N, ear + i * N, dt[i] * ut[i], Bt, Ct, N) +
             (a.Dskip ? a.Dskip[d0 + i] * ut[i] : T(0));
    if (rec) {
      std::copy(y, y + w, rec->ypre + size_t(t) * kDB);
      if (zt) M::sigmoid(zt, rec->zsig + size_t(t) * kDB, size_t(w));
      std::copy(h, h + w * N, rec->states + size_t(t) * kDB * N);
    }
    if (out) {
      T* o = out + row * D + d0;
      if (zt) {
        M::sigmoid(zt, gate, size_t(w));  // y * silu(z) = y * z * sigmoid(z)
        for (int i = 0; i < w; ++i) o[i] = y[i] * (zt[i] * gate[i]);
      } else {
        std::copy(y, y + w, o);
      }
    }
  }
  if (last_state)
    for (int i = 0; i < w; ++i)
      std::copy(h + i * N, h + (i + 1) * N, last_state + (size_t(b) * D + d0 + i) * N);
}

struct BwdOut {
  const void* dout;
  void *du, *ddelta, *dz, *dA_part, *dD_part, *dbias_part, *dB_part, *dC_part;
};

// Backward of one item: recompute the states into scratch, then run the adjoint recurrence
// g_t = dy_t C_t + exp(dt_{t+1} A) g_{t+1} backwards in time.
template <class T, class M>
__attribute__((always_inline)) inline void scan_item_backward(const ScanArgs<T>& a, const BwdOut& o,
                                                              T* scratch, int b, int blk, int d0,
                                                              int w) {
  const int L = a.L, D = a.D, N = a.N, B = a.B;
  const size_t lbn = size_t(L) * kDB * N, lb = size_t(L) * kDB;
  const Recomputed<T> rec{scratch,
                          scratch + lbn,
                          scratch + 2 * lbn,
                          scratch + 2 * lbn + lb,
                          scratch + 2 * lbn + 2 * lb,
                          scratch + 2 * lbn + 3 * lb};
  scan_item<T, M>(a, b, d0, w, nullptr, nullptr, &rec);
  const T *Hs = rec.states, *As = rec.aexp, *Ys = rec.ypre, *Dts = rec.dts;

  const T* dout = static_cast<const T*>(o.dout);
  T* du = static_cast<T*>(o.du);
  T* ddelta = static_cast<T*>(o.ddelta);
  T* dz = static_cast<T*>(o.dz);
  T g[kDB * kScanMaxState];
  T dAl[kDB * kScanMaxState];
  T zeros[kScanMaxState];
  T dDl[kDB], dbl[kDB];
  std::fill(g, g + w * N, T(0));
  std::fill(dAl, dAl + w * N, T(0));
  std::fill(zeros, zeros + N, T(0));
  const T* h_first = a.h0 ? a.h0 + (size_t(b) * D + d0) * N : nullptr;  // h before step 0
  std::fill(dDl, dDl + w, T(0));
  std::fill(dbl, dbl + w, T(0));
  T* dBp = static_cast<T*>(o.dB_part) + (size_t(blk) * B + b) * L * N;
  T* dCp = static_cast<T*>(o.dC_part) + (size_t(blk) * B + b) * L * N;
  for (int t = L - 1; t >= 0; --t) {
    const size_t row = size_t(b) * L + t;
    const T* Bt = a.Bm + row * N;
    const T* Ct = a.Cm + row * N;
    T* dBt = dBp + size_t(t) * N;
    T* dCt = dCp + size_t(t) * N;
    std::fill(dBt, dBt + N, T(0));
    std::fill(dCt, dCt + N, T(0));
    for (int i = 0; i < w; ++i) {
      const int d = d0 + i;
      const size_t idx = row * D + d;
      const T dtv = Dts[t * kDB + i];
      const T uu = a.u[idx];
      const T go = dout[idx];
      T dy = go;
      if (a.z) {  // silu(z) = z s, silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)
        const T zz = a.z[idx], sz = rec.zsig[t * kDB + i];
        dy = go * (zz * sz);
        if (dz) dz[idx] = go * Ys[t * kDB + i] * (sz * (T(1) + zz * (T(1) - sz)));
      }
      T du_acc = 0;
      if (a.Dskip) {
        dDl[i] += dy * uu;
        du_acc = dy * a.Dskip[d];
      }
      const T* hr = Hs + size_t(t) * kDB * N + i * N;
      const T* hp = t > 0     ? Hs + size_t(t - 1) * kDB * N + i * N
                    : h_first ? h_first + size_t(i) * N
                              : zeros;
      const T* er = As + size_t(t) * kDB * N + i * N;
      const T* Ar = a.A + size_t(d) * N;
      T* gr = g + i * N;
      T* dAr = dAl + i * N;
      const T dtu = dtv * uu;
      T ddt = 0, dus = 0;
#pragma omp simd reduction(+ : ddt, dus)
      for (int n = 0; n < N; ++n) {
        const T gn = gr[n] + dy * Ct[n];
        dCt[n] += dy * hr[n];
        const T da = gn * hp[n] * er[n];  // d loss / d (dt A)
        dAr[n] += da * dtv;
        ddt += da * Ar[n] + gn * Bt[n] * uu;
        dBt[n] += gn * dtu;
        dus += gn * Bt[n];
        gr[n] = er[n] * gn;
      }
      du[idx] = du_acc + dus * dtv;
      const T dd = a.softplus ? ddt * rec.dsoft[t * kDB + i] : ddt;
      ddelta[idx] = dd;
      dbl[i] += dd;
    }
  }
  T* dA_part = static_cast<T*>(o.dA_part);
  for (int i = 0; i < w; ++i) {
    std::copy(dAl + i * N, dAl + (i + 1) * N, dA_part + (size_t(b) * D + d0 + i) * N);
    static_cast<T*>(o.dD_part)[size_t(b) * D + d0 + i] = dDl[i];
    static_cast<T*>(o.dbias_part)[size_t(b) * D + d0 + i] = dbl[i];
  }
}

// Item ranges, compiled twice for float: baseline ISA and AVX-512.
template <class T, class M>
__attribute__((always_inline)) inline void fwd_range(const ScanArgs<T>& a, T* out, T* last,
                                                     size_t i0, size_t i1) {
  const int nblk = (a.D + kDB - 1) / kDB;
  for (size_t it = i0; it < i1; ++it) {
    const int b = int(it / nblk), d0 = int(it % nblk) * kDB;
    scan_item<T, M>(a, b, d0, std::min(kDB, a.D - d0), out, last, nullptr);
  }
}

template <class T, class M>
__attribute__((always_inline)) inline void bwd_range(const ScanArgs<T>& a, const BwdOut& o,
                                                     T* scratch, size_t i0, size_t i1) {
  const int nblk = (a.D + kDB - 1) / kDB;
  for (size_t it = i0; it < i1; ++it) {
    const int b = int(it / nblk), blk = int(it % nblk), d0 = blk * kDB;
    scan_item_backward<T, M>(a, o, scratch, b, blk, d0, std::min(kDB, a.D - d0));
  }
}

// ---- The float path: a vector's lanes are channels ----
//
// At AVX2 and AVX-512 an item's channels go through in sub-blocks of the level's vector width W
// (8 or 16), lane i being channel d0 + i: the loops over the N states hold one vector a state,
// so the recurrence, y, dΔ and du sum nothing across lanes (the form above, a state a lane, sums
// every channel-step's y, dΔ and du across its lanes). The sums across channels are dBm's and
// dCm's, W states at a time by a fixed tree of shuffles (sum_lanes_each). Float only: double (the
// gradient checks' type) and the generic level keep the form above, so the float tests compare
// two forms.

template <int W>
struct LanesOf {
  typedef float type __attribute__((vector_size(W * sizeof(float)), __may_alias__));
  typedef int index __attribute__((vector_size(W * sizeof(int))));
};
template <int W>
using Lanes = typename LanesOf<W>::type;

// Vectors go by reference: a vector argument or result of a function compiled without the
// level's target would change its ABI (-Wpsabi), and these are inlined into each level's.
template <int W>
__attribute__((always_inline)) inline void load_lanes(Lanes<W>& v, const float* p, int w) {
  if (w == W) {
    __builtin_memcpy(&v, p, sizeof v);
    return;
  }
  v = Lanes<W>{};
  for (int i = 0; i < w; ++i) v[i] = p[i];
}
template <int W>
__attribute__((always_inline)) inline void store_lanes(float* p, const Lanes<W>& v, int w) {
  if (w == W) {
    __builtin_memcpy(p, &v, sizeof v);
    return;
  }
  for (int i = 0; i < w; ++i) p[i] = v[i];
}

// The tree's shuffles. Round S (W/2, ..., 1) pairs vectors a, b into one whose groups of S
// lanes hold, in turn, a's and b's groups of 2S lanes with their halves added; after the last
// round vector n's sum sits in lane bitreverse(n).
constexpr int tree_lane(int W, int S, bool high, int p) {
  return (p / S % 2 ? W : 0) + p / S / 2 * 2 * S + p % S + (high ? S : 0);
}
constexpr int bit_reverse(int W, int p) {
  int r = 0;
  for (int b = 1; b < W; b *= 2, p /= 2) r = r * 2 + p % 2;
  return r;
}
template <int W, class Seq = std::make_integer_sequence<int, W>>
struct TreeMasks;
template <int W, int... P>
struct TreeMasks<W, std::integer_sequence<int, P...>> {
  using Index = typename LanesOf<W>::index;
  template <int S, bool High>
  static constexpr Index round = {tree_lane(W, S, High, P)...};
  static constexpr Index reversed = {bit_reverse(W, P)...};
};

// out[n] = the sum of v[n]'s lanes, n < W, each by the same fixed tree; v is overwritten.
template <int W, int S = W / 2>
__attribute__((always_inline)) inline void sum_lanes_each(Lanes<W>* v, Lanes<W>& out) {
  using Masks = TreeMasks<W>;
  constexpr typename Masks::Index low = Masks::template round<S, false>;
  constexpr typename Masks::Index high = Masks::template round<S, true>;
  for (int j = 0; j < S; ++j)
    v[j] = __builtin_shuffle(v[2 * j], v[2 * j + 1], low) +
           __builtin_shuffle(v[2 * j], v[2 * j + 1], high);
  if constexpr (S > 1) {
    sum_lanes_each<W, S / 2>(v, out);
  } else {
    constexpr typename Masks::Index reversed = Masks::reversed;
    out = __builtin_shuffle(v[0], reversed);
  }
}

// w rows of N (a (B, D, N) state's, or A's (D, N)) as N vectors of w lanes (the rest 0), and
// back.
template <int W>
__attribute__((always_inline)) inline void rows_to_lanes(Lanes<W>* h, const float* rows, int w,
                                                         int N) {
  for (int n = 0; n < N; ++n) {
    h[n] = Lanes<W>{};
    for (int i = 0; i < w; ++i) h[n][i] = rows[size_t(i) * N + n];
  }
}
template <int W>
__attribute__((always_inline)) inline void lanes_to_rows(float* rows, const Lanes<W>* h, int w,
                                                         int N) {
  for (int i = 0; i < w; ++i)
    for (int n = 0; n < N; ++n) rows[size_t(i) * N + n] = h[n][i];
}

// What the backward's recomputation of a sub-block keeps: per step, every state and exp(dt A)
// (L, N vectors), and dt, the pre-gate y, sigmoid(z) and softplus'(delta + bias) (L vectors).
template <int W>
struct LanesRecomputed {
  Lanes<W>*states, *aexp, *dts, *ypre, *zsig, *dsoft;
  LanesRecomputed(float* scratch, int L, int N) {
    states = reinterpret_cast<Lanes<W>*>(scratch);
    aexp = states + size_t(L) * N;
    dts = aexp + size_t(L) * N;
    ypre = dts + L;
    zsig = ypre + L;
    dsoft = zsig + L;
  }
};

// The level's math on one vector, in place.
template <class M, int W>
__attribute__((always_inline)) inline void softplus_lanes(Lanes<W>& v) {
  M::softplus(reinterpret_cast<float*>(&v), reinterpret_cast<float*>(&v), W);
}
template <class M, int W>
__attribute__((always_inline)) inline void sigmoid_lanes(const Lanes<W>& x, Lanes<W>& y) {
  M::sigmoid(reinterpret_cast<const float*>(&x), reinterpret_cast<float*>(&y), W);
}

// Forward scan of channels d0 .. d0 + w - 1 (w <= W) of row b into `out`, or (rec given) into
// the backward's scratch.
template <int W, class M>
__attribute__((always_inline)) inline void scan_lanes(const ScanArgs<float>& a, int b, int d0,
                                                      int w, float* out, float* last_state,
                                                      const LanesRecomputed<W>* rec) {
  const int L = a.L, D = a.D, N = a.N;
  Lanes<W> At[kScanMaxState], h[kScanMaxState], ea[kScanMaxState];
  rows_to_lanes<W>(At, a.A + size_t(d0) * N, w, N);
  if (a.h0)
    rows_to_lanes<W>(h, a.h0 + (size_t(b) * D + d0) * N, w, N);
  else
    for (int n = 0; n < N; ++n) h[n] = Lanes<W>{};
  Lanes<W> bias{}, dskip{};
  if (a.delta_bias) load_lanes<W>(bias, a.delta_bias + d0, w);
  if (a.Dskip) load_lanes<W>(dskip, a.Dskip + d0, w);
  for (int t = 0; t < L; ++t) {
    const size_t row = size_t(b) * L + t, at = row * D + d0;
    Lanes<W> u, dt;
    load_lanes<W>(u, a.u + at, w);
    load_lanes<W>(dt, a.delta + at, w);
    dt += bias;
    if (a.softplus) {
      if (rec) {  // softplus'(x) = sigmoid(x), 1 above the threshold
        Lanes<W>& ds = rec->dsoft[t];
        sigmoid_lanes<M, W>(dt, ds);
        for (int i = 0; i < W; ++i)
          if (dt[i] > float(kSoftplusThreshold)) ds[i] = 1.0f;
      }
      softplus_lanes<M, W>(dt);
    }
    Lanes<W>* e = rec ? rec->aexp + size_t(t) * N : ea;
    for (int n = 0; n < N; ++n) e[n] = dt * At[n];
    M::exp(reinterpret_cast<const float*>(e), reinterpret_cast<float*>(e), size_t(N) * W);
    const float* Bt = a.Bm + row * N;
    const float* Ct = a.Cm + row * N;
    const Lanes<W> dtu = dt * u;
    // y in two running sums: two dependent chains of N / 2 multiply-adds.
    Lanes<W> y0 = dskip * u, y1{};
    int n = 0;
    for (; n + 2 <= N; n += 2) {
      h[n] = e[n] * h[n] + dtu * Bt[n];
      h[n + 1] = e[n + 1] * h[n + 1] + dtu * Bt[n + 1];
      y0 += h[n] * Ct[n];
      y1 += h[n + 1] * Ct[n + 1];
    }
    if (n < N) {
      h[n] = e[n] * h[n] + dtu * Bt[n];
      y0 += h[n] * Ct[n];
    }
    const Lanes<W> y = y0 + y1;
    Lanes<W> z{}, gate{};
    if (a.z) {
      load_lanes<W>(z, a.z + at, w);
      sigmoid_lanes<M, W>(z, gate);
    }
    if (rec) {
      rec->dts[t] = dt;
      rec->ypre[t] = y;
      rec->zsig[t] = gate;
      for (int k = 0; k < N; ++k) rec->states[size_t(t) * N + k] = h[k];
    }
    if (out) {
      const Lanes<W> o = a.z ? y * (z * gate) : y;  // y * silu(z) = y * z * sigmoid(z)
      store_lanes<W>(out + at, o, w);
    }
  }
  if (last_state) lanes_to_rows<W>(last_state + (size_t(b) * D + d0) * N, h, w, N);
}

// Backward of channels d0 .. d0 + w - 1 (w <= W) of row b, the block `blk`'s sub-block from
// d0: recompute the states into scratch, then run the adjoint recurrence
// g_t = dy_t C_t + exp(dt_{t+1} A) g_{t+1} backwards in time. The block's dBm and dCm partial
// rows are written by its first sub-block and added to by the others.
template <int W, class M>
__attribute__((always_inline)) inline void scan_lanes_backward(const ScanArgs<float>& a,
                                                               const BwdOut& o, float* scratch,
                                                               int b, int blk, int d0, int w,
                                                               bool first_in_block) {
  const int L = a.L, D = a.D, N = a.N, B = a.B;
  const LanesRecomputed<W> rec(scratch, L, N);
  scan_lanes<W, M>(a, b, d0, w, nullptr, nullptr, &rec);

  Lanes<W> At[kScanMaxState], g[kScanMaxState], dA[kScanMaxState], h_first[kScanMaxState];
  rows_to_lanes<W>(At, a.A + size_t(d0) * N, w, N);
  for (int n = 0; n < N; ++n) g[n] = dA[n] = Lanes<W>{};
  if (a.h0)
    rows_to_lanes<W>(h_first, a.h0 + (size_t(b) * D + d0) * N, w, N);
  else
    for (int n = 0; n < N; ++n) h_first[n] = Lanes<W>{};
  Lanes<W> dskip{}, dD{}, dbias{};
  if (a.Dskip) load_lanes<W>(dskip, a.Dskip + d0, w);
  float* du = static_cast<float*>(o.du);
  float* ddelta = static_cast<float*>(o.ddelta);
  float* dz = static_cast<float*>(o.dz);
  float* dBp = static_cast<float*>(o.dB_part) + (size_t(blk) * B + b) * L * N;
  float* dCp = static_cast<float*>(o.dC_part) + (size_t(blk) * B + b) * L * N;
  Lanes<W> terms_b[W], terms_c[W];
  for (int t = L - 1; t >= 0; --t) {
    const size_t row = size_t(b) * L + t, at = row * D + d0;
    const float* Bt = a.Bm + row * N;
    const float* Ct = a.Cm + row * N;
    Lanes<W> u, dy;
    load_lanes<W>(u, a.u + at, w);
    load_lanes<W>(dy, static_cast<const float*>(o.dout) + at, w);
    if (a.z) {  // silu(z) = z s, silu'(z) = s (1 + z (1 - s)), s = sigmoid(z)
      Lanes<W> z;
      load_lanes<W>(z, a.z + at, w);
      const Lanes<W> sz = rec.zsig[t];
      if (dz) store_lanes<W>(dz + at, dy * rec.ypre[t] * (sz * (1.0f + z * (1.0f - sz))), w);
      dy *= z * sz;
    }
    dD += dy * u;
    const Lanes<W> dt = rec.dts[t], dtu = dt * u;
    const Lanes<W>* hr = rec.states + size_t(t) * N;
    const Lanes<W>* hp = t > 0 ? rec.states + size_t(t - 1) * N : h_first;
    const Lanes<W>* er = rec.aexp + size_t(t) * N;
    float* dBt = dBp + size_t(t) * N;
    float* dCt = dCp + size_t(t) * N;
    Lanes<W> ddt_a{}, dus{};  // sums over n of d loss / d (dt A) times A, and of g B
    for (int n0 = 0; n0 < N; n0 += W) {
      const int nw = std::min(W, N - n0);
      for (int j = 0; j < nw; ++j) {
        const int n = n0 + j;
        const Lanes<W> gn = g[n] + dy * Ct[n];
        terms_c[j] = dy * hr[n];
        const Lanes<W> da = gn * hp[n] * er[n];  // d loss / d (dt A)
        dA[n] += da * dt;
        ddt_a += da * At[n];
        dus += gn * Bt[n];
        terms_b[j] = gn * dtu;
        g[n] = er[n] * gn;
      }
      for (int j = nw; j < W; ++j) terms_b[j] = terms_c[j] = Lanes<W>{};
      Lanes<W> sb, sc;
      sum_lanes_each<W>(terms_b, sb);
      sum_lanes_each<W>(terms_c, sc);
      for (int j = 0; j < nw; ++j) {
        dBt[n0 + j] = first_in_block ? sb[j] : dBt[n0 + j] + sb[j];
        dCt[n0 + j] = first_in_block ? sc[j] : dCt[n0 + j] + sc[j];
      }
    }
    store_lanes<W>(du + at, (a.Dskip ? dy * dskip : Lanes<W>{}) + dus * dt, w);
    Lanes<W> dd = ddt_a + dus * u;
    if (a.softplus) dd *= rec.dsoft[t];
    store_lanes<W>(ddelta + at, dd, w);
    dbias += dd;
  }
  lanes_to_rows<W>(static_cast<float*>(o.dA_part) + (size_t(b) * D + d0) * N, dA, w, N);
  const size_t bd = size_t(b) * D + d0;
  store_lanes<W>(static_cast<float*>(o.dD_part) + bd, a.Dskip ? dD : Lanes<W>{}, w);
  store_lanes<W>(static_cast<float*>(o.dbias_part) + bd, dbias, w);
}

// One frame of selective_scan_step for one batch row, a block of channels at a time (as many as
// keep exp(dt A) within 4096 values, so the vector calls are few and long): dt (+ bias,
// softplus), exp(dt A), the state update and the C contraction, the D skip, the SiLU gate. The
// state (B, D, N) keeps a state a lane. With W (float, N a multiple of W) y's sums over the
// states are made W channels at a time by the tree, where W = 0 sums each channel's vector.
template <class T, class M, int W = 0>
__attribute__((always_inline)) inline void step_row(T* state, const T* u, const T* delta,
                                                    const T* A, const T* Bm, const T* Cm,
                                                    const T* Dskip, const T* z, const T* delta_bias,
                                                    bool softplus, T* out, int D, int N) {
  constexpr int kValues = 4096, kMaxBlock = 256;
  const int block =
      W ? std::clamp(kValues / N / W * W, W, kMaxBlock) : std::clamp(kValues / N, 1, kMaxBlock);
  alignas(64) T dt[kMaxBlock], gate[kMaxBlock];
  alignas(64) T ea[kValues];
  for (int d0 = 0; d0 < D; d0 += block) {
    const int w = std::min(block, D - d0);
    for (int i = 0; i < w; ++i) dt[i] = delta[d0 + i] + (delta_bias ? delta_bias[d0 + i] : T(0));
    if (softplus) M::softplus(dt, dt, size_t(w));
    M::exp_scaled_rows(A + size_t(d0) * N, dt, ea, w, N);
    if constexpr (W == 0) {
      for (int i = 0; i < w; ++i) {
        const int d = d0 + i;
        out[d] = update_state(state + size_t(d) * N, ea + i * N, dt[i] * u[d], Bm, Cm, N) +
                 (Dskip ? Dskip[d] * u[d] : T(0));
      }
    } else {
      Lanes<W> sums[W], y;
      for (int g = 0; g < w; g += W) {
        const int wg = std::min(W, w - g);
        for (int i = 0; i < wg; ++i) {
          const int d = d0 + g + i;
          float* h = state + size_t(d) * N;
          const float* e = ea + size_t(g + i) * N;
          const float dtu = dt[g + i] * u[d];
          Lanes<W> acc{};
          for (int n = 0; n < N; n += W) {
            Lanes<W> hv, ev, bv, cv;
            load_lanes<W>(hv, h + n, W);
            load_lanes<W>(ev, e + n, W);
            load_lanes<W>(bv, Bm + n, W);
            load_lanes<W>(cv, Cm + n, W);
            hv = ev * hv + dtu * bv;
            store_lanes<W>(h + n, hv, W);
            acc += hv * cv;
          }
          sums[i] = acc;
        }
        for (int i = wg; i < W; ++i) sums[i] = Lanes<W>{};
        sum_lanes_each<W>(sums, y);
        for (int i = 0; i < wg; ++i) {
          const int d = d0 + g + i;
          out[d] = y[i] + (Dskip ? Dskip[d] * u[d] : 0.0f);
        }
      }
    }
    if (z) {
      M::sigmoid(z + d0, gate, size_t(w));
      for (int i = 0; i < w; ++i) out[d0 + i] *= z[d0 + i] * gate[i];
    }
  }
}

// The float step at AVX2 and AVX-512: y's sums by the tree where N is a multiple of W.
template <int W, class M>
__attribute__((always_inline)) inline void step_row_lanes(float* state, const float* u,
                                                          const float* delta, const float* A,
                                                          const float* Bm, const float* Cm,
                                                          const float* Dskip, const float* z,
                                                          const float* delta_bias, bool softplus,
                                                          float* out, int D, int N) {
  if (N % W == 0)
    step_row<float, M, W>(state, u, delta, A, Bm, Cm, Dskip, z, delta_bias, softplus, out, D, N);
  else
    step_row<float, M>(state, u, delta, A, Bm, Cm, Dskip, z, delta_bias, softplus, out, D, N);
}

// Items of the float path: each block of kDB channels in sub-blocks of W.
template <int W, class M>
__attribute__((always_inline)) inline void fwd_range_lanes(const ScanArgs<float>& a, float* out,
                                                           float* last, size_t i0, size_t i1) {
  const int nblk = (a.D + kDB - 1) / kDB;
  for (size_t it = i0; it < i1; ++it) {
    const int b = int(it / nblk), d0 = int(it % nblk) * kDB, w = std::min(kDB, a.D - d0);
    for (int s = 0; s < w; s += W)
      scan_lanes<W, M>(a, b, d0 + s, std::min(W, w - s), out, last, nullptr);
  }
}

template <int W, class M>
__attribute__((always_inline)) inline void bwd_range_lanes(const ScanArgs<float>& a,
                                                           const BwdOut& o, float* scratch,
                                                           size_t i0, size_t i1) {
  const int nblk = (a.D + kDB - 1) / kDB;
  for (size_t it = i0; it < i1; ++it) {
    const int b = int(it / nblk), blk = int(it % nblk), d0 = blk * kDB;
    const int w = std::min(kDB, a.D - d0);
    for (int s = 0; s < w; s += W)
      scan_lanes_backward<W, M>(a, o, scratch, b, blk, d0 + s, std::min(W, w - s), s == 0);
  }
}

// The float scan compiled once per level: the same templates inlined under each level's
// target, so the loops vectorise at its width and the exp/softplus/sigmoid calls are SLEEF's at
// that width (vector_math.h).
struct FloatScan {
  void (*fwd)(const ScanArgs<float>&, float*, float*, size_t, size_t);
  void (*bwd)(const ScanArgs<float>&, const BwdOut&, float*, size_t, size_t);
  void (*step)(float*, const float*, const float*, const float*, const float*, const float*,
               const float*, const float*, const float*, bool, float*, int, int);
};

// `Fwd` and `Bwd` are the item ranges the level runs: vectors of channels at AVX2 and AVX-512;
// below AVX2 a state a lane (vectors of four channels there took 1.08-1.16x the forward's time).
// `Step` the one-frame step: at AVX2 and AVX-512 y's sums over the states by the tree.
#define SLIPSTREAM_FLOAT_SCAN(level, attributes, Math, Fwd, Bwd, Step)                             \
  attributes void fwd_##level(const ScanArgs<float>& a, float* out, float* last, size_t i0,        \
                              size_t i1) {                                                         \
    Fwd(a, out, last, i0, i1);                                                                     \
  }                                                                                                \
  attributes void bwd_##level(const ScanArgs<float>& a, const BwdOut& o, float* scratch,           \
                              size_t i0, size_t i1) {                                              \
    Bwd(a, o, scratch, i0, i1);                                                                    \
  }                                                                                                \
  attributes void step_##level(float* state, const float* u, const float* delta, const float* A,   \
                               const float* Bm, const float* Cm, const float* Dskip,               \
                               const float* z, const float* delta_bias, bool softplus, float* out, \
                               int D, int N) {                                                     \
    Step(state, u, delta, A, Bm, Cm, Dskip, z, delta_bias, softplus, out, D, N);                   \
  }
SLIPSTREAM_FLOAT_SCAN(generic, , VecMathGeneric, (fwd_range<float, VecMathGeneric>),
                      (bwd_range<float, VecMathGeneric>), (step_row<float, VecMathGeneric>))
SLIPSTREAM_FLOAT_SCAN(avx2, __attribute__((target("avx2,fma"))), VecMathAvx2,
                      (fwd_range_lanes<8, VecMathAvx2>), (bwd_range_lanes<8, VecMathAvx2>),
                      (step_row_lanes<8, VecMathAvx2>))
SLIPSTREAM_FLOAT_SCAN(avx512, __attribute__((target("avx512f,avx512dq,avx512vl,fma"))),
                      VecMathAvx512, (fwd_range_lanes<16, VecMathAvx512>),
                      (bwd_range_lanes<16, VecMathAvx512>), (step_row_lanes<16, VecMathAvx512>))
#undef SLIPSTREAM_FLOAT_SCAN

const FloatScan& float_scan() {
  static const FloatScan scan = [] {
    switch (cpu_isa()) {
      case CpuIsa::avx512:
        return FloatScan{fwd_avx512, bwd_avx512, step_avx512};
      case CpuIsa::avx2:
        return FloatScan{fwd_avx2, bwd_avx2, step_avx2};
      case CpuIsa::generic:
        break;
    }
    return FloatScan{fwd_generic, bwd_generic, step_generic};
  }();
  return scan;
}

template <class T>
constexpr bool kIsFloat = std::is_same_v<T, float>;

void check_state(int N) {
  if (N < 1 || N > kScanMaxState) throw std::invalid_argument("selective_scan: bad d_state");
}

// The scratch starts on a 64-byte boundary (the float path's vectors are read from it as such;
// a slot is a whole number of vectors): the workspace holds kScratchAlign elements more.
constexpr size_t kScratchAlign = 64;
template <class T>
T* aligned_scratch(T* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  return reinterpret_cast<T*>((at + 63) & ~std::uintptr_t(63));
}

int slots_for(size_t items) {
  return int(std::min<size_t>(kScanSlots, items));
}

}  // namespace

template <class T>
void selective_scan_forward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                            const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                            const T* initial_state, T* out, T* last_state, int B, int L, int D,
                            int N) {
  check_state(N);
  const ScanArgs<T> a{u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, initial_state,
                      B, L,     D, N};
  const size_t items = size_t(B) * ((D + kDB - 1) / kDB);
  parallel_blocks(items, size_t(L) * kDB * N * 4, [&](size_t i0, size_t i1) {
    if constexpr (kIsFloat<T>) {
      float_scan().fwd(a, out, last_state, i0, i1);
    } else {
      fwd_range<T, MathScalar>(a, out, last_state, i0, i1);
    }
  });
}

size_t selective_scan_backward_workspace_elems(int B, int L, int D, int N) {
  const size_t nblk = (D + kDB - 1) / kDB;
  const size_t slot = 2 * size_t(L) * kDB * N + 4 * size_t(L) * kDB;
  return slots_for(size_t(B) * nblk) * slot + size_t(B) * D * N + 2 * size_t(B) * D +
         2 * nblk * B * L * N + kScratchAlign;
}

template <class T>
void selective_scan_backward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                             const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                             const T* initial_state, const T* dout, T* du, T* ddelta, T* dA, T* dBm,
                             T* dCm, T* dDskip, T* dz, T* ddelta_bias, T* workspace, int B, int L,
                             int D, int N) {
  check_state(N);
  const ScanArgs<T> a{u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, initial_state,
                      B, L,     D, N};
  const size_t nblk = (D + kDB - 1) / kDB;
  const size_t items = size_t(B) * nblk;
  const int slots = slots_for(items);
  T* dA_part = workspace;                                    // (B, D, N)
  T* dD_part = dA_part + size_t(B) * D * N;                  // (B, D)
  T* dbias_part = dD_part + size_t(B) * D;                   // (B, D)
  T* dB_part = dbias_part + size_t(B) * D;                   // (nblk, B, L, N)
  T* dC_part = dB_part + nblk * B * L * N;                   // (nblk, B, L, N)
  T* scratch = aligned_scratch(dC_part + nblk * B * L * N);  // slots x slot
  const size_t slot = 2 * size_t(L) * kDB * N + 4 * size_t(L) * kDB;
  const BwdOut o{dout, du, ddelta, dz, dA_part, dD_part, dbias_part, dB_part, dC_part};

  // Items are split statically over the slots, each slot owning its scratch.
  parallel_blocks(slots, items / slots * size_t(L) * kDB * N * 8, [&](size_t s0, size_t s1) {
    for (size_t s = s0; s < s1; ++s) {
      const size_t i0 = s * items / slots, i1 = (s + 1) * items / slots;
      if constexpr (kIsFloat<T>) {
        float_scan().bwd(a, o, scratch + s * slot, i0, i1);
      } else {
        bwd_range<T, MathScalar>(a, o, scratch + s * slot, i0, i1);
      }
    }
  });

  // Fixed-order reductions of the partials.
  parallel_blocks(size_t(D), size_t(B) * (N + 2), [&](size_t d0, size_t d1) {
    for (size_t d = d0; d < d1; ++d) {
      for (int b = 0; b < B; ++b) {
        if (dA) {
          const T* p = dA_part + (size_t(b) * D + d) * N;
          for (int n = 0; n < N; ++n) dA[d * N + n] += p[n];
        }
        if (dDskip) dDskip[d] += dD_part[size_t(b) * D + d];
        if (ddelta_bias) ddelta_bias[d] += dbias_part[size_t(b) * D + d];
      }
    }
  });
  const size_t bln = size_t(B) * L * N;
  parallel_blocks(size_t(B) * L, nblk * N * 2, [&](size_t r0, size_t r1) {
    for (size_t i = r0 * N; i < r1 * N; ++i) {
      T sb = 0, sc = 0;
      for (size_t k = 0; k < nblk; ++k) {
        sb += dB_part[k * bln + i];
        sc += dC_part[k * bln + i];
      }
      dBm[i] = sb;
      dCm[i] = sc;
    }
  });
}

template <class T>
void selective_scan_step(T* state, const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                         const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                         T* out, int B, int D, int N) {
  check_state(N);
  parallel_blocks(size_t(B), size_t(D) * N * 4, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      const size_t r = b * D;
      T* const st = state + r * N;
      const T* const zr = z ? z + r : nullptr;
      if constexpr (kIsFloat<T>) {
        float_scan().step(st, u + r, delta + r, A, Bm + b * N, Cm + b * N, Dskip, zr, delta_bias,
                          delta_softplus, out + r, D, N);
      } else {
        step_row<T, MathScalar>(st, u + r, delta + r, A, Bm + b * N, Cm + b * N, Dskip, zr,
                                delta_bias, delta_softplus, out + r, D, N);
      }
    }
  });
}

#define INSTANTIATE(T)                                                                          \
  template void selective_scan_step<T>(T*, const T*, const T*, const T*, const T*, const T*,    \
                                       const T*, const T*, const T*, bool, T*, int, int, int);  \
  template void selective_scan_forward<T>(const T*, const T*, const T*, const T*, const T*,     \
                                          const T*, const T*, const T*, bool, const T*, T*, T*, \
                                          int, int, int, int);                                  \
  template void selective_scan_backward<T>(                                                     \
      const T*, const T*, const T*, const T*, const T*, const T*, const T*, const T*, bool,     \
      const T*, const T*, T*, T*, T*, T*, T*, T*, T*, T*, T*, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels
