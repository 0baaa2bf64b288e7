// The policy's draws on the CPU and on a device (controller_sampler.h).
#include "stages/melee/controller_sampler.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstring>

#include "stages/melee/melee_kernels.h"
#include "stages/ops/with_ops.h"

namespace slipstream::melee {
namespace {

static_assert(sizeof(ChosenController) == (1 + kStickHeads) * sizeof(int32_t),
              "policy_choose writes a ChosenController as 6 int32: buttons, then the classes");

// The heads' ar.weight (81 × 81, the exec context's memory), or null for independent heads.
const float* ar_weight_of(Stage& heads) {
  for (Parameter* p : heads.parameters())
    if (p->name == "ar.weight") return static_cast<const float*>(p->value.raw());
  return nullptr;
}

// Games at a time a worker takes: each is a few microseconds of exps.
constexpr size_t kGamesPerTask = 16;

class HostSampler final : public ControllerSampler {
 public:
  explicit HostSampler(Stage& heads) : heads_(heads) {}
  void draw(const float* const logits[kHeads], float temperature, const uint64_t* frame_keys,
            size_t games, float* distribution, ChosenController* chosen) override {
    const float* ar = ar_weight_of(heads_);  // looked up each call: a resume may reload it
    tbb::parallel_for(tbb::blocked_range<size_t>(0, games, kGamesPerTask), [&](const auto& r) {
      for (size_t g = r.begin(); g < r.end(); ++g) {
        float z[kHeadsWidth];
        for (int h = 0; h < kHeads; ++h) {
          const size_t w = static_cast<size_t>(head_width(h));
          std::copy_n(logits[h] + g * w, w, z + head_offset(h));
        }
        heads_distribution(z, distribution + g * kHeadsWidth);
        chosen[g] = choose_controller(z, ar, temperature, frame_keys[g]);
      }
    });
  }

 private:
  Stage& heads_;
};

// One policy_choose launch on the run's stream: the keys go in through page-locked staging in
// stream order, the distributions and the controllers come back the same way, one wait for both.
template <class Ops>
class DeviceSampler final : public ControllerSampler {
 public:
  DeviceSampler(Ops ops, const ExecContext& exec, Stage& heads)
      : ops_(ops), exec_(exec), heads_(heads) {}
  void draw(const float* const logits[kHeads], float temperature, const uint64_t* frame_keys,
            size_t games, float* distribution, ChosenController* chosen) override {
    if (games == 0) return;
    if (games_ != games) {  // a stream's number of games is fixed until it restarts
      keys_ = Tensor::empty(Shape{static_cast<int64_t>(games)}, DType::i64, exec_.device());
      dist_ = Tensor::empty(Shape{static_cast<int64_t>(games), kHeadsWidth}, DType::f32,
                            exec_.device());
      chosen_ = Tensor::empty(Shape{static_cast<int64_t>(games), 1 + kStickHeads}, DType::i32,
                              exec_.device());
      games_ = games;
    }
    exec_.upload_later(keys_.raw(), frame_keys, games * sizeof(uint64_t));
    typename Ops::Table::HeadPointers hp{};
    for (int h = 0; h < kHeads; ++h) hp.logits[h] = logits[h];
    Ops::Table::policy_choose(
        hp, ar_weight_of(heads_), temperature, static_cast<const uint64_t*>(keys_.raw()), games,
        static_cast<float*>(dist_.raw()), static_cast<int32_t*>(chosen_.raw()), ops_.stream());
    exec_.read_back_later(dist_.raw(), dist_.nbytes(), [&](const void* host) {
      std::memcpy(distribution, host, games * kHeadsWidth * sizeof(float));
    });
    exec_.read_back_later(chosen_.raw(), chosen_.nbytes(), [&](const void* host) {
      std::memcpy(static_cast<void*>(chosen), host, games * sizeof(ChosenController));
    });
    exec_.complete_read_backs();
  }

 private:
  Ops ops_;
  const ExecContext& exec_;
  Stage& heads_;
  size_t games_ = 0;
  Tensor keys_, dist_, chosen_;
};

}  // namespace

std::unique_ptr<ControllerSampler> make_controller_sampler(const ExecContext& exec, Stage& heads) {
  return ops::with_ops<MeleeKernelFamily>(
      exec, "the policy's sampler", [&](auto ops) -> std::unique_ptr<ControllerSampler> {
        if constexpr (decltype(ops)::kBackend == KernelBackend::cpu)
          return std::make_unique<HostSampler>(heads);
        else
          return std::make_unique<DeviceSampler<decltype(ops)>>(ops, exec, heads);
      });
}

}  // namespace slipstream::melee
