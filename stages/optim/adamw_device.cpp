#include "stages/optim/adamw_device.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "stages/nn/ops_backend.h"
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
                const AdamWConfig& c)
      : o_(ops), exec_(exec), slots_(slots), cfg_(c) {
    std::vector<Segment> segs;
    for (const auto& s : slots_) {
      Parameter& p = *s.p;
      const size_t n = static_cast<size_t>(p.value.numel());
      auto* shadow = p.low_precision.defined()
                         ? reinterpret_cast<kernels::bfloat16*>(p.low_precision.data<uint16_t>())
                         : nullptr;
      segs.push_back({p.value.data<float>(), p.grad.data<float>(), s.m->data<float>(),
                      s.v->data<float>(), shadow, n, p.weight_decay ? 1 : 0,
                      s.ema && s.ema->defined() ? s.ema->data<float>() : nullptr});
      max_n_ = std::max(max_n_, n);
    }
    count_ = static_cast<int>(segs.size());
    if (segs.empty()) throw std::logic_error("adamw: no parameters for the device update");
    segs_ = o_.template alloc<uint8_t>(segs.size() * sizeof(Segment), "adamw segment table");
    upload(segs_, segs.data(), segs.size() * sizeof(Segment));
    state_ = o_.template alloc<uint8_t>(sizeof(State), "adamw device state");
    set_step(0);
    ws_ = o_.template alloc<uint8_t>(std::max<size_t>(1, K::adamw_workspace_bytes(count_, max_n_)),
                                     "adamw workspace");
    tmp_ = o_.template alloc<float>(std::max<size_t>(1, max_n_), "adamw EMA swap");
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
    K::adamw_step(reinterpret_cast<const Segment*>(segs_.raw()), count_, max_n_, hyper_,
                  lr_.template data<float>(), lr_len_, state(), ws_.raw(), o_.stream());
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
    for (const auto& s : slots_)
      if (s.p->low_precision.defined())
        o_.to_bf16(s.p->value.data<float>(), s.p->low_precision.data<uint16_t>(),
                   static_cast<size_t>(s.p->value.numel()));
  }

  void swap_ema() override {
    float* t = tmp_.template data<float>();
    for (const auto& s : slots_) {
      if (!s.ema || !s.ema->defined()) continue;
      float* a = s.p->value.data<float>();
      float* b = s.ema->data<float>();
      const size_t n = static_cast<size_t>(s.p->value.numel());
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
  std::vector<AdamWDeviceSlot> slots_;
  AdamWConfig cfg_;
  typename K::AdamWHyper hyper_{};
  int count_ = 0;
  size_t max_n_ = 0, lr_len_ = 0;
  int64_t step_ = 0;
  int64_t unheard_ = 0;  // updates enqueued whose outcome is not read back yet
  Tensor segs_, state_, ws_, tmp_, lr_;
};

}  // namespace

std::unique_ptr<AdamWDevice> make_adamw_device(const ExecContext& exec,
                                               const std::vector<AdamWDeviceSlot>& slots,
                                               const AdamWConfig& config) {
  return nn::make_device_path<AdamWDevice, AdamWDeviceOn>(exec, "adamw", exec, slots, config);
}

}  // namespace slipstream::optim
