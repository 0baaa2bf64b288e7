#include "stages/optim/adamw_device.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "stages/ops/with_ops.h"
#include "stages/optim/adamw_optimizer.h"

namespace slipstream::optim {

std::vector<float> lr_table(const LrSchedule& schedule, size_t n) {
  std::vector<float> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<float>(schedule.at(static_cast<int64_t>(i)));
  return t;
}

namespace {

// Host bytes into a buffer on `device` (setup and the rare table growth; synchronous).
void upload(Tensor& dst, const void* src, size_t bytes) {
  if (bytes != dst.nbytes())
    throw std::logic_error("adamw: uploading " + std::to_string(bytes) + " bytes into " +
                           dst.describe());
  dst.copy_from(Tensor::borrow(const_cast<void*>(src), dst.shape(), dst.dtype(), Device::cpu()));
}

template <class Ops>
class AdamWDeviceOn final : public AdamWDevice {
  using K = typename Ops::Table;
  using Segment = typename K::AdamWSegment;
  using State = typename K::AdamWDeviceState;

 public:
  AdamWDeviceOn(Ops ops, const ExecContext& exec, const std::vector<AdamWDeviceSlot>& slots,
                const std::vector<std::pair<Parameter*, Tensor*>>& params, const AdamWConfig& c,
                std::shared_ptr<OptimizerShard> shard)
      : o_(ops), exec_(exec), params_(params), cfg_(c), shard_(std::move(shard)) {
    if (shard_ && (!shard_->sum_on_device || !shard_->gather_weights))
      throw std::logic_error("adamw: a sharded device update needs the device collectives");
    // Elements [begin, begin + n) of a parameter as a segment; m and v may be null.
    auto segment = [](const AdamWDeviceSlot& s, float* m, float* v) {
      Parameter& p = *s.p;
      auto* shadow = p.low_precision.defined()
                         ? reinterpret_cast<kernels::bfloat16*>(p.low_precision.data<uint16_t>())
                         : nullptr;
      const bool ema = s.ema && s.ema->defined();
      return Segment{p.value.data<float>() + s.begin,
                     p.grad.data<float>() + s.begin,
                     m,
                     v,
                     shadow ? shadow + s.begin : nullptr,
                     s.n,
                     p.weight_decay ? 1 : 0,
                     ema ? s.ema->data<float>() + s.begin : nullptr};
    };
    std::vector<Segment> segs;
    std::map<Parameter*, std::vector<std::pair<size_t, size_t>>> covered;  // sharded: [b, e)
    for (const auto& s : slots) {
      segs.push_back(segment(s, s.m->data<float>(), s.v->data<float>()));
      max_n_ = std::max(max_n_, s.n);
      covered[s.p].push_back({s.begin, s.begin + s.n});
    }
    count_ = static_cast<int>(segs.size());
    if (segs.empty()) throw std::logic_error("adamw: no parameters for the device update");
    segs_ = o_.template alloc<uint8_t>(segs.size() * sizeof(Segment), "adamw segment table");
    upload(segs_, segs.data(), segs.size() * sizeof(Segment));
    if (shard_) {
      // The other ranks' pieces: every parameter minus this rank's ranges.
      std::vector<Segment> others;
      for (const auto& pe : params_) {
        Parameter* param = pe.first;
        Tensor* ema = pe.second;
        auto ranges = covered[param];
        std::sort(ranges.begin(), ranges.end());
        const size_t total = static_cast<size_t>(param->value.numel());
        size_t at = 0;
        auto gap = [&](size_t b, size_t e) {
          if (e <= b) return;
          others.push_back(segment({param, b, e - b, nullptr, nullptr, ema}, nullptr, nullptr));
          others_max_n_ = std::max(others_max_n_, e - b);
        };
        for (const auto& [b, e] : ranges) gap(at, b), at = std::max(at, e);
        gap(at, total);
      }
      others_count_ = static_cast<int>(others.size());
      if (!others.empty()) {
        others_ = o_.template alloc<uint8_t>(others.size() * sizeof(Segment),
                                             "adamw gathered segment table");
        upload(others_, others.data(), others.size() * sizeof(Segment));
      }
    }
    state_ = o_.template alloc<uint8_t>(sizeof(State), "adamw device state");
    set_step(0);
    ws_ = o_.template alloc<uint8_t>(std::max<size_t>(1, K::adamw_workspace_bytes(count_, max_n_)),
                                     "adamw workspace");
    size_t largest = 1;
    for (const auto& pe : params_) largest = std::max(largest, size_t(pe.first->value.numel()));
    tmp_ = o_.template alloc<float>(largest, "adamw EMA swap");
    const LrSchedule& sc = c.schedule;
    grow_lr_table(static_cast<size_t>(std::max<int64_t>({1024, sc.warmup + 1, sc.total + 1})));
    hyper_ = {c.beta1,
              c.beta2,
              static_cast<float>(c.eps),
              c.weight_decay,
              static_cast<float>(c.clip),
              static_cast<float>(1.0 / c.accumulate),
              c.ema};
  }

  void step(std::function<void(const AdamWDeviceOutcome&)> on_outcome) override {
    // The device reads lr_table[step]; keep the table ahead of it. The host's count may be one
    // update behind the device's until the outcome is read back: updates enqueued but not yet
    // heard of count as applied.
    if (static_cast<size_t>(step_ + unheard_) + 1 >= lr_len_) grow_lr_table(2 * lr_len_);
    std::function<void(double*)> over_ranks;
    if (shard_) over_ranks = shard_->sum_on_device;
    K::adamw_step(reinterpret_cast<const Segment*>(segs_.raw()), count_, max_n_, hyper_,
                  lr_.template data<float>(), lr_len_, state(), ws_.raw(), o_.stream(), over_ranks);
    if (shard_) {
      shard_->gather_weights();
      if (others_count_ > 0)
        K::adamw_finish_gathered(reinterpret_cast<const Segment*>(others_.raw()), others_count_,
                                 others_max_n_, hyper_, state(), o_.stream());
    }
    ++unheard_;
    exec_.read_back_later(state(), sizeof(State),
                          [this, on_outcome = std::move(on_outcome)](const void* host) {
                            State st;
                            std::memcpy(&st, host, sizeof st);
                            step_ = st.step;
                            --unheard_;
                            on_outcome({st.finite != 0, st.lr, st.grad_norm, st.step});
                          });
  }

  void set_step(int64_t step) override {
    const State st{step, 0.0f, 0.0f, 1.0f, 1};
    upload(state_, &st, sizeof st);
    step_ = step;
  }

  void refresh_shadows() override {
    for (const auto& pe : params_)
      if (Parameter* p = pe.first; p->low_precision.defined())
        o_.to_bf16(p->value.data<float>(), p->low_precision.data<uint16_t>(),
                   static_cast<size_t>(p->value.numel()));
  }

  void swap_ema() override {
    float* t = tmp_.template data<float>();
    for (const auto& pe : params_) {
      Parameter* p = pe.first;
      Tensor* ema = pe.second;
      if (!ema || !ema->defined()) continue;
      float* a = p->value.data<float>();
      float* b = ema->data<float>();
      const size_t n = static_cast<size_t>(p->value.numel());
      o_.copy(t, a, n);
      o_.copy(a, b, n);
      o_.copy(b, t, n);
    }
    refresh_shadows();
  }

 private:
  State* state() const { return reinterpret_cast<State*>(state_.raw()); }

  void grow_lr_table(size_t n) {
    const std::vector<float> t = lr_table(cfg_.schedule, n);
    exec_.synchronize();  // the old table may still be read by queued work
    lr_ = o_.template alloc<float>(n, "adamw learning-rate table");
    upload(lr_, t.data(), n * sizeof(float));
    lr_len_ = n;
  }

  Ops o_;
  const ExecContext& exec_;
  std::vector<std::pair<Parameter*, Tensor*>> params_;  // every parameter whole, and its EMA
  AdamWConfig cfg_;
  std::shared_ptr<OptimizerShard> shard_;
  typename K::AdamWHyper hyper_{};
  int count_ = 0, others_count_ = 0;
  size_t max_n_ = 0, others_max_n_ = 0, lr_len_ = 0;
  int64_t step_ = 0;
  int64_t unheard_ = 0;  // updates enqueued whose outcome is not read back yet
  Tensor segs_, others_, state_, ws_, tmp_, lr_;
};

}  // namespace

std::unique_ptr<AdamWDevice> make_adamw_device(
    const ExecContext& exec, const std::vector<AdamWDeviceSlot>& slots,
    const std::vector<std::pair<Parameter*, Tensor*>>& params, const AdamWConfig& config,
    std::shared_ptr<OptimizerShard> shard) {
  // The CPU form is AdamWOptimizer's own update (it also serves runs without an ExecContext).
  return ops::with_ops(exec, "adamw", [&](auto o) -> std::unique_ptr<AdamWDevice> {
    using Ops = decltype(o);
    if constexpr (Ops::kBackend == KernelBackend::cpu)
      return nullptr;
    else
      return std::make_unique<AdamWDeviceOn<Ops>>(o, exec, slots, params, config, std::move(shard));
  });
}

}  // namespace slipstream::optim
