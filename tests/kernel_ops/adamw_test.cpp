// AdamW (kernels/adamw.h): the reference against hand-computed numbers; the fused CUDA update
// (clipping, skipped non-finite steps, bf16 shadows) against the CPU optimizer on the emulator
// and on a device (tests/kernel_ops/kernel_test.h).

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "tests/kernel_ops/kernel_test.h"

// ---- The CPU reference ----

#if SLIPSTREAM_REFERENCE_TESTS
namespace slipstream::kernels {
namespace {

// lr 0.01, betas (0.9, 0.999), eps 1e-8, weight decay 0.1. Expected values by hand:
// step 1 from m = v = 0: p' = p (1 - 0.001) - 0.01 * g / (|g| + 1e-8)
//   (m = 0.1 g, v = 0.001 g^2, bias corrections 0.1 and 0.001 cancel them).
//   p = 1.0,  g = 0.1:  0.999   - 0.01 / (1 + 1e-7)   = 0.989000001
//   p = -0.5, g = -0.2: -0.4995 + 0.01 / (1 + 5e-8)   = -0.4895000005
//   p = 0.25, g = 0.4:  0.24975 - 0.01 / (1 + 2.5e-8) = 0.23975000025
// step 3 from m = 0.05, v = 0.01, g = -0.3, p = 2:
//   m = 0.045 - 0.03 = 0.015, v = 0.00999 + 0.00009 = 0.01008,
//   bc1 = 1 - 0.9^3 = 0.271, bc2 = 1 - 0.999^3 = 0.002997001,
//   p' = 1.998 - (0.01 / 0.271) * 0.015 / (sqrt(0.01008) / sqrt(0.002997001) + 1e-8)
//      = 1.998 - 0.000301811055... = 1.997698188945
CPU_TEST(AdamW, OneStepHandComputed) {
  const double expect[] = {0.989000001, -0.4895000005, 0.23975000025, 1.997698188945};
  const double expect_m[] = {0.01, -0.02, 0.04, 0.015};
  const double expect_v[] = {1e-5, 4e-5, 1.6e-4, 0.01008};
  const double p0[] = {1.0, -0.5, 0.25, 2.0}, g[] = {0.1, -0.2, 0.4, -0.3};
  const double m0[] = {0, 0, 0, 0.05}, v0[] = {0, 0, 0, 0.01};
  const int64_t steps[] = {1, 1, 1, 3};
  for (int i = 0; i < 4; ++i) {
    double p = p0[i], m = m0[i], v = v0[i];
    adamw_step<double>(&p, &g[i], &m, &v, nullptr, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, true, steps[i]);
    EXPECT_NEAR(p, expect[i], 1e-12) << i;
    EXPECT_NEAR(m, expect_m[i], 1e-15) << i;
    EXPECT_NEAR(v, expect_v[i], 1e-15) << i;
    // float within float rounding
    float pf = float(p0[i]), gf = float(g[i]), mf = float(m0[i]), vf = float(v0[i]);
    uint16_t shadow = 0;
    adamw_step<float>(&pf, &gf, &mf, &vf, &shadow, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, true, steps[i]);
    EXPECT_NEAR(pf, expect[i], 1e-6) << i;
    EXPECT_EQ(shadow, fp32_to_bf16(pf));
  }
  // No decay: p = 1.0, g = 0.1 at step 1 -> 1.0 - 0.01 / (1 + 1e-7) = 0.990000001
  double p = 1.0, gg = 0.1, m = 0, v = 0;
  adamw_step<double>(&p, &gg, &m, &v, nullptr, 1, 0.01, 0.9, 0.999, 1e-8, 0.1, false, 1);
  EXPECT_NEAR(p, 0.990000001, 1e-12);
}

// torch.optim.AdamW on float32 tensors multiplies by float(1 - 0.999) = float(0.001), not by
// 1 - float(0.999) = 0.00099998713 (1.3e-5 off): the moments must match it bit for bit.
CPU_TEST(AdamW, OneMinusBetaIsRoundedOnceAsInPyTorch) {
  float p = 1.0f, g = 1.0f, m = 0.0f, v = 0.0f;
  adamw_step<float>(&p, &g, &m, &v, nullptr, 1, 1e-3, 0.9, 0.999, 1e-8, 0.01, true, 1);
  EXPECT_EQ(v, float(1.0 - 0.999));
  EXPECT_EQ(m, float(1.0 - 0.9));
  // Decoupled decay by float(1 - lr * wd) before the update: 1 - 1e-5, then the step of -lr.
  EXPECT_FLOAT_EQ(p, float(1.0 - 1e-3 * 0.01) - 1e-3f);
}

CPU_TEST(AdamW, LargeArrayMatchesElementwiseAndShadow) {
  std::mt19937_64 rng(1);
  const size_t n = 100003;
  auto p = test::cast<float>(test::rand_vec(n, rng)), g = test::cast<float>(test::rand_vec(n, rng));
  std::vector<float> m(n, 0.01f), v(n, 0.02f);
  auto p1 = p, m1 = m, v1 = v;
  std::vector<uint16_t> shadow(n);
  adamw_step<float>(p.data(), g.data(), m.data(), v.data(), shadow.data(), n, 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.05f, true, 10);
  for (size_t i = 0; i < n; i += 101) {
    adamw_step<float>(&p1[i], &g[i], &m1[i], &v1[i], nullptr, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.05f,
                      true, 10);
    ASSERT_EQ(p[i], p1[i]);
    ASSERT_EQ(m[i], m1[i]);
    ASSERT_EQ(v[i], v1[i]);
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(shadow[i], fp32_to_bf16(p[i]));
}

CPU_TEST(GlobalNorm, SumOfSquaresAndScale) {
  std::vector<float> x(1000001);
  double expect = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = float(int(i % 7) - 3) * 0.5f;
    expect += double(x[i]) * double(x[i]);
  }
  EXPECT_DOUBLE_EQ(global_norm_sq(x.data(), x.size()), expect);
  const double small[] = {3.0, 4.0};
  EXPECT_DOUBLE_EQ(global_norm_sq(small, 2), 25.0);
  scale_inplace(x.data(), x.size(), 0.5f);
  EXPECT_DOUBLE_EQ(global_norm_sq(x.data(), x.size()), expect * 0.25);
}

}  // namespace
}  // namespace slipstream::kernels
#endif  // SLIPSTREAM_REFERENCE_TESTS

// ---- The CUDA kernels against the reference ----

namespace slipstream::kernels::test {

// steps: gradients per step; a step whose gradients hold a NaN must be skipped. Every other
// segment keeps an EMA of its weights.
template <class Kernels, class Mem>
void check_adamw(const std::vector<size_t>& sizes, float clip, int steps, int nan_step,
                 uint64_t seed) {
  SCOPED_TRACE("segments " + std::to_string(sizes.size()) + " clip " + std::to_string(clip));
  std::mt19937_64 rng(seed);
  using Hyper = typename Kernels::AdamWHyper;
  const Hyper h{0.9f, 0.95f, 1e-8f, 0.1f, clip, 0.5f, 0.75f};
  const std::vector<float> lr_table = {1e-3f, 2e-3f, 3e-3f, 2.5e-3f};
  const size_t S = sizes.size();
  std::vector<std::vector<float>> p(S), m(S), v(S), ema(S);
  for (size_t s = 0; s < S; ++s) {
    p[s] = cast<float>(rand_vec(sizes[s], rng));
    m[s].assign(sizes[s], 0.f), v[s].assign(sizes[s], 0.f);
    ema[s] = p[s];
  }
  Mem mem;
  std::vector<typename Kernels::AdamWSegment> segs(S);
  size_t max_n = 0;
  for (size_t s = 0; s < S; ++s) {
    segs[s] = {mem.upload(p[s]),
               mem.template alloc<float>(sizes[s]),
               mem.upload(m[s]),
               mem.upload(v[s]),
               s % 2 ? mem.template alloc<bfloat16>(sizes[s]) : nullptr,
               sizes[s],
               int(s % 3 != 1),
               s % 2 ? nullptr : mem.upload(ema[s])};
    max_n = std::max(max_n, sizes[s]);
  }
  const auto* g_segs = mem.upload(segs);
  const float* g_lr = mem.upload(lr_table);
  typename Kernels::AdamWDeviceState st0{};
  auto* g_state = mem.upload(std::vector<typename Kernels::AdamWDeviceState>{st0});
  void* ws = mem.alloc_bytes(Kernels::adamw_workspace_bytes(int(S), max_n));
  int64_t step = 0;  // the CPU optimizer's count of applied updates
  for (int k = 0; k < steps; ++k) {
    std::vector<std::vector<float>> g(S);
    double sq = 0;
    for (size_t s = 0; s < S; ++s) {
      g[s] = cast<float>(rand_vec(sizes[s], rng, 0.5, 3.0));
      if (k == nan_step && s == S - 1) g[s][sizes[s] / 2] = std::numeric_limits<float>::quiet_NaN();
      sq += global_norm_sq(g[s].data(), g[s].size());
      // Upload this step's gradient into the segment's buffer.
      float* dst = segs[s].grad;
      const auto up = mem.upload(g[s]);
      Kernels::copy_bytes(dst, up, sizes[s] * sizeof(float), mem.stream());
    }
    Kernels::adamw_step(g_segs, int(S), max_n, h, g_lr, lr_table.size(), g_state, ws, mem.stream(),
                        {});
    // The CPU optimizer's policy (stages/optim/adamw_optimizer.cpp).
    const double norm = std::sqrt(sq) * h.grad_scale;
    const float lr = lr_table[std::min<size_t>(size_t(step), lr_table.size() - 1)];
    const auto st = mem.download(g_state, 1)[0];
    EXPECT_EQ(st.finite, std::isfinite(norm) ? 1 : 0) << "step " << k;
    if (!std::isfinite(norm)) continue;
    EXPECT_NEAR(st.grad_norm, norm, 1e-5 * norm) << "step " << k;
    EXPECT_EQ(st.lr, lr);
    double scale = h.grad_scale;
    if (clip > 0 && norm > clip) scale *= clip / norm;
    ++step;
    EXPECT_EQ(st.step, step);
    for (size_t s = 0; s < S; ++s) {
      scale_inplace(g[s].data(), sizes[s], float(scale));
      adamw_step(p[s].data(), g[s].data(), m[s].data(), v[s].data(), nullptr, sizes[s], lr, h.beta1,
                 h.beta2, h.eps, h.weight_decay, segs[s].decay != 0, step);
      // The CPU optimizer's EMA.
      const float d = float(h.ema_decay), keep = float(1.0 - h.ema_decay);
      for (size_t i = 0; i < sizes[s]; ++i) ema[s][i] = d * ema[s][i] + keep * p[s][i];
    }
  }
  for (size_t s = 0; s < S; ++s) {
    SCOPED_TRACE("segment " + std::to_string(s));
    const auto gp = values(mem.download(segs[s].param, sizes[s]));
    EXPECT_CLOSE(gp, values(p[s]), 1e-5, "param");
    EXPECT_CLOSE(values(mem.download(segs[s].m, sizes[s])), values(m[s]), 1e-5, "m");
    EXPECT_CLOSE(values(mem.download(segs[s].v, sizes[s])), values(v[s]), 1e-5, "v");
    EXPECT_CLOSE(values(mem.download(segs[s].grad, sizes[s])), std::vector<double>(sizes[s], 0.0),
                 1e-30, "gradient zeroed");
    if (segs[s].ema)
      EXPECT_CLOSE(values(mem.download(segs[s].ema, sizes[s])), values(ema[s]), 1e-5, "ema");
    if (segs[s].shadow) {
      // The bf16 copy is the rounding of the device's own updated value.
      const auto sh = mem.download(segs[s].shadow, sizes[s]);
      const auto dp = mem.download(segs[s].param, sizes[s]);
      size_t bad = 0;
      for (size_t i = 0; i < sizes[s]; ++i) bad += sh[i].bits != fp32_to_bf16(dp[i]);
      EXPECT_EQ(bad, 0u) << "bf16 copy";
    }
  }
}

}  // namespace slipstream::kernels::test

namespace slipstream::kernels::test {
namespace {

KERNEL_TEST(AdamW, MatchesCpuOptimizer) {
  check_adamw<Kernels, Mem>({1000, 37, 4096, 5}, 0.0f, 4, -1, 401);
  check_adamw<Kernels, Mem>({300, 2000}, 1.0f, 5, 2, 402);  // clipped; step 2 skipped (NaN)
}
DEVICE_TEST(AdamW, GpuStandardShape) {
  check_adamw<Kernels, Mem>({65536 * 8, 128, 256 * 16}, 1.0f, 3, -1, 403);
}

}  // namespace
}  // namespace slipstream::kernels::test
