#include "stages/melee/window_index.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace slipstream::melee {
namespace {

// Absent columns (fields newer than the file's version) read as zero.
template <class T>
T get(std::span<const T> col, size_t r) {
  return r < col.size() ? col[r] : T{};
}

bool has_post(const slp::CharacterFramesT<slp::View>& ch, size_t r) {
  return r < ch.present.size() && (ch.present[r] & slp::kHasPost);
}
bool has_pre(const slp::CharacterFramesT<slp::View>& ch, size_t r) {
  return r < ch.present.size() && (ch.present[r] & slp::kHasPre);
}

// A frame counter as libmelee reads it: Python's int() of the float (toward zero; NaN reads 0).
float whole_frames(float v) {
  return std::isfinite(v) ? std::trunc(v) : 0.0f;
}

TrackFeatures extract_track(const slp::CharacterFramesT<slp::View>& ch,
                            const std::vector<uint32_t>& rows, FieldReading fields) {
  const size_t n = rows.size();
  TrackFeatures t;
  t.numeric.assign(n * kNumericFeatures, 0.0f);
  t.action.assign(n, 0);
  t.character.assign(n, 0);
  const auto& p = ch.post;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = rows[i];
    if (!has_post(ch, r)) continue;
    float* f = &t.numeric[i * kNumericFeatures];
    f[kPercent] = get(p.percent, r);
    f[kFacing] = get(p.facing, r);
    f[kPosX] = get(p.x, r);
    f[kPosY] = get(p.y, r);
    f[kShield] = get(p.shield, r);
    f[kJumpsLeft] = get(p.jumps_remaining, r);
    // Before 2.0 the airborne flag is absent: unknown reads as 0, like every absent field.
    f[kOnGround] = p.airborne.empty() ? 0.0f : (get(p.airborne, r) ? 0.0f : 1.0f);
    f[kInvulnerable] = (get(p.state_flags_2, r) & kFlags2Invulnerable) ? 1.0f : 0.0f;
    f[kHitlag] = get(p.hitlag_remaining, r);
    // Misc AS holds hitstun frames left only while the hitstun flag is set.
    f[kHitstun] = (get(p.state_flags_4, r) & kFlags4Hitstun) ? get(p.misc_as, r) : 0.0f;
    f[kActionFrame] = get(p.state_age, r);
    f[kSpeedAirX] = get(p.self_air_x_speed, r);
    f[kSpeedY] = get(p.self_y_speed, r);
    f[kSpeedAttackX] = get(p.attack_x_speed, r);
    f[kSpeedAttackY] = get(p.attack_y_speed, r);
    f[kSpeedGroundX] = get(p.self_ground_x_speed, r);
    f[kStocks] = get(p.stocks, r);
    f[kExists] = 1.0f;
    if (fields == FieldReading::libmelee) {
      f[kActionFrame] = whole_frames(f[kActionFrame]);
      f[kHitlag] = whole_frames(f[kHitlag]);
      f[kHitstun] = whole_frames(get(p.misc_as, r));
      f[kInvulnerable] = get(p.hurtbox_state, r) != 0 ? 1.0f : 0.0f;
      if (p.airborne.empty()) f[kOnGround] = 1.0f;
      if (p.jumps_remaining.empty()) f[kJumpsLeft] = 1.0f;
    }
    t.action[i] = static_cast<int16_t>(std::min<int>(get(p.action_state, r), kActionStates - 1));
    t.character[i] = static_cast<uint8_t>(std::min<int>(get(p.character, r), kCharacters - 1));
  }
  return t;
}

ControllerTrack extract_controller(const slp::CharacterFramesT<slp::View>& ch,
                                   const std::vector<uint32_t>& rows) {
  const size_t n = rows.size();
  ControllerTrack c;
  c.buttons.assign(n, 0);
  c.analog.assign(n * kAnalogInputs, 0.0f);
  const auto& p = ch.pre;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = rows[i];
    if (!has_pre(ch, r)) continue;
    const uint32_t b = get(p.buttons, r);
    uint8_t bits = 0;
    for (int k = 0; k < kButtons; ++k)
      if (b & kButtonMask[k]) bits |= static_cast<uint8_t>(1u << k);
    c.buttons[i] = bits;
    float* a = &c.analog[i * kAnalogInputs];
    a[0] = std::clamp(get(p.joystick_x, r), -1.0f, 1.0f);
    a[1] = std::clamp(get(p.joystick_y, r), -1.0f, 1.0f);
    a[2] = std::clamp(get(p.cstick_x, r), -1.0f, 1.0f);
    a[3] = std::clamp(get(p.cstick_y, r), -1.0f, 1.0f);
    // The processed trigger is the game's max(L, R) analog value; the physical L/R fields
    // hold garbage (e.g. 3.8e22) in files before 1.x, so they are not used.
    a[4] = std::clamp(get(p.trigger, r), 0.0f, 1.0f);
  }
  return c;
}

uint8_t first_character(const slp::CharacterFramesT<slp::View>& ch) {
  for (size_t r = 0; r < ch.present.size(); ++r)
    if (has_post(ch, r)) return get(ch.post.character, r);
  return slp::kNoCharacter;
}

size_t track_bytes(const TrackFeatures& t) {
  return t.numeric.size() * sizeof(float) + t.action.size() * sizeof(int16_t) + t.character.size();
}

}  // namespace

size_t GameFeatures::bytes() const {
  size_t b = frame.size() * sizeof(int32_t) + recorded_row.size() * sizeof(uint32_t);
  for (const auto& p : players) {
    b += track_bytes(p.leader) + track_bytes(p.follower);
    b += p.controller.buttons.size() + p.controller.analog.size() * sizeof(float);
  }
  return b;
}

GameFeatures without_arrays(const GameFeatures& g) {
  GameFeatures h;
  h.source = g.source;
  h.identity = g.identity;
  h.same_game = g.same_game;
  h.stage = g.stage;
  h.rows = g.rows;
  for (const PlayerFeatures& p : g.players)
    add_player_facts(h, p.port, p.character, p.has_follower);
  return h;
}

void add_player_facts(GameFeatures& g, uint8_t port, uint8_t character, bool has_follower) {
  PlayerFeatures& q = g.players.emplace_back();
  q.port = port;
  q.character = character;
  q.has_follower = has_follower;
}

std::vector<uint32_t> kept_rows(std::span<const int32_t> frame_numbers, RollbackMode mode) {
  if (mode == RollbackMode::last) return slp::last_copy_rows(frame_numbers);
  std::vector<uint32_t> rows(frame_numbers.size());
  std::iota(rows.begin(), rows.end(), 0u);
  return rows;
}

GameFeatures extract_features(const slp::GameView& game, RollbackMode mode, FieldReading fields) {
  GameFeatures g;
  g.source = game.info.source;
  const auto& fr = game.frames;
  g.recorded_row = kept_rows(fr.frame, mode);
  g.rows = static_cast<uint32_t>(g.recorded_row.size());
  g.frame.reserve(g.rows);
  int32_t last = 0;
  for (uint32_t r : g.recorded_row) {
    g.frame.push_back(fr.frame[r]);
    last = std::max(last, fr.frame[r]);
  }
  g.stage = std::min<int32_t>(game.info.start.stage, kStages - 1);
  g.identity = game_identity(game.info, last);
  for (const slp::Player& pl : game.info.start.players) {
    const auto* pf = fr.port(pl.port);
    if (!pf) continue;
    PlayerFeatures p;
    p.port = pl.port;
    p.character = first_character(pf->leader);
    if (p.character == slp::kNoCharacter) continue;  // no Post-Frame at all
    p.leader = extract_track(pf->leader, g.recorded_row, fields);
    if (pf->follower) {
      p.has_follower = true;
      p.follower = extract_track(*pf->follower, g.recorded_row, fields);
    }
    p.controller = extract_controller(pf->leader, g.recorded_row);
    g.players.push_back(std::move(p));
  }
  std::sort(g.players.begin(), g.players.end(),
            [](const PlayerFeatures& a, const PlayerFeatures& b) { return a.port < b.port; });
  return g;
}

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t game_identity(const slp::GameInfo& info, int32_t last_frame) {
  // The file name only: a corpus built from "a/x.slp" and a load of "/abs/a/x.slp" agree.
  const std::string& s = info.source;
  const size_t slash = s.find_last_of("/\\");
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = slash == std::string::npos ? 0 : slash + 1; i < s.size(); ++i)
    h = (h ^ static_cast<unsigned char>(s[i])) * 1099511628211ull;
  h = mix64(h ^ info.start.random_seed);
  return mix64(h ^ static_cast<uint32_t>(last_frame));
}

double split_draw(uint64_t seed, uint64_t identity) {
  return static_cast<double>(mix64(seed ^ mix64(identity)) >> 11) * 0x1.0p-53;
}

namespace {

// Windows of a perspective of `rows` rows: starts 0, stride, ... while the last label row exists.
size_t windows_in(size_t rows, int window, int stride, int delay) {
  const size_t need = static_cast<size_t>(window) + static_cast<size_t>(delay) + 1;
  return rows < need ? 0 : (rows - need) / static_cast<size_t>(stride) + 1;
}

}  // namespace

WindowIndex::WindowIndex(const std::vector<GameFeatures>& games,
                         const std::vector<Perspective>& perspectives, int window, int stride,
                         int delay)
    : stride_(static_cast<uint32_t>(stride)) {
  first_.reserve(perspectives.size() + 1);
  uint64_t at = 0;
  for (const Perspective& p : perspectives) {
    first_.push_back(at);
    at += windows_in(games[p.game].rows, window, stride, delay);
  }
  first_.push_back(at);
}

WindowRef WindowIndex::operator[](uint64_t w) const {
  // The last perspective starting at or before w: one with windows, since w < its end.
  const auto it = std::upper_bound(first_.begin(), first_.end(), w) - 1;
  return {static_cast<uint32_t>(it - first_.begin()), static_cast<uint32_t>((w - *it) * stride_)};
}

size_t count_windows(const std::vector<GameFeatures>& games,
                     const std::vector<Perspective>& perspectives, int window, int stride,
                     int delay) {
  size_t n = 0;
  for (const Perspective& p : perspectives)
    n += windows_in(games[p.game].rows, window, stride, delay);
  return n;
}

std::vector<uint32_t> epoch_permutation(size_t n, uint64_t seed, uint64_t epoch) {
  std::vector<uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  uint64_t state = mix64(seed ^ mix64(epoch ^ 0x632BE59BD9B4E019ull));
  for (size_t i = n; i > 1; --i) {
    state += 0x9E3779B97F4A7C15ull;
    // Multiply-shift range reduction: exact enough (bias < 2^-32) and portable.
    const size_t j = static_cast<size_t>((static_cast<unsigned __int128>(mix64(state)) * i) >> 64);
    std::swap(perm[i - 1], perm[j]);
  }
  return perm;
}

KeyedPermutation::KeyedPermutation(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t k = mix64(seed ^ mix64(epoch ^ 0x7F4A7C15F39CC060ull));
  for (auto& key : keys_) key = k = mix64(k);
}

// One round maps (left, right) to (right, left ^ F(right)); the inverse undoes the rounds last
// to first. With 32-bit halves (n > 2^62) the domain is every uint64.
uint64_t KeyedPermutation::feistel(uint64_t x) const {
  uint64_t left = (x >> half_bits_) & half_mask_, right = x & half_mask_;
  for (uint64_t key : keys_) {
    const uint64_t next = left ^ (mix64(key ^ right) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t KeyedPermutation::feistel_inverse(uint64_t x) const {
  uint64_t left = (x >> half_bits_) & half_mask_, right = x & half_mask_;
  for (int r = kRounds - 1; r >= 0; --r) {
    const uint64_t prev = right ^ (mix64(keys_[r] ^ left) & half_mask_);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

uint64_t KeyedPermutation::operator()(uint64_t position) const {
  uint64_t x = feistel(position);
  while (x >= n_) x = feistel(x);
  return x;
}

uint64_t KeyedPermutation::inverse(uint64_t value) const {
  uint64_t x = feistel_inverse(value);
  while (x >= n_) x = feistel_inverse(x);
  return x;
}

void fill_window(const GameFeatures& g, const Perspective& p, uint32_t start, int delay,
                 const BatchView& out, int64_t row) {
  const int W = out.window;
  const PlayerFeatures& me = g.players[p.player];
  const PlayerFeatures& op = g.players[p.opponent];
  const TrackFeatures* slots[kSlots] = {&me.leader, &op.leader,
                                        me.has_follower ? &me.follower : nullptr};
  for (int w = 0; w < W; ++w) {
    const size_t t = static_cast<size_t>(start) + static_cast<size_t>(w);
    const int64_t pos = row * W + w;
    for (int s = 0; s < kSlots; ++s) {
      float* dst = out.numeric + (pos * kSlots + s) * kNumericFeatures;
      const TrackFeatures* tr = slots[s];
      if (tr) {
        std::memcpy(dst, &tr->numeric[t * kNumericFeatures], sizeof(float) * kNumericFeatures);
        out.action[pos * kSlots + s] = tr->action[t];
        out.character[pos * kSlots + s] = tr->character[t];
      } else {
        std::memset(dst, 0, sizeof(float) * kNumericFeatures);
        out.action[pos * kSlots + s] = 0;
        out.character[pos * kSlots + s] = 0;
      }
    }
    out.stage[pos] = g.stage;
    // Features read the controller of t + D; the label is the next input, t + D + 1.
    const size_t c = t + static_cast<size_t>(delay), l = c + 1;
    float* pc = out.prev_controller + pos * kControllerFeatures;
    const uint8_t cb = me.controller.buttons[c];
    for (int b = 0; b < kButtons; ++b) pc[b] = (cb >> b) & 1 ? 1.0f : 0.0f;
    std::memcpy(pc + kButtons, &me.controller.analog[c * kAnalogInputs],
                sizeof(float) * kAnalogInputs);
    float* tb = out.target_buttons + pos * kButtons;
    const uint8_t lb = me.controller.buttons[l];
    for (int b = 0; b < kButtons; ++b) tb[b] = (lb >> b) & 1 ? 1.0f : 0.0f;
    const float* la = &me.controller.analog[l * kAnalogInputs];
    int32_t* ts = out.target_sticks + pos * kStickHeads;
    for (int h = 0; h < kStickHeads; ++h)
      ts[h] = h == kShoulder ? shoulder_class(la[h]) : stick_class(la[h]);
    out.mask[pos] = 1.0f;
  }
}

void zero_window(const BatchView& out, int64_t row) {
  const int64_t W = out.window, p0 = row * W;
  if (out.continues) out.continues[row] = 0.0f;
  std::memset(out.numeric + p0 * kSlots * kNumericFeatures, 0,
              sizeof(float) * W * kSlots * kNumericFeatures);
  std::memset(out.action + p0 * kSlots, 0, sizeof(int32_t) * W * kSlots);
  std::memset(out.character + p0 * kSlots, 0, sizeof(int32_t) * W * kSlots);
  std::memset(out.stage + p0, 0, sizeof(int32_t) * W);
  std::memset(out.prev_controller + p0 * kControllerFeatures, 0,
              sizeof(float) * W * kControllerFeatures);
  std::memset(out.target_buttons + p0 * kButtons, 0, sizeof(float) * W * kButtons);
  // Class ids of a neutral controller, so padded rows hold valid ids for any head.
  for (int64_t i = 0; i < W; ++i)
    for (int h = 0; h < kStickHeads; ++h)
      out.target_sticks[(p0 + i) * kStickHeads + h] = h == kShoulder ? 0 : kStickClasses / 2;
  std::memset(out.mask + p0, 0, sizeof(float) * W);
}

}  // namespace slipstream::melee
