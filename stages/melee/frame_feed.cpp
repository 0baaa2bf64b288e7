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
          "Frames pushed one at a time by the program holding the graph (libslipstream_policy) "
          "-> batches of one window of one frame (stages/melee/batch_layout.h); targets neutral")
      .role(StageRole::source);
  return declare_window_outputs(s);
}

void FrameFeedStage::setup(StageContext& ctx) {
  WindowBatch::declare(ctx, 1, 1);
  pending_.reset();
}

namespace {
void check_id(const char* what, int32_t v, int32_t n) {
  if (v < 0 || v >= n)
    throw std::invalid_argument(std::string(what) + " " + std::to_string(v) + " is outside [0, " +
                                std::to_string(n) + ")");
}
}  // namespace

void FrameFeedStage::push(const FedFrame& f) {
  for (int s = 0; s < kSlots; ++s) {
    check_id("action state", f.action[s], kActionStates);
    check_id("character", f.character[s], kCharacters);
  }
  check_id("stage", f.stage, kStages);
  pending_ = f;
}

bool FrameFeedStage::produce(Batch& out, StageContext& ctx) {
  if (!pending_) return false;
  const WindowBatch t = WindowBatch::allocate(1, 1, "melee_frames");
  const FedFrame& f = *pending_;
  std::memcpy(t.view.numeric, f.numeric, sizeof f.numeric);
  std::memcpy(t.view.action, f.action, sizeof f.action);
  std::memcpy(t.view.character, f.character, sizeof f.character);
  t.view.stage[0] = f.stage;
  std::memcpy(t.view.prev_controller, f.prev_controller, sizeof f.prev_controller);
  std::memset(t.view.target_buttons, 0, sizeof(float) * kButtons);
  for (int h = 0; h < kStickHeads; ++h)
    t.view.target_sticks[h] = h == kShoulder ? 0 : kStickClasses / 2;
  t.view.mask[0] = 1.0f;
  t.publish(out, ctx);
  out.samples = 1;
  pending_.reset();
  return true;
}

SLIPSTREAM_REGISTER_STAGE(FrameFeedStage);

}  // namespace slipstream::melee
