// The policy's draws on the CPU and on a device (controller_sampler.h).
#include "stages/melee/controller_sampler.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "stages/melee/melee_kernels.h"
#include "stages/ops/with_ops.h"

namespace slipstream::melee {
namespace {

static_assert(sizeof(ChosenController) == (1 + kStickHeads) * sizeof(int32_t),
              "policy_choose writes a ChosenController as 6 int32: buttons, then the classes");

// The heads' ar.weight (81 × 81, the exec context's memory), or null for independent heads.
const float* ar_weight_of(Stage& heads) {
  const Parameter* p = autoregressive_weight_parameter(heads);
  return p ? static_cast<const float*>(p->value.raw()) : nullptr;
}

// Games at a time a worker takes: each is a few microseconds of exps.
constexpr size_t kGamesPerTask = 16;

class HostSampler final : public ControllerSampler {
 public:
  explicit HostSampler(Stage& heads) : heads_(heads) {}
  void draw(const float* const logits[kHeads], float temperature, const uint64_t* game_keys,
            const uint64_t* frames, size_t games, float* distribution,
            ChosenController* chosen) override {
    const float* ar = ar_weight_of(heads_);  // looked up each call: cheap, never stale
    tbb::parallel_for(tbb::blocked_range<size_t>(0, games, kGamesPerTask), [&](const auto& r) {
      for (size_t g = r.begin(); g < r.end(); ++g) {
        float z[kHeadsWidth];
        for (int h = 0; h < kHeads; ++h) {
          const size_t w = static_cast<size_t>(head_width(h));
          std::copy_n(logits[h] + g * w, w, z + head_offset(h));
        }
        heads_distribution(z, distribution + g * kHeadsWidth);
        chosen[g] = choose_controller(z, ar, temperature, frame_draws_key(game_keys[g], frames[g]));
      }
    });
  }

 private:
  Stage& heads_;
};

// One policy_choose launch on the run's stream. The games' keys and frame counters live on the
// device (the kernel counts each game's frames on); `held_*` mirror what is there, so they go in
// (through page-locked staging, in stream order) only when the caller's differ. The kernel
// writes the distributions and the controllers straight into page-locked host memory (the host
// pool's on a CUDA run, which CUDA maps for kernels: ExecContext::read_back_written), read with
// the frame's other read-backs (one wait, the caller's): no copy in the frame's CUDA graph and
// none after it. A stream's frame completes its read-backs before the next is enqueued
// (Runner::stream_next), so one buffer serves every frame. Where the host memory is not mapped
// (pageable), the answers go through device memory and one copy (read_back_later).
template <class Ops>
class DeviceSampler final : public ControllerSampler {
 public:
  DeviceSampler(Ops ops, const ExecContext& exec, Stage& heads)
      : ops_(ops), exec_(exec), heads_(heads) {}
  void draw(const float* const logits[kHeads], float temperature, const uint64_t* game_keys,
            const uint64_t* frames, size_t games, float* distribution,
            ChosenController* chosen) override {
    if (games == 0) return;
    const size_t dist_bytes = games * kHeadsWidth * sizeof(float);
    if (held_keys_.size() != games) {  // a stream's number of games is fixed until it restarts
      keys_ = Tensor::empty(Shape{2, static_cast<int64_t>(games)}, DType::i64, exec_.device());
      const Shape out_shape{static_cast<int64_t>(dist_bytes + games * sizeof(ChosenController))};
      out_ = Tensor::empty(out_shape, DType::u8, Device::cpu(), "the policy's answers");
      out_device_ = exec_.device_address_of_host(out_.raw());
      if (!out_device_) out_ = Tensor::empty(out_shape, DType::u8, exec_.device());
      held_keys_.assign(games, 0);
      held_frames_.assign(games, ~uint64_t{0});  // nothing there yet: the first draw uploads
    }
    auto* device_keys = static_cast<uint64_t*>(keys_.raw());
    if (!std::equal(game_keys, game_keys + games, held_keys_.begin()) ||
        !std::equal(frames, frames + games, held_frames_.begin())) {
      held_keys_.assign(game_keys, game_keys + games);
      held_frames_.assign(frames, frames + games);
      exec_.upload_later(device_keys, game_keys, games * sizeof(uint64_t));
      exec_.upload_later(device_keys + games, frames, games * sizeof(uint64_t));
    }
    typename Ops::Table::HeadPointers hp{};
    for (int h = 0; h < kHeads; ++h) hp.logits[h] = logits[h];
    auto* out = static_cast<char*>(out_device_ ? out_device_ : out_.raw());
    Ops::Table::policy_choose(hp, ar_weight_of(heads_), temperature, device_keys,
                              device_keys + games, games, reinterpret_cast<float*>(out),
                              reinterpret_cast<int32_t*>(out + dist_bytes), ops_.stream());
    for (uint64_t& f : held_frames_) ++f;  // as the kernel counts them
    auto report = [=](const void* host) {
      std::memcpy(distribution, host, dist_bytes);
      std::memcpy(static_cast<void*>(chosen), static_cast<const char*>(host) + dist_bytes,
                  games * sizeof(ChosenController));
    };
    if (out_device_)
      exec_.read_back_written(out_.raw(), report);
    else
      exec_.read_back_later(out, out_.nbytes(), report);
  }

 private:
  Ops ops_;
  const ExecContext& exec_;
  Stage& heads_;
  Tensor keys_, out_;  // (2, games): the games' keys, then their frame counters; the answers
  void* out_device_ = nullptr;  // where kernels write out_ (host memory), or null: out_ is device's
  std::vector<uint64_t> held_keys_, held_frames_;
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
