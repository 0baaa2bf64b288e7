#include "kernels/bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace slipstream::kernels {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Edge values: ties both ways, the largest finite (rounds to inf), inf, NaNs, denormals, zeros.
std::vector<uint32_t> edge_bits() {
  return {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
          0x3f807fffu, 0xbf808000u, 0xbf818000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
          0x7f7f7fffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
          0x7fa00000u, 0xff812345u, 0x7fffffffu, 0x00000001u, 0x80000001u, 0x007fffffu,
          0x807fffffu, 0x00400000u, 0x00800000u, 0x80800000u, 0x00808000u, 0x00818000u};
}

TEST(Bf16, ScalarKnownValues) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);  // signalling NaN is quietened
  EXPECT_EQ(fp32_to_bf16(from_bits(0xffc00000u)), 0xffc0);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00000001u)), 0x0000);  // denormal -> +0
  EXPECT_EQ(fp32_to_bf16(from_bits(0x807fffffu)), 0x8000);  // denormal -> -0
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
}

// Round trip: every bf16 value (but NaN payload quietening and denormals) survives.
TEST(Bf16, RoundTripAllBf16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(uint16_t(h));
    if (std::isnan(f) || ((h & 0x7f80u) == 0 && (h & 0x7fu) != 0)) continue;
    ASSERT_EQ(fp32_to_bf16(f), h) << std::hex << h;
  }
}

// Normal values round to the nearest bf16 (checked in double), ties to even mantissa.
TEST(Bf16, ScalarIsNearest) {
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    const float f = from_bits(u);
    if (!std::isfinite(f) || std::fpclassify(f) == FP_SUBNORMAL) continue;
    const uint16_t r = fp32_to_bf16(f);
    const double err = std::abs(double(bf16_to_fp32(r)) - double(f));
    const uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);
    const float flo = bf16_to_fp32(lo), fhi = bf16_to_fp32(hi);
    if (!std::isfinite(fhi)) continue;
    const double best = std::min(std::abs(double(flo) - f), std::abs(double(fhi) - f));
    ASSERT_EQ(err, best) << std::hex << u;
  }
}

std::vector<float> sweep_values() {
  std::vector<float> v;
  for (uint32_t b : edge_bits()) v.push_back(from_bits(b));
  std::mt19937 rng(7);
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) v.push_back(from_bits((hi << 16) | lo));
    v.push_back(from_bits((hi << 16) | (rng() & 0xffffu)));
  }
  for (int i = 0; i < 100003; ++i) v.push_back(from_bits(rng()));  // odd length: masked tail
  return v;
}

TEST(Bf16, Avx512MatchesScalarBitExact) {
  if (!cpu_has_avx512bf16()) GTEST_SKIP() << "CPU lacks AVX-512 BF16";
  const std::vector<float> v = sweep_values();
  std::vector<uint16_t> a(v.size()), b(v.size());
  fp32_to_bf16_scalar(v.data(), a.data(), v.size());
  fp32_to_bf16_avx512bf16(v.data(), b.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    ASSERT_EQ(a[i], b[i]) << "input bits " << std::hex << u;
  }
  // Every tail length of the masked remainder.
  for (size_t n = 0; n < 40; ++n) {
    std::vector<uint16_t> c(n + 1, 0xabcd);
    fp32_to_bf16_avx512bf16(v.data() + 1000, c.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(c[i], a[1000 + i]) << n << " " << i;
    ASSERT_EQ(c[n], 0xabcd) << "wrote past the end, n=" << n;
  }
}

TEST(Bf16, DispatchedArraysMatchScalar) {
  const std::vector<float> v = sweep_values();
  std::vector<uint16_t> a(v.size()), b(v.size());
  fp32_to_bf16_scalar(v.data(), a.data(), v.size());
  fp32_to_bf16(v.data(), b.data(), v.size());  // parallel, vector when available
  ASSERT_EQ(a, b);
  std::vector<float> back(v.size());
  bf16_to_fp32(b.data(), back.data(), b.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t expect = uint32_t(b[i]) << 16;
    uint32_t got;
    std::memcpy(&got, &back[i], 4);
    ASSERT_EQ(got, expect);
  }
}

}  // namespace
}  // namespace slipstream::kernels
