// Vectorised transcendental math for the CPU kernels: exp, log1p, softplus, sigmoid, tanh, SiLU
// over float arrays. On AVX2+FMA and AVX-512 they are SLEEF's 1-ulp vector functions; elsewhere
// (and for double, which the gradient checks use) libm's. The level is chosen at run time from the
// CPU (cpu_isa()), so one build runs on any x86-64 and is fast on each.
//
// Kernels compiled once per level (the scan: a function with __attribute__((target(...))) per
// level, each inlining the same template) take one of the VecMath* structs as a policy, so
// their inner loops and these calls run at the same width.
#pragma once

#include <cstddef>

namespace slipstream::kernels {

enum class CpuIsa { generic, avx2, avx512 };

// The best level this CPU runs (avx2: AVX2 + FMA; avx512: AVX-512 F, DQ, VL), capped by the
// environment variable SLIPSTREAM_CPU_ISA (generic | avx2 | avx512) when it is set: to measure
// or test a lower level on a machine that has a higher one. Read once.
CpuIsa cpu_isa();
// What this CPU supports, ignoring the cap.
CpuIsa cpu_isa_supported();
const char* cpu_isa_name(CpuIsa isa);

// One level's functions. y may alias x. n may be anything (tails are handled).
#define SLIPSTREAM_VEC_MATH_API                                                              \
  static void exp(const float* x, float* y, size_t n);                                       \
  static void log1p(const float* x, float* y, size_t n);                                     \
  /* softplus with PyTorch's threshold 20 (= x above it) */                                  \
  static void softplus(const float* x, float* y, size_t n);                                  \
  static void sigmoid(const float* x, float* y, size_t n);                                   \
  static void tanh(const float* x, float* y, size_t n);                                      \
  static void silu(const float* x, float* y, size_t n);                                      \
  /* out[i * N + j] = exp(s[i] * a[i * N + j]) for i < rows, j < N (the scan's exp(dt A)) */ \
  static void exp_scaled_rows(const float* a, const float* s, float* out, int rows, int N);

struct VecMathGeneric {
  SLIPSTREAM_VEC_MATH_API
};
struct VecMathAvx2 {
  SLIPSTREAM_VEC_MATH_API
};
struct VecMathAvx512 {
  SLIPSTREAM_VEC_MATH_API
};
#undef SLIPSTREAM_VEC_MATH_API

// The same at cpu_isa()'s level.
void vec_exp(const float* x, float* y, size_t n);
void vec_log1p(const float* x, float* y, size_t n);
void vec_softplus(const float* x, float* y, size_t n);
void vec_sigmoid(const float* x, float* y, size_t n);
void vec_tanh(const float* x, float* y, size_t n);
void vec_silu(const float* x, float* y, size_t n);

}  // namespace slipstream::kernels
