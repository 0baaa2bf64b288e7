#include "stages/optim/adamw_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
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
                            const AdamWConfig& config, const ExecContext* exec,
                            std::shared_ptr<OptimizerShard> shard) {
  if (config.accumulate < 1) throw std::invalid_argument("adamw: accumulate must be at least 1");
  cfg_ = config;
  held_.clear();
  slots_.clear();
  device_.reset();
  exec_ = exec;
  shard_ = shard && shard->world > 1 ? std::move(shard) : nullptr;
  gathered_.clear();
  gathered_at_ = -1;
  step_ = micro_ = 0;
  ema_swapped_ = false;
  const bool on_device = exec && exec->device_ops();
  const Device where = on_device ? exec->device() : Device::cpu();
  if (on_device && shard_ && !shard_->sum_on_device)
    throw std::runtime_error(
        "adamw: the sharding stage (sync.shard_optimizer) reduces host gradients and this run's "
        "parameters are on " +
        where.str() + ": use its nccl backend");
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
    Held h;
    h.name = name;
    h.p = p;
    if (cfg_.ema > 0) h.ema = p->value.clone();
    held_.push_back(std::move(h));
  }
  auto add_slot = [&](size_t k, size_t begin, size_t n) {
    Slot s;
    s.held = k;
    s.param = held_[k].p;
    s.begin = begin;
    s.n = n;
    const Shape shape = begin == 0 && n == count(held_[k].p->value)
                            ? held_[k].p->value.shape()
                            : Shape{static_cast<int64_t>(n)};
    s.m = Tensor::zeros(shape, DType::f32, where, "adamw first moment");
    s.v = Tensor::zeros(shape, DType::f32, where, "adamw second moment");
    slots_.push_back(std::move(s));
  };
  if (!shard_) {
    for (size_t k = 0; k < held_.size(); ++k) add_slot(k, 0, count(held_[k].p->value));
  } else {
    // This rank's pieces, in the reducer's order (rank 0 unpacks every rank's in that order).
    std::map<const Parameter*, size_t> index;
    for (size_t k = 0; k < held_.size(); ++k) index[held_[k].p] = k;
    std::vector<size_t> covered(held_.size(), 0);
    for (const auto& pieces : shard_->pieces)
      for (const auto& piece : pieces) {
        auto it = index.find(piece.param);
        if (it == index.end())
          throw std::runtime_error("adamw: the sharded reducer holds parameter '" +
                                   piece.param->name + "', which this optimizer does not update");
        covered[it->second] += piece.n;
      }
    for (size_t k = 0; k < held_.size(); ++k)
      if (covered[k] != count(held_[k].p->value))
        throw std::runtime_error("adamw: parameter '" + held_[k].name +
                                 "' is not reduced by the sharding stage (sync.shard_optimizer)");
    for (const auto& piece : shard_->mine()) add_slot(index[piece.param], piece.begin, piece.n);
    shard_->gather_state = [this] { gather_state(); };
  }
  if (on_device) {
    std::vector<AdamWDeviceSlot> ds;
    for (auto& s : slots_) ds.push_back({s.param, s.begin, s.n, &s.m, &s.v, &held_[s.held].ema});
    std::vector<std::pair<Parameter*, Tensor*>> whole;
    for (auto& h : held_) whole.push_back({h.p, &h.ema});
    device_ = make_adamw_device(*exec, ds, whole, cfg_, shard_);
  }
}

size_t AdamWOptimizer::elements_updated() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s.n;
  return n;
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
  for (const auto& s : slots_) sq += kernels::global_norm_sq(f32(s.param->grad) + s.begin, s.n);
  if (sharded()) shard_->sum(std::span<double>(&sq, 1));  // every rank: the same norm
  rep.grad_norm = std::sqrt(sq) * inv_n;
  rep.lr = cfg_.schedule.at(step_);
  if (!std::isfinite(rep.grad_norm)) {
    // One bad batch must not poison the moments: drop its gradients, keep the weights.
    rep.finite = false;
    for (const auto& h : held_) h.p->grad.zero_();
    return report(rep);
  }
  double scale = inv_n;
  if (cfg_.clip > 0 && rep.grad_norm > cfg_.clip) scale *= cfg_.clip / rep.grad_norm;
  ++step_;
  for (const auto& s : slots_) {
    Parameter& p = *s.param;
    float* g = f32(p.grad) + s.begin;
    if (scale != 1.0) kernels::scale_inplace(g, s.n, static_cast<float>(scale));
    // lr as the device's float table holds it, so CPU and GPU steps agree. Sharded, the bf16
    // copies are written whole after the gather.
    uint16_t* low = shadow(p);
    kernels::adamw_step(f32(p.value) + s.begin, g, f32(s.m), f32(s.v),
                        low && !sharded() ? low + s.begin : nullptr, s.n,
                        static_cast<float>(rep.lr), cfg_.beta1, cfg_.beta2, cfg_.eps,
                        cfg_.weight_decay, p.weight_decay, step_);
  }
  if (sharded()) {
    shard_->gather_weights();
    for (const auto& h : held_) refresh_shadow(*h.p);
  }
  for (const auto& h : held_) {
    h.p->grad.zero_();
    if (cfg_.ema > 0) {
      const float d = static_cast<float>(cfg_.ema), keep = static_cast<float>(1.0 - cfg_.ema);
      float* e = f32(h.ema);
      const float* w = f32(h.p->value);
      kernels::parallel_blocks(count(h.p->value), 2, [&](size_t i0, size_t i1) {
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
  for (const auto& h : held_) {
    float* a = f32(h.p->value);
    float* b = f32(h.ema);
    std::swap_ranges(a, a + count(h.p->value), b);
    refresh_shadow(*h.p);
  }
  ema_swapped_ = !ema_swapped_;
}

void AdamWOptimizer::refresh_shadows() const {
  if (device_) {
    device_->refresh_shadows();
    return;
  }
  for (const auto& h : held_) refresh_shadow(*h.p);
}

void AdamWOptimizer::weights_replaced() {
  if (ema_swapped_) throw std::logic_error("adamw: weights replaced while the EMA is swapped in");
  for (auto& h : held_)
    if (h.ema.defined()) h.ema.copy_from(h.p->value);
  refresh_shadows();
}

void AdamWOptimizer::gather_state() {
  std::vector<float> mine;
  mine.reserve(2 * elements_updated());
  // Device moments come to the host first (a checkpoint's phase: the host may wait).
  for (const Tensor Slot::*t : {&Slot::m, &Slot::v})
    for (const auto& s : slots_) {
      const Tensor h = (s.*t).to(Device::cpu());
      mine.insert(mine.end(), f32(h), f32(h) + s.n);
    }
  shard_->gather_to_root(mine, gathered_);
  gathered_at_ = step_;
}

void AdamWOptimizer::save(StateWriter& w) const {
  w.integer("step", step_);
  w.integer("micro", micro_);
  // Whole moments per parameter: from the slots, or (sharded) from every rank's gathered ones.
  std::vector<Tensor> m(held_.size()), v(held_.size());
  if (!sharded()) {
    for (size_t k = 0; k < held_.size(); ++k) m[k] = slots_[k].m, v[k] = slots_[k].v;
  } else {
    if (gathered_at_ != step_)
      throw std::logic_error(
          "adamw: the optimizer's state is spread over the ranks "
          "(sync.shard_optimizer) and was not gathered at step " +
          std::to_string(step_));
    std::map<const Parameter*, size_t> index;
    for (size_t k = 0; k < held_.size(); ++k) {
      index[held_[k].p] = k;
      m[k] = Tensor::empty(held_[k].p->value.shape(), DType::f32, Device::cpu(), "adamw save");
      v[k] = Tensor::empty(held_[k].p->value.shape(), DType::f32, Device::cpu(), "adamw save");
    }
    size_t at = 0;
    for (const auto& pieces : shard_->pieces) {
      size_t n = 0;
      for (const auto& piece : pieces) n += piece.n;
      if (at + 2 * n > gathered_.size())
        throw std::logic_error("adamw: the gathered optimizer state is short");
      for (const auto& piece : pieces) {
        const size_t k = index.at(piece.param);
        std::memcpy(f32(m[k]) + piece.begin, gathered_.data() + at, piece.n * sizeof(float));
        std::memcpy(f32(v[k]) + piece.begin, gathered_.data() + at + n, piece.n * sizeof(float));
        at += piece.n;
      }
      at += n;
    }
  }
  for (size_t k = 0; k < held_.size(); ++k) {
    const Held& h = held_[k];
    w.tensor("m." + h.name, m[k]);
    w.tensor("v." + h.name, v[k]);
    if (h.ema.defined()) w.tensor("ema." + h.name, ema_swapped_ ? h.p->value : h.ema);
    // Gradients summed over micro-batches of an update not yet applied.
    if (micro_ > 0) w.tensor("grad." + h.name, h.p->grad);
  }
}

void AdamWOptimizer::load(StateReader& r) {
  step_ = r.integer("step");
  micro_ = r.integer("micro");
  if (!sharded()) {
    for (size_t k = 0; k < held_.size(); ++k) {
      r.tensor_into("m." + held_[k].name, slots_[k].m);
      r.tensor_into("v." + held_[k].name, slots_[k].v);
    }
  } else {  // this rank's pieces of the whole moments
    for (size_t k = 0; k < held_.size(); ++k) {
      const Shape& shape = held_[k].p->value.shape();
      Tensor m = Tensor::empty(shape, DType::f32, Device::cpu(), "adamw load");
      Tensor v = Tensor::empty(shape, DType::f32, Device::cpu(), "adamw load");
      r.tensor_into("m." + held_[k].name, m);
      r.tensor_into("v." + held_[k].name, v);
      for (auto& s : slots_) {
        if (s.held != k) continue;
        s.m.copy_from(Tensor::borrow(f32(m) + s.begin, s.m.shape(), DType::f32, Device::cpu()));
        s.v.copy_from(Tensor::borrow(f32(v) + s.begin, s.v.shape(), DType::f32, Device::cpu()));
      }
    }
  }
  for (auto& h : held_) {
    if (h.ema.defined()) {
      if (r.has("ema." + h.name))
        r.tensor_into("ema." + h.name, h.ema);
      else
        h.ema.copy_from(h.p->value);  // resumed from a run without EMA: start it here
    }
    if (micro_ > 0)
      r.tensor_into("grad." + h.name, h.p->grad);
    else
      h.p->grad.zero_();
  }
  if (device_) device_->set_step(step_);
  ema_swapped_ = false;
  refresh_shadows();
}

}  // namespace slipstream::optim
