// AdamWOptimizer and the LR schedules: hand-computed numbers, accumulation, clipping, EMA,
// the bf16 shadow, non-finite gradients and exact save/load.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numbers>

#include "engine/state_io.h"
#include "kernels/bf16.h"
#include "stages/optim/adamw_optimizer.h"

namespace slipstream::optim {
namespace {

Parameter make_param(const std::string& name, std::vector<float> values, bool decay = true,
                     bool bf16 = false) {
  Parameter p;
  p.name = name;
  const int64_t n = static_cast<int64_t>(values.size());
  p.value = Tensor::empty({n}, DType::f32);
  p.grad = Tensor::zeros({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) p.value.data<float>()[i] = values[size_t(i)];
  if (bf16) p.low_precision = Tensor::zeros({n}, DType::bf16);
  p.weight_decay = decay;
  return p;
}

void set_grad(Parameter& p, std::vector<float> g) {
  for (size_t i = 0; i < g.size(); ++i) p.grad.data<float>()[i] = g[i];
}
void add_grad(Parameter& p, std::vector<float> g) {
  for (size_t i = 0; i < g.size(); ++i) p.grad.data<float>()[i] += g[i];
}
std::vector<float> values(const Parameter& p) {
  return {p.value.data<float>(), p.value.data<float>() + p.value.numel()};
}

AdamWConfig base_config() {
  AdamWConfig c;
  c.schedule.lr = 0.1;
  c.clip = 0;
  return c;
}

TEST(AdamW, OneStepMatchesHandComputedNumbers) {
  Parameter p = make_param("p", {1.0f, -2.0f}), q = make_param("q", {0.5f}, false);
  AdamWOptimizer opt;
  opt.attach({{"a.p", &p}, {"a.q", &q}}, base_config());
  set_grad(p, {0.1f, -0.2f});
  set_grad(q, {0.3f});
  auto r = opt.micro_step();
  EXPECT_TRUE(r.stepped);
  EXPECT_DOUBLE_EQ(r.lr, 0.1);
  EXPECT_NEAR(r.grad_norm, std::sqrt(0.01 + 0.04 + 0.09), 1e-7);
  // Step 1: m̂ = g, v̂ = g², so p ← p(1 - lr·wd) - lr·g/(|g| + eps); q has no decay.
  EXPECT_NEAR(p.value.data<float>()[0], 0.999 - 0.1 * 0.1 / (0.1 + 1e-8), 1e-6);
  EXPECT_NEAR(p.value.data<float>()[1], -1.998 + 0.1 * 0.2 / (0.2 + 1e-8), 1e-6);
  EXPECT_NEAR(q.value.data<float>()[0], 0.5 - 0.1 * 0.3 / (0.3 + 1e-8), 1e-6);
  EXPECT_EQ(p.grad.data<float>()[0], 0.0f);  // consumed gradients are zeroed
  // Step 2 with g = 0.05: m = 0.9·0.03 + 0.1·0.05, v = 0.999·0.00009 + 0.001·0.0025 (for q).
  set_grad(p, {0, 0});
  set_grad(q, {0.05f});
  opt.micro_step();
  const double m = 0.9 * 0.03 + 0.1 * 0.05, v = 0.999 * 0.00009 + 0.001 * 0.0025;
  const double mh = m / (1 - 0.81), vh = v / (1 - 0.999 * 0.999);
  const double q1 = 0.5 - 0.1 * 0.3 / (0.3 + 1e-8);
  EXPECT_NEAR(q.value.data<float>()[0], q1 - 0.1 * mh / (std::sqrt(vh) + 1e-8), 1e-6);
  EXPECT_EQ(opt.steps(), 2);
}

TEST(AdamW, ClippingScalesTheGlobalNorm) {
  Parameter p = make_param("p", {0.0f, 0.0f});
  AdamWConfig c = base_config();
  c.clip = 1.0;
  AdamWOptimizer opt;
  opt.attach({{"p", &p}}, c);
  set_grad(p, {3.0f, 4.0f});
  auto r = opt.micro_step();
  EXPECT_NEAR(r.grad_norm, 5.0, 1e-6);  // reported before clipping
  // The first moment holds (1 - beta1) times the clipped gradient (0.6, 0.8).
  std::map<std::string, Tensor> t;
  std::map<std::string, std::string> meta;
  StateWriter w(t, meta, "opt");
  opt.save(w);
  const Tensor& m = t.at("opt.m.p");
  EXPECT_NEAR(m.data<float>()[0], 0.1 * 0.6, 1e-7);
  EXPECT_NEAR(m.data<float>()[1], 0.1 * 0.8, 1e-7);
}

TEST(AdamW, AccumulationEqualsOneStepOnTheMean) {
  Parameter a = make_param("w", {0.3f, -0.7f, 1.1f}), b = make_param("w", {0.3f, -0.7f, 1.1f});
  AdamWConfig ca = base_config(), cb = base_config();
  ca.accumulate = 2;
  ca.clip = cb.clip = 0.5;  // active: clipping must see the mean, not the sum
  AdamWOptimizer oa, ob;
  oa.attach({{"w", &a}}, ca);
  ob.attach({{"w", &b}}, cb);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g1 = {0.2f + step, -0.4f, 0.6f}, g2 = {0.1f, 0.3f - step, -0.2f};
    add_grad(a, g1);
    EXPECT_FALSE(oa.micro_step().stepped);
    EXPECT_EQ(values(a), values(b));  // nothing applied mid-accumulation
    add_grad(a, g2);
    auto ra = oa.micro_step();
    set_grad(b, {(g1[0] + g2[0]) / 2, (g1[1] + g2[1]) / 2, (g1[2] + g2[2]) / 2});
    auto rb = ob.micro_step();
    EXPECT_TRUE(ra.stepped);
    EXPECT_NEAR(ra.grad_norm, rb.grad_norm, 1e-6);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(values(a)[i], values(b)[i], 1e-6);
  }
}

TEST(AdamW, EmaTracksWeightsAndSwapsForValidation) {
  Parameter p = make_param("p", {1.0f});
  AdamWConfig c = base_config();
  c.ema = 0.5;
  c.weight_decay = 0;
  AdamWOptimizer opt;
  opt.attach({{"p", &p}}, c);
  set_grad(p, {1.0f});
  opt.micro_step();
  const float w1 = p.value.data<float>()[0];  // ≈ 0.9
  EXPECT_NEAR(w1, 0.9f, 1e-6);
  EXPECT_FLOAT_EQ(opt.ema_of(0).data<float>()[0], 0.5f * 1.0f + 0.5f * w1);
  set_grad(p, {1.0f});
  opt.micro_step();
  const float w2 = p.value.data<float>()[0];
  const float e2 = 0.5f * (0.5f * 1.0f + 0.5f * w1) + 0.5f * w2;
  EXPECT_FLOAT_EQ(opt.ema_of(0).data<float>()[0], e2);
  opt.swap_ema();
  EXPECT_TRUE(opt.ema_swapped());
  EXPECT_FLOAT_EQ(p.value.data<float>()[0], e2);
  opt.swap_ema();
  EXPECT_FLOAT_EQ(p.value.data<float>()[0], w2);
}

TEST(AdamW, Bf16ShadowIsRoundingOfMaster) {
  Parameter p = make_param("p", {0.123456f, -3.14159f, 1e-3f, 77.7f}, true, true);
  AdamWOptimizer opt;
  opt.attach({{"p", &p}}, base_config());
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {0.5f, -0.25f, 0.125f, 1.0f});
    opt.micro_step();
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_EQ(p.low_precision.data<uint16_t>()[i],
                kernels::fp32_to_bf16(p.value.data<float>()[i]));
  }
}

TEST(AdamW, NonFiniteGradientSkipsTheUpdate) {
  Parameter p = make_param("p", {1.0f, 2.0f});
  AdamWOptimizer opt;
  opt.attach({{"p", &p}}, base_config());
  set_grad(p, {NAN, 1.0f});
  auto r = opt.micro_step();
  EXPECT_TRUE(r.stepped);
  EXPECT_FALSE(r.finite);
  EXPECT_EQ(values(p), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(p.grad.data<float>()[0], 0.0f);
  EXPECT_EQ(opt.steps(), 0);
}

TEST(AdamW, SaveLoadResumesBitExactlyMidAccumulation) {
  AdamWConfig c = base_config();
  c.accumulate = 3;
  c.ema = 0.9;
  c.clip = 0.3;
  Parameter a = make_param("w", {0.5f, -0.5f}, true, true);
  AdamWOptimizer oa;
  oa.attach({{"w", &a}}, c);
  auto grad_at = [](int k) {
    return std::vector<float>{0.1f * float(k % 5), -0.07f * float(k % 3) + 0.02f};
  };
  for (int k = 0; k < 5; ++k) add_grad(a, grad_at(k)), oa.micro_step();
  std::map<std::string, Tensor> t;
  std::map<std::string, std::string> meta;
  StateWriter w(t, meta, "opt");
  oa.save(w);
  // A fresh optimizer on a copy of the weights, restored from the saved state.
  Parameter b = make_param("w", values(a), true, true);
  AdamWOptimizer ob;
  ob.attach({{"w", &b}}, c);
  StateReader r(t, meta, "opt", "<memory>");
  ob.load(r);
  EXPECT_EQ(ob.pending_micro_batches(), 2);
  EXPECT_EQ(b.low_precision.data<uint16_t>()[0], kernels::fp32_to_bf16(b.value.data<float>()[0]));
  for (int k = 5; k < 12; ++k) {
    add_grad(a, grad_at(k)), oa.micro_step();
    add_grad(b, grad_at(k)), ob.micro_step();
  }
  EXPECT_EQ(values(a), values(b));
  EXPECT_EQ(oa.steps(), ob.steps());
  EXPECT_EQ(oa.ema_of(0).data<float>()[1], ob.ema_of(0).data<float>()[1]);
}

TEST(LrSchedule, ValuesAtChosenSteps) {
  LrSchedule s;
  s.lr = 1.0;
  EXPECT_EQ(s.at(0), 1.0);
  EXPECT_EQ(s.at(12345), 1.0);

  s.kind = LrSchedule::Kind::linear_warmup;
  s.warmup = 10;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(50), 1.0);

  s.kind = LrSchedule::Kind::cosine;
  s.total = 110;
  s.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);  // warmup
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-12);
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);

  s.kind = LrSchedule::Kind::cosine_restarts;
  s.warmup = 0;
  s.min_lr = 0;
  s.restart_period = 10;
  EXPECT_DOUBLE_EQ(s.at(0), 1.0);
  EXPECT_NEAR(s.at(5), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(25), 0.5, 1e-12);
  s.restart_mult = 2;  // periods 10, 20, 40: restarts at 10 and 30
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(20), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(30), 1.0);
  EXPECT_NEAR(s.at(50), 0.5, 1e-12);

  EXPECT_EQ(LrSchedule::parse("cosine"), LrSchedule::Kind::cosine);
  EXPECT_THROW(LrSchedule::parse("cosin"), std::invalid_argument);
}

}  // namespace
}  // namespace slipstream::optim
