// melee_frames: a source fed by the program that holds the graph (the policy library,
// libslipstream_policy): each produce() hands out the frames pushed since the last one, one
// frame of each of n games, as a batch of n windows of one frame (row i: game i), laid out as
// batch_layout.h says; with nothing pushed it ends the data. The targets are unknown (neutral
// controller, mask 1): the stages before the loss are what such a graph runs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/stage.h"
#include "stages/melee/batch_layout.h"

namespace slipstream::melee {

// One frame's features, as one position of the loader's tensors.
struct FedFrame {
  float numeric[kSlots][kNumericFeatures] = {};  // raw values, kPercent..kExists order
  int32_t action[kSlots] = {};                   // [0, kActionStates)
  int32_t character[kSlots] = {};                // [0, kCharacters)
  int32_t stage = 0;                             // [0, kStages)
  float prev_controller[kControllerFeatures] = {};
};

class FrameFeedStage : public Stage {
 public:
  static StageSchema schema();
  void setup(StageContext& ctx) override;
  // The next frame of each game to hand out (n >= 1). Ids out of range throw
  // std::invalid_argument, and nothing is pushed.
  void push(std::span<const FedFrame> frames);
  void push(const FedFrame& frame) { push(std::span<const FedFrame>(&frame, 1)); }
  bool produce(Batch& out, StageContext& ctx) override;

 private:
  std::vector<FedFrame> pending_;
};

}  // namespace slipstream::melee
