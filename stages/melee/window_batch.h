// The loader's batch tensors (batch_layout.h) as a stage holds them: allocated together, written
// through one BatchView, published on a batch under the port names, and declared once in a schema
// for every stage that produces them (slippi_replays reads replays, melee_frames is fed frames).
#pragma once

#include <cstdint>

#include "engine/stage.h"
#include "stages/melee/window_index.h"

namespace slipstream::melee {

struct WindowBatch {
  Tensor numeric, action, character, stage, prev_controller, target_buttons, target_sticks, mask;
  Tensor continues;  // (B) f32: 1 where the row's window follows the row's previous window
  BatchView view;    // row-major pointers into the tensors above

  // B windows of W frames on the CPU; `owner` names the allocations (memory reports).
  static WindowBatch allocate(int64_t batch, int64_t window, const char* owner);
  // Declares the output ports' shapes (setup).
  static void declare(StageContext& ctx, int64_t batch, int64_t window);
  // Sets every output port of `ctx`'s stage on `out`.
  void publish(Batch& out, const StageContext& ctx) const;
};

// The output ports of batch_layout.h, declared on `s`.
StageSchema& declare_window_outputs(StageSchema& s);

}  // namespace slipstream::melee
