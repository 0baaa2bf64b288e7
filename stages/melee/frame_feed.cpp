// See frame_feed.h.
#include "stages/melee/frame_feed.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/registry.h"
#include "stages/melee/window_batch.h"

namespace slipstream::melee {

StageSchema FrameFeedStage::schema() {
  StageSchema s("melee_frames");
  s.family("melee")
      .doc(
          "Frames pushed by the program holding the graph (libslipstream_policy), one of each "
          "of n games -> batches of n windows of one frame (stages/melee/batch_layout.h); "
          "targets neutral")
      .role(StageRole::source);
  return declare_window_outputs(s);
}

void FrameFeedStage::setup(StageContext& ctx) {
  WindowBatch::declare(ctx, 1, 1);
  pending_.clear();
}

namespace {
void check_id(const char* what, int32_t v, int32_t n) {
  if (v < 0 || v >= n)
    throw std::invalid_argument(std::string(what) + " " + std::to_string(v) + " is outside [0, " +
                                std::to_string(n) + ")");
}
}  // namespace

void FrameFeedStage::push(std::span<const FedFrame> frames) {
  if (frames.empty()) throw std::invalid_argument("no frame to push");
  for (const FedFrame& f : frames) {
    for (int s = 0; s < kSlots; ++s) {
      check_id("action state", f.action[s], kActionStates);
      check_id("character", f.character[s], kCharacters);
    }
    check_id("stage", f.stage, kStages);
  }
  pending_.assign(frames.begin(), frames.end());
}

bool FrameFeedStage::produce(Batch& out, StageContext& ctx) {
  if (pending_.empty()) return false;
  const int64_t n = static_cast<int64_t>(pending_.size());
  const WindowBatch t = WindowBatch::allocate(n, 1, "melee_frames");
  for (size_t i = 0; i < pending_.size(); ++i) {
    const FedFrame& f = pending_[i];
    std::memcpy(t.view.numeric + i * kSlots * kNumericFeatures, f.numeric, sizeof f.numeric);
    std::memcpy(t.view.action + i * kSlots, f.action, sizeof f.action);
    std::memcpy(t.view.character + i * kSlots, f.character, sizeof f.character);
    t.view.stage[i] = f.stage;
    std::memcpy(t.view.prev_controller + i * kControllerFeatures, f.prev_controller,
                sizeof f.prev_controller);
    std::memset(t.view.target_buttons + i * kButtons, 0, sizeof(float) * kButtons);
    for (int h = 0; h < kStickHeads; ++h)
      t.view.target_sticks[i * kStickHeads + static_cast<size_t>(h)] =
          h == kShoulder ? 0 : kStickClasses / 2;
    t.view.mask[i] = 1.0f;
  }
  t.publish(out, ctx);
  out.samples = static_cast<uint64_t>(n);
  pending_.clear();
  return true;
}

SLIPSTREAM_REGISTER_STAGE(FrameFeedStage);

}  // namespace slipstream::melee
