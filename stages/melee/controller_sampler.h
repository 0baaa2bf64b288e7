// A batch of games' answers from the controller heads' logits, where the logits are: on the CPU
// (controller_choice.h per game, spread over the calling task arena's threads) or on a device
// (one policy_choose kernel on the run's stream, enqueued where the caller's frame is recorded,
// so it replays inside the frame's CUDA graph; only the distributions and the drawn controllers
// come back, in one copy through page-locked staging). Both answer alike: the same
// float operations in the same order, with counter-based draws (frame_draws_key). On a device the
// games' keys and frame counters stay there, counted on by the kernel; they go in only when the
// caller's differ (a stream's start, a game restarted, another seed). The policy library
// (policy/policy.cpp) samples with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/exec_context.h"
#include "engine/stage.h"
#include "stages/melee/controller_choice.h"
#include "stages/melee/model_math.h"

namespace slipstream::melee {

class ControllerSampler {
 public:
  virtual ~ControllerSampler() = default;
  // For each of `games` games (row g of the heads' outputs, in the exec context's memory):
  // distribution[g] (81 floats, the heads' column order: the buttons' probabilities, then each
  // stick head's and the shoulder's softmax) and chosen[g], drawn at `temperature` with the
  // uniforms of frame_draws_key(game_keys[g], frames[g]). The outputs are host memory, written
  // by the time the exec context's read-backs complete (on the CPU at once; on a device the
  // caller completes them, as Runner::stream_next does for the work of its `answer`), and must
  // stay valid until then; the caller then counts frames[g] on by one.
  virtual void draw(const float* const logits[kHeads], float temperature, const uint64_t* game_keys,
                    const uint64_t* frames, size_t games, float* distribution,
                    ChosenController* chosen) = 0;
};

// The sampler of `heads` (a controller_heads stage; its ar.weight, when it has one, conditions
// the draws) for the exec context's backend.
std::unique_ptr<ControllerSampler> make_controller_sampler(const ExecContext& exec, Stage& heads);

}  // namespace slipstream::melee
