// bfloat16 <-> float32 conversion. bf16 values are stored as uint16_t (the top half of the
// fp32 bit pattern). Rounding is round-to-nearest-even with the semantics of the AVX-512 BF16
// instruction VCVTNEPS2BF16, so the scalar and vector paths are bit-identical:
//   - NaN stays NaN and is quietened (bit 6 of the bf16 set), sign and payload top kept;
//   - fp32 denormal inputs become signed zero (the instruction treats them as zero);
//   - finite values that round past the largest bf16 become +-inf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace slipstream::kernels {

inline uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);  // 0, denormal
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// True when the CPU executes AVX-512 BF16 (checked once at run time).
bool cpu_has_avx512bf16();

// Array conversions, both parallel over large arrays: fp32_to_bf16 takes AVX-512 BF16 where the
// CPU has it, else the scalar loop; bf16_to_fp32 (a shift a value) is always the scalar loop.
void fp32_to_bf16(const float* src, uint16_t* dst, size_t n);
void bf16_to_fp32(const uint16_t* src, float* dst, size_t n);

// The individual paths, exposed for tests and benchmarks. The AVX-512 one must only be called
// when cpu_has_avx512bf16(). Serial.
void fp32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n);
void fp32_to_bf16_avx512bf16(const float* src, uint16_t* dst, size_t n);
void bf16_to_fp32_scalar(const uint16_t* src, float* dst, size_t n);

}  // namespace slipstream::kernels
