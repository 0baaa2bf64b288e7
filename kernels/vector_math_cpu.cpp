// SLEEF's vector functions at AVX2 and AVX-512 width, libm's elsewhere (vector_math.h). Every
// function of a level carries that level's target attribute, so this file builds for any x86-64
// and only the level cpu_isa() picks ever runs.
#include "kernels/vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

// GCC 12 flags the undefined pass-through operand inside the AVX-512 intrinsics headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

// sleef.h declares its AVX2 and AVX-512 functions only when the translation unit targets those
// ISAs (__AVX__, __AVX512F__); this file targets them per function instead, so the two macros
// are defined for the include alone (immintrin.h above already declared the vector types).
#ifndef __AVX__
#define __AVX__ 1
#define SLIPSTREAM_DEFINED_AVX
#endif
#ifndef __AVX512F__
#define __AVX512F__ 1
#define SLIPSTREAM_DEFINED_AVX512F
#endif
#include <sleef.h>
#ifdef SLIPSTREAM_DEFINED_AVX
#undef __AVX__
#undef SLIPSTREAM_DEFINED_AVX
#endif
#ifdef SLIPSTREAM_DEFINED_AVX512F
#undef __AVX512F__
#undef SLIPSTREAM_DEFINED_AVX512F
#endif

#include "kernels/activations.h"

#define SLIPSTREAM_AVX2 __attribute__((target("avx2,fma")))
#define SLIPSTREAM_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,fma")))

namespace slipstream::kernels {

namespace {

CpuIsa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
    return CpuIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::avx2;
  return CpuIsa::generic;
}

CpuIsa capped_isa() {
  const CpuIsa best = cpu_isa_supported();
  const char* cap = std::getenv("SLIPSTREAM_CPU_ISA");
  if (!cap || !*cap) return best;
  const std::string c = cap;
  CpuIsa want;
  if (c == "generic") {
    want = CpuIsa::generic;
  } else if (c == "avx2") {
    want = CpuIsa::avx2;
  } else if (c == "avx512") {
    want = CpuIsa::avx512;
  } else {
    throw std::invalid_argument("SLIPSTREAM_CPU_ISA='" + c + "': expected generic, avx2 or avx512");
  }
  return std::min(want, best);
}

// ---- AVX2 + FMA: 8 lanes ----

SLIPSTREAM_AVX2 inline __m256 exp8(__m256 x) {
  return Sleef_expf8_u10avx2(x);
}
SLIPSTREAM_AVX2 inline __m256 log1p8(__m256 x) {
  return Sleef_log1pf8_u10avx2(x);
}
// max(x, 0) + log1p(exp(-|x|)): no overflow for large x; = x above the threshold.
SLIPSTREAM_AVX2 inline __m256 softplus8(__m256 x) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 r = _mm256_add_ps(_mm256_max_ps(x, zero), log1p8(exp8(_mm256_sub_ps(zero, ax))));
  const __m256 above = _mm256_cmp_ps(x, _mm256_set1_ps(float(kSoftplusThreshold)), _CMP_GT_OQ);
  return _mm256_blendv_ps(r, x, above);
}
SLIPSTREAM_AVX2 inline __m256 sigmoid8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
SLIPSTREAM_AVX2 inline __m256 tanh8(__m256 x) {
  return Sleef_tanhf8_u10avx2(x);
}
SLIPSTREAM_AVX2 inline __m256 silu8(__m256 x) {
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// y[i] = F(x[i]); the last partial vector goes through a padded copy.
template <__m256 (*F)(__m256)>
SLIPSTREAM_AVX2 inline void map8(const float* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, F(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float t[8] = {};
    std::memcpy(t, x + i, (n - i) * sizeof(float));
    _mm256_store_ps(t, F(_mm256_load_ps(t)));
    std::memcpy(y + i, t, (n - i) * sizeof(float));
  }
}

// ---- AVX-512: 16 lanes ----

SLIPSTREAM_AVX512 inline __m512 exp16(__m512 x) {
  return Sleef_expf16_u10avx512f(x);
}
SLIPSTREAM_AVX512 inline __m512 log1p16(__m512 x) {
  return Sleef_log1pf16_u10avx512f(x);
}
SLIPSTREAM_AVX512 inline __m512 softplus16(__m512 x) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 r =
      _mm512_add_ps(_mm512_max_ps(x, zero), log1p16(exp16(_mm512_sub_ps(zero, _mm512_abs_ps(x)))));
  const __mmask16 above =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(float(kSoftplusThreshold)), _CMP_GT_OQ);
  return _mm512_mask_mov_ps(r, above, x);
}
SLIPSTREAM_AVX512 inline __m512 sigmoid16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
SLIPSTREAM_AVX512 inline __m512 tanh16(__m512 x) {
  return Sleef_tanhf16_u10avx512f(x);
}
SLIPSTREAM_AVX512 inline __m512 silu16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

SLIPSTREAM_AVX512 inline __mmask16 lanes16(size_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
}

template <__m512 (*F)(__m512)>
SLIPSTREAM_AVX512 inline void map16(const float* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = lanes16(n - i);
    _mm512_mask_storeu_ps(y + i, m, F(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// ---- generic: libm ----

template <float (*F)(float)>
inline void map1(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = F(x[i]);
}
float exp1(float x) {
  return std::exp(x);
}
float softplus1(float x) {
  return softplus_scalar(x);
}
float sigmoid1(float x) {
  return sigmoid_scalar(x);
}
float log1p1(float x) {
  return std::log1p(x);
}
float tanh1(float x) {
  return std::tanh(x);
}
float silu1(float x) {  // one division, as the vector levels (x * sigmoid(x) rounds twice)
  return x / (1.0f + std::exp(-x));
}

}  // namespace

// A level's element-wise functions: `map` applies the level's vector form of each (exp8, exp16,
// exp1 for libm, ...) over the array.
#define SLIPSTREAM_VEC_MATH_MAPS(Level, attributes, map, width)         \
  attributes void Level::exp(const float* x, float* y, size_t n) {      \
    map<exp##width>(x, y, n);                                           \
  }                                                                     \
  attributes void Level::log1p(const float* x, float* y, size_t n) {    \
    map<log1p##width>(x, y, n);                                         \
  }                                                                     \
  attributes void Level::softplus(const float* x, float* y, size_t n) { \
    map<softplus##width>(x, y, n);                                      \
  }                                                                     \
  attributes void Level::sigmoid(const float* x, float* y, size_t n) {  \
    map<sigmoid##width>(x, y, n);                                       \
  }                                                                     \
  attributes void Level::tanh(const float* x, float* y, size_t n) {     \
    map<tanh##width>(x, y, n);                                          \
  }                                                                     \
  attributes void Level::silu(const float* x, float* y, size_t n) {     \
    map<silu##width>(x, y, n);                                          \
  }

CpuIsa cpu_isa_supported() {
  static const CpuIsa isa = detect_isa();
  return isa;
}

CpuIsa cpu_isa() {
  static const CpuIsa isa = capped_isa();
  return isa;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::generic:
      break;
  }
  return "generic";
}

SLIPSTREAM_VEC_MATH_MAPS(VecMathGeneric, , map1, 1)
void VecMathGeneric::exp_scaled_rows(const float* a, const float* s, float* out, int rows, int N) {
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < N; ++j) out[i * N + j] = std::exp(s[i] * a[i * N + j]);
}

SLIPSTREAM_VEC_MATH_MAPS(VecMathAvx2, SLIPSTREAM_AVX2, map8, 8)
SLIPSTREAM_AVX2 void VecMathAvx2::exp_scaled_rows(const float* a, const float* s, float* out,
                                                  int rows, int N) {
  for (int i = 0; i < rows; ++i) {
    const __m256 si = _mm256_set1_ps(s[i]);
    const float* ar = a + size_t(i) * N;
    float* o = out + size_t(i) * N;
    int j = 0;
    for (; j + 8 <= N; j += 8)
      _mm256_storeu_ps(o + j, exp8(_mm256_mul_ps(si, _mm256_loadu_ps(ar + j))));
    if (j < N) {
      alignas(32) float t[8] = {};
      for (int k = j; k < N; ++k) t[k - j] = s[i] * ar[k];
      _mm256_store_ps(t, exp8(_mm256_load_ps(t)));
      std::memcpy(o + j, t, size_t(N - j) * sizeof(float));
    }
  }
}

SLIPSTREAM_VEC_MATH_MAPS(VecMathAvx512, SLIPSTREAM_AVX512, map16, 16)
SLIPSTREAM_AVX512 void VecMathAvx512::exp_scaled_rows(const float* a, const float* s, float* out,
                                                      int rows, int N) {
  for (int i = 0; i < rows; ++i) {
    const __m512 si = _mm512_set1_ps(s[i]);
    const float* ar = a + size_t(i) * N;
    float* o = out + size_t(i) * N;
    for (int j = 0; j < N; j += 16) {
      const __mmask16 m = lanes16(size_t(N - j));
      _mm512_mask_storeu_ps(o + j, m, exp16(_mm512_mul_ps(si, _mm512_maskz_loadu_ps(m, ar + j))));
    }
  }
}

#undef SLIPSTREAM_VEC_MATH_MAPS

namespace {
template <class Fn>
void at_level(Fn&& fn) {
  switch (cpu_isa()) {
    case CpuIsa::avx512:
      return fn(VecMathAvx512{});
    case CpuIsa::avx2:
      return fn(VecMathAvx2{});
    case CpuIsa::generic:
      break;
  }
  fn(VecMathGeneric{});
}
}  // namespace

void vec_exp(const float* x, float* y, size_t n) {
  at_level([&](auto m) { m.exp(x, y, n); });
}
void vec_log1p(const float* x, float* y, size_t n) {
  at_level([&](auto m) { m.log1p(x, y, n); });
}
void vec_softplus(const float* x, float* y, size_t n) {
  at_level([&](auto m) { m.softplus(x, y, n); });
}
void vec_sigmoid(const float* x, float* y, size_t n) {
  at_level([&](auto m) { m.sigmoid(x, y, n); });
}
void vec_tanh(const float* x, float* y, size_t n) {
  at_level([&](auto m) { m.tanh(x, y, n); });
}
void vec_silu(const float* x, float* y, size_t n) {
  at_level([&](auto m) { m.silu(x, y, n); });
}

}  // namespace slipstream::kernels
