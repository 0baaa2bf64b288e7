#include "stages/melee/slp/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "stages/melee/slp/writer.h"

namespace slipstream::slp {
namespace {

// splitmix64: seeds everything random (setup only; inputs never use it).
uint64_t mix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Physical button bits (SPEC.md, Physical Buttons).
constexpr uint16_t kDpadUp = 0x0008, kZ = 0x0010, kR = 0x0020, kL = 0x0040, kA = 0x0100,
                   kB = 0x0200, kX = 0x0400, kY = 0x0800;
// Processed-only bits.
constexpr uint32_t kStickUp = 0x10000, kStickDown = 0x20000, kStickLeft = 0x40000,
                   kStickRight = 0x80000, kCUp = 0x100000, kCDown = 0x200000, kCLeft = 0x400000,
                   kCRight = 0x800000, kAnyTrigger = 0x80000000;

// Common action state ids.
enum Action : uint16_t {
  kDeadDown = 0,
  kWait = 14,
  kDash = 20,
  kJumpF = 25,
  kFall = 29,
  kLanding = 42,
  kAttack11 = 44,
  kAttackS4 = 62,
  kDamageFly = 91,
  kGuard = 179,
  kCatch = 212,
  kSpecial = 341,
  kAppeal = 264,
  kEntry = 322,  // the countdown before the players can move
};

struct Fighter {
  uint8_t external = 0;
  uint8_t internal = 0;
  // Policy parameters: a function of the character (the model sees the character id, not these).
  float reach = 0;
  float aggression = 0;
  float jump_height = 0;
  // State.
  float x = 0, y = 0, vx = 0, vy = 0, facing = 1;
  float percent = 0, shield = 60;
  float hitstun = 0, hitlag = 0, state_age = 0;
  uint16_t action = kEntry;
  uint8_t stocks = 4, jumps = 2, combo = 0, last_attack = 0, last_hit_by = 6;
  bool airborne = false, fastfall = false;
  uint16_t instance = 1, instance_hit_by = 0;
  uint8_t l_cancel = 0;
  int respawn = 0;
  bool attacking() const {
    return action == kAttack11 || action == kAttackS4 || action == kSpecial || action == kCatch;
  }
};

struct Inputs {
  float stick_x = 0, stick_y = 0, cstick_x = 0, cstick_y = 0, trigger = 0;
  uint16_t physical = 0;
};

constexpr float kStageHalfWidth = 70;
constexpr float kPlatformY = 27;
constexpr float kPlatformHalfWidth = 20;
constexpr float kBlastX = 220, kBlastTop = 190, kBlastBottom = -110;

// Each character plays with its own reach, aggression and jump height, so the policy stays a
// function of visible state (the character id) while still differing between characters.
struct CharacterPick {
  uint8_t external, internal;
  float reach, aggression, jump_height;
};
constexpr CharacterPick kCharacters[] = {
    {2, 1, 12, 0.8f, 14},   {20, 22, 15, 1.2f, 10}, {9, 18, 16, 0.6f, 18}, {19, 7, 10, 1.4f, 12},
    {15, 15, 11, 1.0f, 20}, {0, 2, 14, 0.5f, 9},    {12, 9, 13, 1.5f, 16}, {16, 13, 12, 0.7f, 8},
    {13, 12, 16, 1.1f, 15}, {25, 25, 10, 0.9f, 11}};
constexpr uint16_t kStages[] = {2, 3, 8, 28, 31, 32};

float clampf(float v, float lo, float hi) {
  return std::min(hi, std::max(lo, v));
}
float sign(float v) {
  return v < 0 ? -1.0f : 1.0f;
}

}  // namespace

// "+ 0.0f" turns -0 into 0, so the grid has exactly 17 values.
float bucket_stick_axis(float v) {
  return std::round(clampf(v, -1, 1) * 8) / 8 + 0.0f;
}

namespace {

// The policy: what a player presses given what both players' last Post-Frame showed.
Inputs decide(const Fighter& me, const Fighter& them) {
  Inputs in;
  // No input while waiting to respawn or through the countdown (both visible action states).
  if (me.respawn > 0 || me.action == kDeadDown || me.action == kEntry) return in;
  const float dx = them.x - me.x, dy = them.y - me.y, dist = std::fabs(dx);
  // Head toward the opponent, back off when on top of them, recover toward the stage.
  // Each stick step spans several units of distance (0.75 reach in x, 7.5 in y), so the 17-value
  // grid stays learnable from positions a model sees at 0.05 per unit.
  // The approach is at least a quarter tilt, so players cross the back-off distance quickly
  // instead of creeping along it.
  float sx = dist < me.reach * 0.5f ? -sign(dx) * 0.5f
                                    : sign(dx) * clampf(dist / (me.reach * 6), 0.25f, 1);
  if (std::fabs(me.x) > kStageHalfWidth) sx = -sign(me.x);
  float sy = clampf(dy / 60, -1, 1);
  if (me.hitstun > 0) sy = -sy;  // directional influence away
  in.stick_x = bucket_stick_axis(sx);
  in.stick_y = bucket_stick_axis(sy);

  const bool close = dist < me.reach && std::fabs(dy) < 12;
  // Shield an attack in its startup, while the shield is healthy; its parity varies as it wears.
  const bool threat = them.attacking() && them.state_age < 3 && dist < me.reach * 1.6f;
  if (threat && !me.airborne && me.shield > 20 && static_cast<int>(me.shield) % 2 == 0) {
    // Analog pressure grows as the threat closes in; L or R by side.
    in.trigger = clampf(1.0f - dist / (me.reach * 1.6f), 0.3f, 1.0f);
    in.physical |= dx < 0 ? kL : kR;
  } else if (close && them.action == kGuard) {
    in.physical |= kZ;  // grab a shield
  } else if (close && them.percent > 50 * me.aggression && !me.airborne) {
    in.cstick_x = sign(dx);  // smash toward them
  } else if (close) {
    in.physical |= kA;
  } else if (dist > me.reach * 4 && dist < me.reach * 8 && me.percent < 100) {
    in.physical |= kB;  // projectile from range
  }
  const bool chase = me.y < them.y - me.jump_height;
  const bool recover = me.y < -5;
  const bool jump_in =
      dist > me.reach * 1.5f && dist < me.reach * 3 && static_cast<int>(them.percent) % 4 == 1;
  if ((chase || recover || jump_in) && me.jumps > 0 && me.vy <= 0)
    in.physical |= me.facing > 0 ? kX : kY;
  if (recover && me.jumps == 0) in.cstick_y = 1;  // up-smash-ish recovery flail
  // Taunt a lost stock, a far-away opponent, or one sent flying out of reach.
  if (them.action == kDeadDown || dist > 150 ||
      (them.action == kDamageFly && dist > me.reach * 1.5f))
    in.physical |= kDpadUp;
  if (me.airborne && me.vy < 0 && dy < -30) in.cstick_y = -1;
  in.cstick_x = bucket_stick_axis(in.cstick_x);
  in.cstick_y = bucket_stick_axis(in.cstick_y);
  return in;
}

uint32_t processed_buttons(const Inputs& in) {
  uint32_t b = in.physical;
  if (in.physical & kZ) b |= kA | kAnyTrigger;  // Z is A plus a light shield press
  if (in.trigger > 0) b |= kAnyTrigger;
  if (in.stick_y >= 0.5f) b |= kStickUp;
  if (in.stick_y <= -0.5f) b |= kStickDown;
  if (in.stick_x <= -0.5f) b |= kStickLeft;
  if (in.stick_x >= 0.5f) b |= kStickRight;
  if (in.cstick_y >= 0.5f) b |= kCUp;
  if (in.cstick_y <= -0.5f) b |= kCDown;
  if (in.cstick_x <= -0.5f) b |= kCLeft;
  if (in.cstick_x >= 0.5f) b |= kCRight;
  return b;
}

void set_action(Fighter& f, uint16_t action, uint16_t& instance_counter) {
  if (f.action != action) {
    f.action = action;
    f.state_age = 0;
    f.instance = ++instance_counter;
  }
}

// Advances one fighter by one frame; hits land on `them`.
void step(Fighter& me, Fighter& them, const Inputs& in, uint16_t& instance_counter, int me_port) {
  me.state_age += 1;
  if (me.respawn > 0) {
    if (--me.respawn == 0) {
      me.x = 0, me.y = 50, me.vx = me.vy = 0, me.percent = 0, me.airborne = true;
      set_action(me, kFall, instance_counter);
    }
    return;
  }
  if (me.hitlag > 0) {
    me.hitlag = std::max(0.0f, me.hitlag - 1);
    return;
  }
  const bool shielding = in.trigger > 0 && !me.airborne;
  if (me.hitstun > 0) {
    me.hitstun = std::max(0.0f, me.hitstun - 1);
    me.vx *= 0.95f;
  } else if (shielding) {
    set_action(me, kGuard, instance_counter);
    me.vx = 0;
    me.shield = std::max(0.0f, me.shield - 0.15f * in.trigger);
  } else {
    me.shield = std::min(60.0f, me.shield + 0.07f);
    const float speed = me.airborne ? 0.9f : 1.5f;
    me.vx = me.vx * 0.8f + in.stick_x * speed * 0.2f * 5;
    if (std::fabs(in.stick_x) > 0.1f) me.facing = sign(in.stick_x);
    if ((in.physical & (kX | kY)) && me.jumps > 0) {
      me.vy = 3.2f;
      --me.jumps;
      me.airborne = true;
      set_action(me, kJumpF, instance_counter);
    }
    if (in.physical & kA) set_action(me, kAttack11, instance_counter);
    if (in.cstick_x != 0) set_action(me, kAttackS4, instance_counter);
    if (in.physical & kB) set_action(me, kSpecial, instance_counter);
    if (in.physical & kZ) set_action(me, kCatch, instance_counter);
    if (in.physical & kDpadUp && !me.airborne) set_action(me, kAppeal, instance_counter);
    me.fastfall = me.airborne && in.stick_y <= -0.5f && me.vy < 0;
  }
  // Hits: attacks connect on the first active frame when in reach.
  if (me.attacking() && me.state_age == 3 && std::fabs(them.x - me.x) < 18 &&
      std::fabs(them.y - me.y) < 15 && them.respawn == 0) {
    if (them.action == kGuard && me.action != kCatch) {
      them.shield = std::max(0.0f, them.shield - 8);
      me.hitlag = them.hitlag = 3;
    } else {
      const float damage = me.action == kAttackS4  ? 16.0f
                           : me.action == kSpecial ? 9.0f
                           : me.action == kCatch   ? 7.0f
                                                   : 4.0f;
      them.percent += damage;
      const float kb = 0.6f + them.percent * (me.action == kAttackS4 ? 0.045f : 0.02f);
      them.vx = sign(them.x - me.x) * kb * 1.4f;
      them.vy = kb;
      them.airborne = true;
      them.hitstun = kb * 12;
      them.hitlag = me.hitlag = std::floor(damage / 3 + 3);
      them.last_hit_by = static_cast<uint8_t>(me_port);
      them.instance_hit_by = me.instance;
      me.last_attack = static_cast<uint8_t>(me.action == kAttackS4  ? 10
                                            : me.action == kSpecial ? 18
                                                                    : 2);
      me.combo = static_cast<uint8_t>(std::min(255, me.combo + 1));
      set_action(them, kDamageFly, instance_counter);
    }
  }
  if (me.attacking() && me.state_age > 20)
    set_action(me, me.airborne ? kFall : kWait, instance_counter);
  // Gravity and ground.
  if (me.airborne) me.vy = std::max(me.fastfall ? -3.0f : -2.2f, me.vy - 0.13f);
  me.x += me.vx;
  me.y += me.vy;
  const bool over_stage = std::fabs(me.x) <= kStageHalfWidth;
  const bool over_platform = std::fabs(me.x) <= kPlatformHalfWidth;
  float ground = -1e9f;
  if (over_platform && me.y - me.vy >= kPlatformY && me.y <= kPlatformY)
    ground = kPlatformY;
  else if (over_stage && me.y - me.vy >= 0 && me.y <= 0)
    ground = 0;
  if (me.airborne && me.vy <= 0 && ground > -1e8f) {
    me.y = ground;
    me.vy = 0;
    me.airborne = false;
    me.jumps = 2;
    me.l_cancel = me.attacking() ? (in.trigger > 0 ? 1 : 2) : 0;
    set_action(me, kLanding, instance_counter);
  } else if (!me.airborne && !over_stage) {
    me.airborne = true;
    set_action(me, kFall, instance_counter);
  }
  if (!me.airborne && me.action == kLanding && me.state_age > 4)
    set_action(me, kWait, instance_counter);
  if (!me.airborne && me.action == kWait && std::fabs(me.vx) > 0.5f)
    set_action(me, kDash, instance_counter);
  if (!me.airborne && me.action == kDash && std::fabs(me.vx) <= 0.5f)
    set_action(me, kWait, instance_counter);
  if (me.action == kDamageFly && me.hitstun <= 0)
    set_action(me, me.airborne ? kFall : kWait, instance_counter);
  if (me.action == kGuard && in.trigger == 0) set_action(me, kWait, instance_counter);
  // Blast zones.
  if (std::fabs(me.x) > kBlastX || me.y > kBlastTop || me.y < kBlastBottom) {
    me.stocks = me.stocks > 0 ? me.stocks - 1 : 0;
    me.respawn = me.stocks > 0 ? 60 : 1 << 30;
    me.combo = 0;
    me.hitstun = me.hitlag = 0;
    me.vx = me.vy = 0;
    set_action(me, kDeadDown, instance_counter);
    them.combo = 0;
  }
}

void record_pre(CharacterFrames& ch, size_t row, const Fighter& f, const Inputs& in,
                uint32_t seed) {
  ch.present[row] |= kHasPre;
  auto& p = ch.pre;
  p.random_seed[row] = seed;
  p.action_state[row] = f.action;
  p.x[row] = f.x;
  p.y[row] = f.y;
  p.facing[row] = f.facing;
  p.joystick_x[row] = in.stick_x;
  p.joystick_y[row] = in.stick_y;
  p.cstick_x[row] = in.cstick_x;
  p.cstick_y[row] = in.cstick_y;
  p.trigger[row] = in.trigger;
  p.buttons[row] = processed_buttons(in);
  p.buttons_physical[row] = in.physical;
  p.trigger_physical_l[row] = (in.physical & kL) ? in.trigger : 0;
  p.trigger_physical_r[row] = (in.physical & kR) ? in.trigger : 0;
  p.raw_joystick_x[row] = static_cast<int8_t>(in.stick_x * 80);
  p.percent[row] = f.percent;
  p.raw_joystick_y[row] = static_cast<int8_t>(in.stick_y * 80);
  p.raw_cstick_x[row] = static_cast<int8_t>(in.cstick_x * 80);
  p.raw_cstick_y[row] = static_cast<int8_t>(in.cstick_y * 80);
}

void record_post(CharacterFrames& ch, size_t row, const Fighter& f) {
  ch.present[row] |= kHasPost;
  auto& p = ch.post;
  p.character[row] = f.internal;
  p.action_state[row] = f.action;
  p.x[row] = f.x;
  p.y[row] = f.y;
  p.facing[row] = f.facing;
  p.percent[row] = f.percent;
  p.shield[row] = f.shield;
  p.last_attack_landed[row] = f.last_attack;
  p.combo_count[row] = f.combo;
  p.last_hit_by[row] = f.last_hit_by;
  p.stocks[row] = f.stocks;
  p.state_age[row] = f.state_age;
  p.state_flags_1[row] = 0;
  p.state_flags_2[row] = static_cast<uint8_t>((f.fastfall ? 0x08 : 0) | (f.hitlag > 0 ? 0x20 : 0));
  p.state_flags_3[row] = f.action == kGuard ? 0x80 : 0;
  p.state_flags_4[row] = f.hitstun > 0 ? 0x02 : 0;
  p.state_flags_5[row] = static_cast<uint8_t>(f.respawn > 0 ? 0x40 : 0);
  p.misc_as[row] = f.hitstun;
  p.airborne[row] = f.airborne ? 1 : 0;
  p.last_ground_id[row] = f.y >= kPlatformY ? 1 : 0;
  p.jumps_remaining[row] = f.jumps;
  p.l_cancel[row] = f.l_cancel;
  p.hurtbox_state[row] = f.respawn > 0 ? 1 : 0;
  p.self_air_x_speed[row] = f.airborne ? f.vx : 0;
  p.self_y_speed[row] = f.vy;
  p.attack_x_speed[row] = f.hitstun > 0 ? f.vx : 0;
  p.attack_y_speed[row] = f.hitstun > 0 ? f.vy : 0;
  p.self_ground_x_speed[row] = f.airborne ? 0 : f.vx;
  p.hitlag_remaining[row] = f.hitlag;
  p.animation_index[row] = f.action;
  p.instance_hit_by[row] = f.instance_hit_by;
  p.instance_id[row] = f.instance;
}

template <class Columns>
void resize_columns(Columns& cols, size_t n) {
  Columns::visit(cols, [n](FieldDesc, auto& col) { col.resize(n); });
}

}  // namespace

Game synthesize_game(const SynthOptions& options) {
  uint64_t rng = options.seed;
  Game game;
  GameInfo& info = game.info;
  GameStart& s = info.start;
  s.version = {3, 18, 0};
  s.bitfield = {50, 1, 134, 76};
  s.item_spawn_behavior = -1;
  s.self_destruct_score = -1;
  s.stage = kStages[mix(rng) % std::size(kStages)];
  s.timer = 480;
  s.item_spawn_bitfield = {255, 255, 255, 255, 255};
  s.damage_ratio = 1.0f;
  s.random_seed = static_cast<uint32_t>(mix(rng));
  s.is_pal = false;
  s.is_frozen_ps = false;
  s.minor_scene = 2;
  s.major_scene = 8;
  s.language = 1;
  char match_id[64];
  std::snprintf(match_id, sizeof match_id, "mode.synthetic-%016llx",
                static_cast<unsigned long long>(options.seed));
  s.match_id = match_id;
  s.game_number = 1;

  Fighter fighters[2];
  for (int i = 0; i < 2; ++i) {
    const CharacterPick pick = kCharacters[mix(rng) % std::size(kCharacters)];
    Fighter& f = fighters[i];
    f.external = pick.external;
    f.internal = pick.internal;
    f.reach = pick.reach;
    f.aggression = pick.aggression;
    f.jump_height = pick.jump_height;
    f.x = i == 0 ? -30.0f : 30.0f;
    f.facing = i == 0 ? 1.0f : -1.0f;
    Player p;
    p.port = static_cast<uint8_t>(i);
    p.character = pick.external;
    p.type = 0;
    p.stocks = 4;
    p.costume = static_cast<uint8_t>(mix(rng) % 4);
    p.handicap = 9;
    p.bitfield = 192;
    p.cpu_level = 1;
    p.offense_ratio = p.defense_ratio = p.model_scale = 1.0f;
    p.dashback_fix = p.shield_drop_fix = 1;
    p.nametag = i == 0 ? "SYN" : "TH";
    p.display_name = "synth-p" + std::to_string(i + 1);
    p.connect_code = "SYN#" + std::to_string(100 + i);
    p.slippi_uid = "synthetic-uid-" + std::to_string(i + 1);
    p.internal_character = pick.internal;
    s.players.push_back(p);
  }

  const size_t max_rows = static_cast<size_t>(std::max(1, options.frames));
  Frames& fr = game.frames;
  fr.frame.resize(max_rows);
  resize_columns(fr.start, max_rows);
  resize_columns(fr.bookend, max_rows);
  for (uint8_t port = 0; port < 2; ++port) {
    PortFrames pf;
    pf.port = port;
    pf.leader.present.resize(max_rows);
    resize_columns(pf.leader.pre, max_rows);
    resize_columns(pf.leader.post, max_rows);
    fr.ports.push_back(std::move(pf));
  }

  // Projectiles from B presses, one live per player.
  struct Projectile {
    bool live = false;
    float x = 0, y = 0, vx = 0;
    int age = 0;
    uint32_t spawn_id = 0;
    int8_t owner = 0;
  } shots[2];
  uint32_t next_spawn = 0;
  uint16_t instance_counter = 2;
  uint32_t game_seed = s.random_seed;
  size_t rows = 0;
  int winner = -1;
  for (size_t row = 0; row < max_rows; ++row) {
    const int32_t frame = -123 + static_cast<int32_t>(row);
    game_seed = game_seed * 214013u + 2531011u;  // the game's RNG ticks every frame
    fr.frame[row] = frame;
    fr.start.random_seed[row] = game_seed;
    fr.start.scene_frame_counter[row] = static_cast<uint32_t>(row);
    fr.bookend.latest_finalized_frame[row] = frame;
    // Inputs come from the state both players see at the start of the frame.
    Inputs in[2];
    for (int i = 0; i < 2; ++i) {
      in[i] = decide(fighters[i], fighters[1 - i]);
      record_pre(fr.ports[i].leader, row, fighters[i], in[i], game_seed);
    }
    for (int i = 0; i < 2; ++i) step(fighters[i], fighters[1 - i], in[i], instance_counter, i);
    // Players stand still through the countdown, as in the real game: the Entry state ends with
    // frame -40, so the first inputs (decided from frame -40's Post-Frame) are frame -39's.
    if (frame == -40)
      for (Fighter& f : fighters) set_action(f, kWait, instance_counter);
    for (int i = 0; i < 2; ++i) record_post(fr.ports[i].leader, row, fighters[i]);
    for (int i = 0; i < 2; ++i) {
      Projectile& shot = shots[i];
      if (!shot.live && (in[i].physical & kB)) {
        shot = {true, fighters[i].x, fighters[i].y + 8,     fighters[i].facing * 2.5f,
                0,    next_spawn++,  static_cast<int8_t>(i)};
      }
      if (!shot.live) continue;
      shot.x += shot.vx;
      ++shot.age;
      auto& it = fr.items;
      it.row.push_back(static_cast<uint32_t>(row));
      it.fields.type.push_back(0x36);  // a laser
      it.fields.state.push_back(static_cast<uint8_t>(shot.age > 40 ? 1 : 0));
      it.fields.facing.push_back(sign(shot.vx));
      it.fields.velocity_x.push_back(shot.vx);
      it.fields.velocity_y.push_back(0);
      it.fields.x.push_back(shot.x);
      it.fields.y.push_back(shot.y);
      it.fields.damage.push_back(0);
      it.fields.timer.push_back(static_cast<float>(60 - shot.age));
      it.fields.spawn_id.push_back(shot.spawn_id);
      it.fields.misc_1.push_back(0);
      it.fields.misc_2.push_back(0);
      it.fields.misc_3.push_back(0);
      it.fields.misc_4.push_back(static_cast<uint8_t>(shot.age));
      it.fields.owner.push_back(shot.owner);
      it.fields.instance_id.push_back(fighters[i].instance);
      if (shot.age >= 60 || std::fabs(shot.x) > kBlastX) shot.live = false;
    }
    rows = row + 1;
    if (fighters[0].stocks == 0 || fighters[1].stocks == 0) {
      winner = fighters[0].stocks == 0 ? 1 : 0;
      break;
    }
  }

  fr.frame.resize(rows);
  resize_columns(fr.start, rows);
  resize_columns(fr.bookend, rows);
  for (auto& pf : fr.ports) {
    pf.leader.present.resize(rows);
    resize_columns(pf.leader.pre, rows);
    resize_columns(pf.leader.post, rows);
  }

  GameEnd end;
  end.lras_initiator = -1;
  if (winner < 0) {
    end.method = 1;  // TIME
    winner = fighters[0].stocks != fighters[1].stocks
                 ? (fighters[0].stocks > fighters[1].stocks ? 0 : 1)
                 : (fighters[0].percent <= fighters[1].percent ? 0 : 1);
  } else {
    end.method = 2;  // GAME
  }
  end.placements = std::array<int8_t, 4>{static_cast<int8_t>(winner == 0 ? 0 : 1),
                                         static_cast<int8_t>(winner == 1 ? 0 : 1), -1, -1};
  info.end = end;
  info.game_end_events = 1;

  Metadata& m = info.metadata;
  m.present = true;
  char start_at[32];
  std::snprintf(start_at, sizeof start_at, "2024-01-01T%02d:%02d:%02dZ",
                static_cast<int>(options.seed / 3600 % 24),
                static_cast<int>(options.seed / 60 % 60), static_cast<int>(options.seed % 60));
  m.start_at = start_at;
  m.last_frame = fr.frame.empty() ? -124 : fr.frame.back();
  m.played_on = "synthetic";
  m.console_nick = "slipstream";
  for (int i = 0; i < 2; ++i) {
    MetadataPlayer mp;
    mp.port = static_cast<uint8_t>(i);
    mp.netplay = s.players[i].display_name;
    mp.code = s.players[i].connect_code;
    mp.characters = {{fighters[i].internal, static_cast<uint32_t>(rows)}};
    m.players.push_back(mp);
  }
  info.fields.pre = (1ull << detail::kPreFieldCount) - 1;
  info.fields.post = (1ull << detail::kPostFieldCount) - 1;
  info.fields.item = (1ull << detail::kItemFieldCount) - 1;
  info.fields.frame_start = (1ull << detail::kFrameStartFieldCount) - 1;
  info.fields.frame_bookend = (1ull << detail::kFrameBookendFieldCount) - 1;
  return game;
}

std::vector<std::filesystem::path> write_synthetic_games(const std::filesystem::path& dir,
                                                         int games, uint64_t seed, int frames) {
  std::filesystem::create_directories(dir);
  std::vector<std::filesystem::path> paths;
  for (int i = 0; i < games; ++i) {
    uint64_t state = seed ^ (0xA0761D6478BD642Full * static_cast<uint64_t>(i + 1));
    SynthOptions o;
    o.seed = mix(state);
    o.frames = frames;
    char name[32];
    std::snprintf(name, sizeof name, "synth_%05d.slp", i);
    paths.push_back(dir / name);
    write_slp_file(synthesize_game(o), paths.back());
  }
  return paths;
}

}  // namespace slipstream::slp
