// See window_batch.h.
#include "stages/melee/window_batch.h"

#include <string>

namespace slipstream::melee {

WindowBatch WindowBatch::allocate(int64_t b, int64_t W, const char* owner) {
  const std::string o = owner;
  auto make = [&](Shape shape, DType dt, const char* port) {
    return Tensor::empty(shape, dt, Device::cpu(), (o + " " + port).c_str());
  };
  WindowBatch t;
  t.numeric = make(Shape{b, W, kSlots, kNumericFeatures}, DType::f32, "numeric");
  t.action = make(Shape{b, W, kSlots}, DType::i32, "action");
  t.character = make(Shape{b, W, kSlots}, DType::i32, "character");
  t.stage = make(Shape{b, W}, DType::i32, "stage");
  t.prev_controller = make(Shape{b, W, kControllerFeatures}, DType::f32, "prev_controller");
  t.target_buttons = make(Shape{b, W, kButtons}, DType::f32, "target_buttons");
  t.target_sticks = make(Shape{b, W, kStickHeads}, DType::i32, "target_sticks");
  t.mask = make(Shape{b, W}, DType::f32, "mask");
  t.continues = Tensor::zeros(Shape{b}, DType::f32, Device::cpu(), (o + " continues").c_str());
  t.view.window = static_cast<int>(W);
  t.view.numeric = t.numeric.data<float>();
  t.view.action = t.action.data<int32_t>();
  t.view.character = t.character.data<int32_t>();
  t.view.stage = t.stage.data<int32_t>();
  t.view.prev_controller = t.prev_controller.data<float>();
  t.view.target_buttons = t.target_buttons.data<float>();
  t.view.target_sticks = t.target_sticks.data<int32_t>();
  t.view.mask = t.mask.data<float>();
  t.view.continues = t.continues.data<float>();
  return t;
}

void WindowBatch::declare(StageContext& ctx, int64_t b, int64_t W) {
  ctx.declare_output("numeric", Shape{b, W, kSlots, kNumericFeatures}, DType::f32);
  ctx.declare_output("action", Shape{b, W, kSlots}, DType::i32);
  ctx.declare_output("character", Shape{b, W, kSlots}, DType::i32);
  ctx.declare_output("stage", Shape{b, W}, DType::i32);
  ctx.declare_output("prev_controller", Shape{b, W, kControllerFeatures}, DType::f32);
  ctx.declare_output("target_buttons", Shape{b, W, kButtons}, DType::f32);
  ctx.declare_output("target_sticks", Shape{b, W, kStickHeads}, DType::i32);
  ctx.declare_output("mask", Shape{b, W}, DType::f32);
  ctx.declare_output("continues", Shape{b}, DType::f32);
}

void WindowBatch::publish(Batch& out, const StageContext& ctx) const {
  ctx.set_output(out, "numeric", numeric);
  ctx.set_output(out, "action", action);
  ctx.set_output(out, "character", character);
  ctx.set_output(out, "stage", stage);
  ctx.set_output(out, "prev_controller", prev_controller);
  ctx.set_output(out, "target_buttons", target_buttons);
  ctx.set_output(out, "target_sticks", target_sticks);
  ctx.set_output(out, "mask", mask);
  ctx.set_output(out, "continues", continues);
}

StageSchema& declare_window_outputs(StageSchema& s) {
  return s.output("numeric", DType::f32, 4, "(B, W, slots, features) raw post-frame values")
      .output("action", DType::i32, 3, "(B, W, slots) action state, clamped")
      .output("character", DType::i32, 3, "(B, W, slots) internal character id")
      .output("stage", DType::i32, 2, "(B, W) stage id")
      .output("prev_controller", DType::f32, 3, "(B, W, 13) the player's controller at t + D")
      .output("target_buttons", DType::f32, 3, "(B, W, 8) buttons at t + D + 1")
      .output("target_sticks", DType::i32, 3, "(B, W, 5) stick/shoulder classes at t + D + 1")
      .output("mask", DType::f32, 2, "(B, W) 1 for real data, 0 for padding")
      .output("continues", DType::f32, 1,
              "(B) 1 where the row's window starts right after the row's window in the previous "
              "batch (same game and player: rows: streams), else 0");
}

}  // namespace slipstream::melee
