// Checks of the fused multi-tensor CUDA AdamW against the CPU kernels driven the way the CPU
// optimizer drives them (norm, skip on non-finite, clip, schedule by step), over several steps.
#pragma once

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

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
