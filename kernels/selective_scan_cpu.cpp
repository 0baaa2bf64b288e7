// Selective scan on the CPU. One work item is (batch b, block of up to 16 channels); its state
// h (16 x N) lives on the stack. The time loop is sequential; the state dimension n is the
// vector lane. The float path has an AVX-512 build of the same code (chosen at run time) whose
// exp(dt * A), the dominant cost, is a vector polynomial instead of scalar expf.
#include "kernels/selective_scan.h"

// GCC 12 flags the undefined pass-through operand inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "kernels/activations.h"
#include "kernels/parallel.h"

namespace slipstream::kernels {

namespace {

constexpr int kDB = kScanChannelBlock;

template <class T>
struct ScanArgs {
  const T *u, *delta, *A, *Bm, *Cm, *Dskip, *z, *delta_bias;
  bool softplus;
  int B, L, D, N;
};

// out[i, n] = exp(dt[i] * A[i, n]) for i < w, n < N.
struct ExpStd {
  template <class T>
  static void rows(const T* A, const T* dt, T* out, int w, int N) {
    for (int i = 0; i < w * N; ++i) out[i] = std::exp(dt[i / N] * A[i]);
  }
  template <class T>
  static void softplus(T* x, int w) {
    for (int i = 0; i < w; ++i) x[i] = softplus_scalar(x[i]);
  }
};

// Cephes-style expf: 2^k * p(r), r = x - k ln2 split in two constants, p of degree 7. About
// 1 ulp; scalef handles the overflow to inf and underflow to 0; NaN propagates.
__attribute__((target("avx512f,avx512dq,fma"), always_inline)) inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.8f), x);
  x = _mm512_max_ps(_mm512_set1_ps(-103.9f), x);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, k);
}

// Cephes-style logf for positive finite x: mantissa in [sqrt(1/2), sqrt(2)), degree-9
// polynomial. About 1 ulp.
__attribute__((target("avx512f,avx512dq,fma"), always_inline)) inline __m512 log512(__m512 x) {
  __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  __m512 e = _mm512_getexp_ps(x);
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(f, f);
  __m512 y = _mm512_set1_ps(7.0376836292e-2f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.1514610310e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.1676998740e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.2420140846e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.4249322787e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.6668057665e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.0000714765e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-2.4999993993e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(3.3333331174e-1f));
  y = _mm512_mul_ps(_mm512_mul_ps(y, f), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
  y = _mm512_fmadd_ps(z, _mm512_set1_ps(-0.5f), y);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(f, y));
}

// softplus(x) = max(x, 0) + log1p(exp(-|x|)), = x above PyTorch's threshold 20. log1p(y) is
// log(1 + y) * y / ((1 + y) - 1), which cancels the rounding of 1 + y.
__attribute__((target("avx512f,avx512dq,fma"), always_inline)) inline __m512 softplus512(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 y = exp512(_mm512_sub_ps(_mm512_setzero_ps(), ax));
  const __m512 u = _mm512_add_ps(one, y);
  const __m512 um1 = _mm512_sub_ps(u, one);
  const __mmask16 exact = _mm512_cmp_ps_mask(um1, _mm512_setzero_ps(), _CMP_EQ_OQ);
  __m512 l = _mm512_mul_ps(log512(u), _mm512_div_ps(y, _mm512_mask_mov_ps(um1, exact, one)));
  l = _mm512_mask_mov_ps(l, exact, y);
  const __m512 r = _mm512_add_ps(_mm512_max_ps(x, _mm512_setzero_ps()), l);
  const __mmask16 above =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(float(kSoftplusThreshold)), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(r, above, x);
}

struct ExpAvx512 {
  __attribute__((target("avx512f,avx512dq,fma"))) static void softplus(float* x, int w) {
    for (int i = 0; i < w; i += 16) {
      const __mmask16 m = static_cast<__mmask16>(w - i >= 16 ? 0xffffu : (1u << (w - i)) - 1u);
      _mm512_mask_storeu_ps(x + i, m, softplus512(_mm512_maskz_loadu_ps(m, x + i)));
    }
  }
  __attribute__((target("avx512f,avx512dq,fma"))) static void rows(const float* A, const float* dt,
                                                                   float* out, int w, int N) {
    for (int i = 0; i < w; ++i) {
      const __m512 s = _mm512_set1_ps(dt[i]);
      const float* a = A + i * N;
      float* o = out + i * N;
      int n = 0;
      for (; n + 16 <= N; n += 16)
        _mm512_storeu_ps(o + n, exp512(_mm512_mul_ps(s, _mm512_loadu_ps(a + n))));
      if (n < N) {
        const __mmask16 m = static_cast<__mmask16>((1u << (N - n)) - 1u);
        _mm512_mask_storeu_ps(o + n, m, exp512(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, a + n))));
      }
    }
  }
};

bool cpu_has_avx512f() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
}

template <class T>
__attribute__((always_inline)) inline T delta_raw(const ScanArgs<T>& a, size_t idx, int d) {
  return a.delta[idx] + (a.delta_bias ? a.delta_bias[d] : T(0));
}

// Forward scan of one item. When states/aexp/ypre are given (the backward's recomputation)
// every h_t, exp(dt A) and the pre-gate y are stored, (L, kDB, N) and (L, kDB).
template <class T, class Exp>
__attribute__((always_inline)) inline void scan_item(const ScanArgs<T>& a, int b, int d0, int w,
                                                     T* out, T* last_state, T* states, T* aexp,
                                                     T* ypre, T* dts) {
  const int L = a.L, D = a.D, N = a.N;
  T h[kDB * kScanMaxState];
  T ea[kDB * kScanMaxState];
  T dt[kDB];
  std::fill(h, h + w * N, T(0));
  for (int t = 0; t < L; ++t) {
    const size_t row = size_t(b) * L + t;
    const T* ut = a.u + row * D + d0;
    const T* Bt = a.Bm + row * N;
    const T* Ct = a.Cm + row * N;
    for (int i = 0; i < w; ++i) dt[i] = delta_raw(a, row * D + d0 + i, d0 + i);
    if (a.softplus) Exp::softplus(dt, w);
    if (dts) std::copy(dt, dt + w, dts + size_t(t) * kDB);
    T* ear = aexp ? aexp + size_t(t) * kDB * N : ea;
    Exp::rows(a.A + size_t(d0) * N, dt, ear, w, N);
    for (int i = 0; i < w; ++i) {
      T* hr = h + i * N;
      const T* er = ear + i * N;
      const T dtu = dt[i] * ut[i];
      T acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int n = 0; n < N; ++n) {
        hr[n] = er[n] * hr[n] + dtu * Bt[n];
        acc += hr[n] * Ct[n];
      }
      T y = acc + (a.Dskip ? a.Dskip[d0 + i] * ut[i] : T(0));
      if (ypre) ypre[t * kDB + i] = y;
      if (out) {
        if (a.z) y *= silu_scalar(a.z[row * D + d0 + i]);
        out[row * D + d0 + i] = y;
      }
    }
    if (states) std::copy(h, h + w * N, states + size_t(t) * kDB * N);
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
template <class T, class Exp>
__attribute__((always_inline)) inline void scan_item_backward(const ScanArgs<T>& a, const BwdOut& o,
                                                              T* scratch, int b, int blk, int d0,
                                                              int w) {
  const int L = a.L, D = a.D, N = a.N, B = a.B;
  T* Hs = scratch;
  T* As = Hs + size_t(L) * kDB * N;
  T* Ys = As + size_t(L) * kDB * N;
  T* Dts = Ys + size_t(L) * kDB;
  scan_item<T, Exp>(a, b, d0, w, nullptr, nullptr, Hs, As, Ys, Dts);

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
      const T raw = delta_raw(a, idx, d);
      const T dtv = Dts[t * kDB + i];
      const T uu = a.u[idx];
      const T go = dout[idx];
      T dy = go;
      if (a.z) {
        const T zz = a.z[idx];
        dy = go * silu_scalar(zz);
        if (dz) dz[idx] = go * Ys[t * kDB + i] * silu_grad_scalar(zz);
      }
      T du_acc = 0;
      if (a.Dskip) {
        dDl[i] += dy * uu;
        du_acc = dy * a.Dskip[d];
      }
      const T* hr = Hs + size_t(t) * kDB * N + i * N;
      const T* hp = t > 0 ? Hs + size_t(t - 1) * kDB * N + i * N : zeros;
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
      const T dd = a.softplus ? ddt * softplus_grad_scalar(raw) : ddt;
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
template <class T, class Exp>
__attribute__((always_inline)) inline void fwd_range(const ScanArgs<T>& a, T* out, T* last,
                                                     size_t i0, size_t i1) {
  const int nblk = (a.D + kDB - 1) / kDB;
  for (size_t it = i0; it < i1; ++it) {
    const int b = int(it / nblk), d0 = int(it % nblk) * kDB;
    scan_item<T, Exp>(a, b, d0, std::min(kDB, a.D - d0), out, last, (T*)nullptr, (T*)nullptr,
                      (T*)nullptr, (T*)nullptr);
  }
}

template <class T, class Exp>
__attribute__((always_inline)) inline void bwd_range(const ScanArgs<T>& a, const BwdOut& o,
                                                     T* scratch, size_t i0, size_t i1) {
  const int nblk = (a.D + kDB - 1) / kDB;
  for (size_t it = i0; it < i1; ++it) {
    const int b = int(it / nblk), blk = int(it % nblk), d0 = blk * kDB;
    scan_item_backward<T, Exp>(a, o, scratch, b, blk, d0, std::min(kDB, a.D - d0));
  }
}

template <class T>
void fwd_range_generic(const ScanArgs<T>& a, T* out, T* last, size_t i0, size_t i1) {
  fwd_range<T, ExpStd>(a, out, last, i0, i1);
}
template <class T>
void bwd_range_generic(const ScanArgs<T>& a, const BwdOut& o, T* scratch, size_t i0, size_t i1) {
  bwd_range<T, ExpStd>(a, o, scratch, i0, i1);
}
__attribute__((target("avx512f,avx512dq,avx512vl,fma"))) void fwd_range_avx512(
    const ScanArgs<float>& a, float* out, float* last, size_t i0, size_t i1) {
  fwd_range<float, ExpAvx512>(a, out, last, i0, i1);
}
__attribute__((target("avx512f,avx512dq,avx512vl,fma"))) void bwd_range_avx512(
    const ScanArgs<float>& a, const BwdOut& o, float* scratch, size_t i0, size_t i1) {
  bwd_range<float, ExpAvx512>(a, o, scratch, i0, i1);
}

__attribute__((target("avx512f,avx512dq,fma"))) void exp_avx512(const float* x, float* out,
                                                                size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, exp512(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, m, exp512(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// One row of selective_scan_step in float, 16 lanes at a time: Δ and its softplus, exp(Δ·A), the
// state update and the C contraction across the N states, then the D skip and the SiLU gate for
// all channels at once. The scalar loop's contraction is a serial sum the compiler may not
// reorder (most of a batch-1 step's time); here it is 16 partial sums added at the end.
__attribute__((target("avx512f,avx512dq,fma"))) void step_row_avx512(
    float* state, const float* u, const float* delta, const float* A, const float* Bm,
    const float* Cm, const float* Dskip, const float* z, const float* delta_bias,
    bool delta_softplus, float* out, int D, int N) {
  auto lanes = [](int left) {
    return static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
  };
  constexpr int kBlock = 256;  // channels whose Δ is computed at once
  alignas(64) float dts[kBlock];
  for (int d0 = 0; d0 < D; d0 += kBlock) {
    const int nd = std::min(kBlock, D - d0);
    for (int d = 0; d < nd; d += 16) {
      const __mmask16 m = lanes(nd - d);
      __m512 dt = _mm512_maskz_loadu_ps(m, delta + d0 + d);
      if (delta_bias) dt = _mm512_add_ps(dt, _mm512_maskz_loadu_ps(m, delta_bias + d0 + d));
      if (delta_softplus) dt = softplus512(dt);
      _mm512_mask_storeu_ps(dts + d, m, dt);
    }
    for (int d = d0; d < d0 + nd; ++d) {
      const __m512 dt = _mm512_set1_ps(dts[d - d0]), ud = _mm512_set1_ps(u[d]);
      float* h = state + size_t(d) * N;
      const float* a = A + size_t(d) * N;
      __m512 acc = _mm512_setzero_ps();
      for (int n = 0; n < N; n += 16) {
        const __mmask16 m = lanes(N - n);
        const __m512 dA = exp512(_mm512_mul_ps(dt, _mm512_maskz_loadu_ps(m, a + n)));
        const __m512 dBu = _mm512_mul_ps(_mm512_mul_ps(dt, _mm512_maskz_loadu_ps(m, Bm + n)), ud);
        const __m512 hn = _mm512_fmadd_ps(dA, _mm512_maskz_loadu_ps(m, h + n), dBu);
        _mm512_mask_storeu_ps(h + n, m, hn);
        acc = _mm512_fmadd_ps(hn, _mm512_maskz_loadu_ps(m, Cm + n), acc);
      }
      out[d] = _mm512_reduce_add_ps(acc) + (Dskip ? Dskip[d] * u[d] : 0.0f);
    }
  }
  if (!z) return;
  for (int d = 0; d < D; d += 16) {  // y · SiLU(z) = y · z / (1 + exp(-z))
    const __mmask16 m = lanes(D - d);
    const __m512 zv = _mm512_maskz_loadu_ps(m, z + d);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), zv));
    const __m512 gate = _mm512_div_ps(zv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(out + d, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, out + d), gate));
  }
}

template <class T>
constexpr bool kIsFloat = std::is_same_v<T, float>;

void check_state(int N) {
  if (N < 1 || N > kScanMaxState) throw std::invalid_argument("selective_scan: bad d_state");
}

int slots_for(size_t items) {
  return int(std::min<size_t>(kScanSlots, items));
}

}  // namespace

void scan_exp(const float* x, float* out, size_t n) {
  if (cpu_has_avx512f()) {
    exp_avx512(x, out, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = std::exp(x[i]);
  }
}

void scan_softplus(const float* x, float* out, size_t n) {
  std::copy(x, x + n, out);
  for (size_t i = 0; i < n; i += 256) {
    const int w = int(std::min<size_t>(256, n - i));
    if (cpu_has_avx512f()) {
      ExpAvx512::softplus(out + i, w);
    } else {
      ExpStd::softplus(out + i, w);
    }
  }
}

template <class T>
void selective_scan_forward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                            const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                            T* out, T* last_state, int B, int L, int D, int N) {
  check_state(N);
  const ScanArgs<T> a{u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, L, D, N};
  const size_t items = size_t(B) * ((D + kDB - 1) / kDB);
  parallel_blocks(items, size_t(L) * kDB * N * 4, [&](size_t i0, size_t i1) {
    if constexpr (kIsFloat<T>) {
      if (cpu_has_avx512f()) return fwd_range_avx512(a, out, last_state, i0, i1);
    }
    fwd_range_generic(a, out, last_state, i0, i1);
  });
}

size_t selective_scan_backward_workspace_elems(int B, int L, int D, int N) {
  const size_t nblk = (D + kDB - 1) / kDB;
  const size_t slot = 2 * size_t(L) * kDB * N + 2 * size_t(L) * kDB;
  return slots_for(size_t(B) * nblk) * slot + size_t(B) * D * N + 2 * size_t(B) * D +
         2 * nblk * B * L * N;
}

template <class T>
void selective_scan_backward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                             const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                             const T* dout, T* du, T* ddelta, T* dA, T* dBm, T* dCm, T* dDskip,
                             T* dz, T* ddelta_bias, T* workspace, int B, int L, int D, int N) {
  check_state(N);
  const ScanArgs<T> a{u, delta, A, Bm, Cm, Dskip, z, delta_bias, delta_softplus, B, L, D, N};
  const size_t nblk = (D + kDB - 1) / kDB;
  const size_t items = size_t(B) * nblk;
  const int slots = slots_for(items);
  T* dA_part = workspace;                    // (B, D, N)
  T* dD_part = dA_part + size_t(B) * D * N;  // (B, D)
  T* dbias_part = dD_part + size_t(B) * D;   // (B, D)
  T* dB_part = dbias_part + size_t(B) * D;   // (nblk, B, L, N)
  T* dC_part = dB_part + nblk * B * L * N;   // (nblk, B, L, N)
  T* scratch = dC_part + nblk * B * L * N;   // slots x slot
  const size_t slot = 2 * size_t(L) * kDB * N + 2 * size_t(L) * kDB;
  const BwdOut o{dout, du, ddelta, dz, dA_part, dD_part, dbias_part, dB_part, dC_part};

  // Items are split statically over the slots, each slot owning its scratch.
  parallel_blocks(slots, items / slots * size_t(L) * kDB * N * 8, [&](size_t s0, size_t s1) {
    for (size_t s = s0; s < s1; ++s) {
      const size_t i0 = s * items / slots, i1 = (s + 1) * items / slots;
      if constexpr (kIsFloat<T>) {
        if (cpu_has_avx512f()) {
          bwd_range_avx512(a, o, scratch + s * slot, i0, i1);
          continue;
        }
      }
      bwd_range_generic(a, o, scratch + s * slot, i0, i1);
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
      if constexpr (std::is_same_v<T, float>) {
        if (cpu_has_avx512f()) {
          const size_t r = b * D;
          step_row_avx512(state + r * N, u + r, delta + r, A, Bm + b * N, Cm + b * N, Dskip,
                          z ? z + r : nullptr, delta_bias, delta_softplus, out + r, D, N);
          continue;
        }
      }
      for (int d = 0; d < D; ++d) {
        const size_t i = b * D + d;
        T dt = delta[i] + (delta_bias ? delta_bias[d] : T(0));
        if (delta_softplus) dt = softplus_scalar(dt);
        T* h = state + i * N;
        T dA[kScanMaxState];
        ExpStd::rows(A + size_t(d) * N, &dt, dA, 1, N);
        T acc = 0;
        for (int n = 0; n < N; ++n) {
          h[n] = dA[n] * h[n] + dt * Bm[b * N + n] * u[i];
          acc += h[n] * Cm[b * N + n];
        }
        T y = acc + (Dskip ? Dskip[d] * u[i] : T(0));
        if (z) y *= silu_scalar(z[i]);
        out[i] = y;
      }
    }
  });
}

#define INSTANTIATE(T)                                                                           \
  template void selective_scan_step<T>(T*, const T*, const T*, const T*, const T*, const T*,     \
                                       const T*, const T*, const T*, bool, T*, int, int, int);   \
  template void selective_scan_forward<T>(const T*, const T*, const T*, const T*, const T*,      \
                                          const T*, const T*, const T*, bool, T*, T*, int, int,  \
                                          int, int);                                             \
  template void selective_scan_backward<T>(const T*, const T*, const T*, const T*, const T*,     \
                                           const T*, const T*, const T*, bool, const T*, T*, T*, \
                                           T*, T*, T*, T*, T*, T*, T*, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels
