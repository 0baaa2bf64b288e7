// bf16 conversion: the AVX-512 BF16 path is compiled with a per-function target attribute so
// the library still runs on CPUs without it; the choice is made once at run time.
#include "kernels/bf16.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/parallel.h"

namespace slipstream::kernels {

bool cpu_has_avx512bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512f");
  return has;
}

void fp32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fp32_to_bf16(src[i]);
}

__attribute__((target("avx512bf16,avx512f,avx512vl"))) void fp32_to_bf16_avx512bf16(
    const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 a = _mm512_loadu_ps(src + i);
    __m512 b = _mm512_loadu_ps(src + i + 16);
    // cvtne2ps puts the second operand in the low half.
    __m512bh r = _mm512_cvtne2ps_pbh(b, a);
    _mm512_storeu_si512(reinterpret_cast<void*>(dst + i), reinterpret_cast<__m512i>(r));
  }
  if (i < n) {
    __mmask16 m = static_cast<__mmask16>((1u << std::min<size_t>(16, n - i)) - 1u);
    __m256bh r = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
    _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i>(r));
    i += 16;
    if (i < n) {
      m = static_cast<__mmask16>((1u << (n - i)) - 1u);
      r = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i));
      _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i>(r));
    }
  }
}

void bf16_to_fp32_scalar(const uint16_t* src, float* dst, size_t n) {
  // A shift of each element; the compiler vectorises this loop.
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
}

void fp32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  const bool vec = cpu_has_avx512bf16();
  constexpr size_t kBlock = 1 << 14;
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock, [&](size_t b0, size_t b1) {
    size_t i0 = b0 * kBlock, i1 = std::min(n, b1 * kBlock);
    if (vec) {
      fp32_to_bf16_avx512bf16(src + i0, dst + i0, i1 - i0);
    } else {
      fp32_to_bf16_scalar(src + i0, dst + i0, i1 - i0);
    }
  });
}

void bf16_to_fp32(const uint16_t* src, float* dst, size_t n) {
  constexpr size_t kBlock = 1 << 14;
  parallel_blocks((n + kBlock - 1) / kBlock, kBlock, [&](size_t b0, size_t b1) {
    size_t i0 = b0 * kBlock, i1 = std::min(n, b1 * kBlock);
    bf16_to_fp32_scalar(src + i0, dst + i0, i1 - i0);
  });
}

}  // namespace slipstream::kernels
