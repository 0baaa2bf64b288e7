// The tensors the Melee loader produces and the model stages consume: one place that fixes the
// feature order, the label alignment and the controller discretisation.
//
// A batch holds B windows of W consecutive frames seen from one player ("the player", always
// character slot 0; the opponent is slot 1; the player's Ice Climbers follower Nana is slot 2,
// zeros with exists = 0 when absent).
//
// Alignment (frame delay D >= 0). For window position i showing game frame t (post-frame state):
//   features      : the post-frame state of frame t for every slot, and the player's controller
//                   of frame t + D (the last input the player had chosen when deciding);
//   label         : the player's controller of frame t + D + 1 (the next input to choose).
// So the label frame is always after every frame the features read; tests check it.
//
// Output ports of the loader (all (B, W, ...), row-major):
//   numeric         f32 (B, W, kSlots, kNumericFeatures): raw values, the k* feature indices
//   action          i32 (B, W, kSlots): action state id, clamped to [0, kActionStates)
//   character       i32 (B, W, kSlots): internal character id, [0, kCharacters)
//   stage           i32 (B, W): stage id, [0, kStages)
//   prev_controller f32 (B, W, kControllerFeatures): the player's controller at t + D
//   target_buttons  f32 (B, W, kButtons): 0/1 at t + D + 1
//   target_sticks   i32 (B, W, kStickHeads): class ids at t + D + 1, kMainX .. kShoulder
//   mask            f32 (B, W): 1 where the position is real data
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace slipstream::melee {

inline constexpr int kSlots = 3;  // player, opponent, player's follower (Nana)
inline constexpr int kActionStates = 399;
inline constexpr int kCharacters = 33;
inline constexpr int kStages = 64;

// numeric[..., slot, f]: raw values straight from the replay (the embedding normalises).
// Plain int constants (not enums) so indices combine freely in arithmetic.
inline constexpr int kPercent = 0;       // damage percent
inline constexpr int kFacing = 1;        // +1 right, -1 left
inline constexpr int kPosX = 2;          // position x
inline constexpr int kPosY = 3;          // position y
inline constexpr int kShield = 4;        // shield size, 0..60
inline constexpr int kJumpsLeft = 5;     // remaining jumps
inline constexpr int kOnGround = 6;      // 1 when grounded (not airborne)
inline constexpr int kInvulnerable = 7;  // 1 when intangible/invincible (state flags)
inline constexpr int kHitlag = 8;        // hitlag frames left
inline constexpr int kHitstun = 9;       // hitstun frames left
inline constexpr int kActionFrame = 10;  // frames into the action state
inline constexpr int kSpeedAirX =
    11;                             // self-induced air x speed (0 when the replay predates speeds)
inline constexpr int kSpeedY = 12;  // self-induced y speed
inline constexpr int kSpeedAttackX = 13;  // knockback x speed
inline constexpr int kSpeedAttackY = 14;  // knockback y speed
inline constexpr int kSpeedGroundX = 15;  // self-induced ground x speed
inline constexpr int kStocks = 16;        // stocks remaining
inline constexpr int kExists = 17;        // 1 when the slot has a character this frame
inline constexpr int kNumericFeatures = 18;

// The embedding's normalisation: value * scale (documented in docs/melee_features.md).
inline constexpr float kNumericScale[kNumericFeatures] = {
    0.01f,  // percent
    1.0f,   // facing
    0.05f,  // x
    0.05f,  // y
    0.01f,  // shield
    1.0f,   // jumps left
    1.0f,   // on ground
    1.0f,   // invulnerable
    0.1f,   // hitlag
    0.02f,  // hitstun
    0.01f,  // action frame
    0.5f,   // speeds
    0.5f,  0.5f, 0.5f, 0.5f,
    0.25f,  // stocks
    1.0f,   // exists
};

// Buttons, in label order.
inline constexpr int kA = 0, kB = 1, kX = 2, kY = 3, kZ = 4, kL = 5, kR = 6, kDUp = 7, kButtons = 8;

// Controller features (prev_controller): the 8 buttons (0/1), then the sticks and shoulder as
// analog values: main x, main y, c x, c y in [-1, 1], shoulder in [0, 1].
inline constexpr int kControllerFeatures = kButtons + 5;

// Discretised heads: main stick x/y and c-stick x/y in 17 classes, shoulder in 5.
inline constexpr int kMainX = 0, kMainY = 1, kCX = 2, kCY = 3, kShoulder = 4, kStickHeads = 5;
inline constexpr int kStickClasses = 17;
inline constexpr int kShoulderClasses = 5;
inline constexpr int head_classes(int head) {
  return head == kShoulder ? kShoulderClasses : kStickClasses;
}

// Stick value in [-1, 1] -> class 0..16 (class 8 is neutral); shoulder [0, 1] -> 0..4.
inline int stick_class(float v) {
  float c = std::nearbyint((std::clamp(v, -1.0f, 1.0f) + 1.0f) * 0.5f * (kStickClasses - 1));
  return static_cast<int>(c);
}
inline float stick_value(int cls) {
  return static_cast<float>(cls) / (kStickClasses - 1) * 2.0f - 1.0f;
}
inline int shoulder_class(float v) {
  return static_cast<int>(std::nearbyint(std::clamp(v, 0.0f, 1.0f) * (kShoulderClasses - 1)));
}
inline float shoulder_value(int cls) {
  return static_cast<float>(cls) / (kShoulderClasses - 1);
}

// The previous input in the heads' terms (melee_embedding's prev_classes): the class of each
// stick axis and the shoulder, one-hot, in head order (main x, main y, c x, c y: 17 columns
// each; shoulder: 5). model_math.h's prev_head_class gives the class.
inline constexpr int kPrevClassFeatures = 4 * kStickClasses + kShoulderClasses;
inline constexpr int prev_class_column(int head) {
  return head * kStickClasses;
}

}  // namespace slipstream::melee
