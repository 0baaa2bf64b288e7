#include "stages/optim/adamw_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/parallel.h"

namespace slipstream::optim {

namespace {

float* f32(const Tensor& t) {
  return t.data<float>();
}
size_t count(const Tensor& t) {
  return static_cast<size_t>(t.numel());
}

uint16_t* shadow(const Parameter& p) {
  return p.low_precision.defined() ? p.low_precision.data<uint16_t>() : nullptr;
}

void refresh_shadow(const Parameter& p) {
  if (uint16_t* s = shadow(p)) kernels::fp32_to_bf16(f32(p.value), s, count(p.value));
}

}  // namespace

void AdamWOptimizer::attach(std::vector<std::pair<std::string, Parameter*>> params,
                            const AdamWConfig& config, const ExecContext* exec) {
  if (config.accumulate < 1) throw std::invalid_argument("adamw: accumulate must be at least 1");
  cfg_ = config;
  slots_.clear();
  device_.reset();
  exec_ = exec;
  step_ = micro_ = 0;
  ema_swapped_ = false;
  const bool on_device = exec && exec->device_ops();
  const Device where = on_device ? exec->device() : Device::cpu();
  for (auto& [name, p] : params) {
    for (const Tensor* t : {&p->value, &p->grad})
      if (!t->defined() || t->dtype() != DType::f32 || t->device() != where)
        throw std::runtime_error("adamw: parameter '" + name + "' needs f32 value and grad on " +
                                 where.str() + ", got " +
                                 (t->defined() ? t->describe() : std::string("none")));
    if (!(p->value.shape() == p->grad.shape()))
      throw std::runtime_error("adamw: parameter '" + name + "': value and grad shapes differ");
    if (p->low_precision.defined() &&
        (p->low_precision.dtype() != DType::bf16 || p->low_precision.numel() != p->value.numel()))
      throw std::runtime_error("adamw: parameter '" + name +
                               "': low_precision must be bf16 of the same size");
    Slot s;
    s.name = name;
    s.p = p;
    s.m = Tensor::zeros(p->value.shape(), DType::f32, where, "adamw first moment");
    s.v = Tensor::zeros(p->value.shape(), DType::f32, where, "adamw second moment");
    if (cfg_.ema > 0) s.ema = p->value.clone();
    slots_.push_back(std::move(s));
  }
  if (on_device) {
    std::vector<AdamWDeviceSlot> ds;
    for (auto& s : slots_) ds.push_back({s.p, &s.m, &s.v, &s.ema});
    device_ = make_adamw_device(*exec, ds, cfg_);
  }
}

AdamWOptimizer::Report AdamWOptimizer::micro_step() {
  Report out;
  bool heard = false;
  micro_step([&](const Report& r) {
    out = r;
    heard = true;
  });
  if (!heard && exec_) exec_->complete_read_backs();
  return out;
}

void AdamWOptimizer::micro_step(const std::function<void(const Report&)>& report) {
  Report rep;
  if (++micro_ < cfg_.accumulate) return report(rep);
  micro_ = 0;
  rep.stepped = true;
  if (ema_swapped_) throw std::logic_error("adamw: update while the EMA weights are swapped in");
  if (device_) {
    device_->step([this, report](const AdamWDeviceOutcome& o) {
      Report r;
      r.stepped = true;
      r.finite = o.finite;
      r.lr = o.lr;
      r.grad_norm = o.grad_norm;
      step_ = o.step;
      report(r);
    });
    return;
  }

  // The update uses the mean over micro-batches: norm and clipping apply to that mean.
  const double inv_n = 1.0 / static_cast<double>(cfg_.accumulate);
  double sq = 0;
  for (const auto& s : slots_) sq += kernels::global_norm_sq(f32(s.p->grad), count(s.p->grad));
  rep.grad_norm = std::sqrt(sq) * inv_n;
  rep.lr = cfg_.schedule.at(step_);
  if (!std::isfinite(rep.grad_norm)) {
    // One bad batch must not poison the moments: drop its gradients, keep the weights.
    rep.finite = false;
    for (const auto& s : slots_) s.p->grad.zero_();
    return report(rep);
  }
  double scale = inv_n;
  if (cfg_.clip > 0 && rep.grad_norm > cfg_.clip) scale *= cfg_.clip / rep.grad_norm;
  ++step_;
  for (const auto& s : slots_) {
    float* g = f32(s.p->grad);
    const size_t n = count(s.p->grad);
    if (scale != 1.0) kernels::scale_inplace(g, n, static_cast<float>(scale));
    // lr as the device's float table holds it, so CPU and GPU steps agree.
    kernels::adamw_step(f32(s.p->value), g, f32(s.m), f32(s.v), shadow(*s.p), n,
                        static_cast<float>(rep.lr), cfg_.beta1, cfg_.beta2, cfg_.eps,
                        cfg_.weight_decay, s.p->weight_decay, step_);
    s.p->grad.zero_();
    if (cfg_.ema > 0) {
      const float d = static_cast<float>(cfg_.ema), keep = static_cast<float>(1.0 - cfg_.ema);
      float* e = f32(s.ema);
      const float* w = f32(s.p->value);
      kernels::parallel_blocks(n, 2, [&](size_t i0, size_t i1) {
        for (size_t i = i0; i < i1; ++i) e[i] = d * e[i] + keep * w[i];
      });
    }
  }
  report(rep);
}

void AdamWOptimizer::swap_ema() {
  if (cfg_.ema <= 0) return;
  if (device_) {
    device_->swap_ema();
    ema_swapped_ = !ema_swapped_;
    return;
  }
  for (const auto& s : slots_) {
    float* a = f32(s.p->value);
    float* b = f32(s.ema);
    std::swap_ranges(a, a + count(s.p->value), b);
    refresh_shadow(*s.p);
  }
  ema_swapped_ = !ema_swapped_;
}

void AdamWOptimizer::refresh_shadows() const {
  if (device_) {
    device_->refresh_shadows();
    return;
  }
  for (const auto& s : slots_) refresh_shadow(*s.p);
}

void AdamWOptimizer::weights_replaced() {
  if (ema_swapped_) throw std::logic_error("adamw: weights replaced while the EMA is swapped in");
  for (auto& s : slots_)
    if (s.ema.defined()) s.ema.copy_from(s.p->value);
  refresh_shadows();
}

void AdamWOptimizer::save(StateWriter& w) const {
  w.integer("step", step_);
  w.integer("micro", micro_);
  for (const auto& s : slots_) {
    w.tensor("m." + s.name, s.m);
    w.tensor("v." + s.name, s.v);
    if (s.ema.defined()) w.tensor("ema." + s.name, ema_swapped_ ? s.p->value : s.ema);
    // Gradients summed over micro-batches of an update not yet applied.
    if (micro_ > 0) w.tensor("grad." + s.name, s.p->grad);
  }
}

void AdamWOptimizer::load(StateReader& r) {
  step_ = r.integer("step");
  micro_ = r.integer("micro");
  for (auto& s : slots_) {
    r.tensor_into("m." + s.name, s.m);
    r.tensor_into("v." + s.name, s.v);
    if (s.ema.defined()) {
      if (r.has("ema." + s.name))
        r.tensor_into("ema." + s.name, s.ema);
      else
        s.ema.copy_from(s.p->value);  // resumed from a run without EMA: start it here
    }
    if (micro_ > 0)
      r.tensor_into("grad." + s.name, s.p->grad);
    else
      s.p->grad.zero_();
  }
  if (device_) device_->set_step(step_);
  ema_swapped_ = false;
  refresh_shadows();
}

}  // namespace slipstream::optim
