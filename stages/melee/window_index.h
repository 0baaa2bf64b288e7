// The replay loader's data model: compact per-game feature arrays extracted from the columnar
// Slippi frames (parsed or memory-mapped from a corpus), the index of training windows over them,
// the per-epoch permutation, the train/validation assignment, and the code that writes one window
// into the batch tensors of batch_layout.h. No engine dependency: tests and tools use it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stages/melee/batch_layout.h"
#include "stages/melee/slp/game.h"

namespace slipstream::melee {

// State flag bits used as features (SPEC.md, Post-Frame Update, State Bit Flags 2 and 4).
inline constexpr uint8_t kFlags2Invulnerable = 0x04;  // "has intangibility or invincibility"
inline constexpr uint8_t kFlags4Hitstun = 0x02;       // "is in hitstun" (misc AS = frames left)

// Processed-button bits (SPEC.md, Physical Buttons) in label order (kA..kDUp).
inline constexpr uint32_t kButtonMask[kButtons] = {0x0100, 0x0200, 0x0400, 0x0800,
                                                   0x0010, 0x0040, 0x0020, 0x0008};
inline constexpr int kAnalogInputs = 5;  // main x, main y, c x, c y, shoulder

enum class RollbackMode { last, all };
// Which reading of the Post-Frame fields the numeric features take: slippi, the replay's own
// values; libmelee, the values libmelee's GameState shows a bot (docs/melee_features.md): the
// frame counters (action frame, hitlag, hitstun) truncated to whole frames, hitstun the Misc AS
// value whatever the state, invulnerable the hurtbox state, and libmelee's stand-ins for fields
// older than the file (on the ground, one jump left).
enum class FieldReading { slippi, libmelee };

// Post-frame state of one character (a port's leader or its follower) over the game's kept rows.
// Rows where the character sent no Post-Frame event are zeros (exists = 0).
struct TrackFeatures {
  std::vector<float> numeric;      // rows * kNumericFeatures, kPercent..kExists order
  std::vector<int16_t> action;     // clamped to [0, kActionStates)
  std::vector<uint8_t> character;  // internal id, clamped to [0, kCharacters)
};

// A player's controller (Pre-Frame, processed) over the kept rows.
struct ControllerTrack {
  std::vector<uint8_t> buttons;  // bit b set = button b (kA..kDUp) pressed
  std::vector<float> analog;     // rows * kAnalogInputs: sticks in [-1, 1], shoulder in [0, 1]
};

struct PlayerFeatures {
  uint8_t port = 0;                       // 0-based
  uint8_t character = slp::kNoCharacter;  // internal id at the leader's first Post-Frame
  TrackFeatures leader;
  bool has_follower = false;  // Ice Climbers' Nana
  TrackFeatures follower;     // empty unless has_follower
  ControllerTrack controller;
};

struct GameFeatures {
  std::string source;     // file path (or the source recorded in the corpus)
  uint64_t identity = 0;  // stable across parse/corpus and path spellings, see game_identity
  // Equal for two recordings of one game whatever their file names (a copy, a renamed copy, two
  // consoles' recorders): its Game Start's seed, stage, players and length. 0: not known.
  uint64_t same_game = 0;
  int32_t stage = 0;                    // clamped to [0, kStages)
  uint32_t rows = 0;                    // kept rows (frames after rollback handling)
  std::vector<int32_t> frame;           // frame number of each kept row
  std::vector<uint32_t> recorded_row;   // index of each kept row in the decoded game's rows
  std::vector<PlayerFeatures> players;  // Game Start players with frames, sorted by port
  size_t bytes() const;
};

// `g` without its arrays: source, identity, stage, rows and each player's port, character and
// follower flag (what the split and the window index read).
GameFeatures without_arrays(const GameFeatures& g);
// A player of such a game: its facts, no arrays.
void add_player_facts(GameFeatures& g, uint8_t port, uint8_t character, bool has_follower);

// Rows to keep: the last copy of each frame number (what the game finally showed) or all.
std::vector<uint32_t> kept_rows(std::span<const int32_t> frame_numbers, RollbackMode mode);

// Features of every Game Start player that has frames. Players without any frame are left out
// (callers compare players.size() with info.start.players.size()).
GameFeatures extract_features(const slp::GameView& game, RollbackMode mode,
                              FieldReading fields = FieldReading::slippi);

// Identity of a game for the train/validation split: file name (not directory), Game Start
// random seed and last frame number; equal for a file and its corpus copy.
uint64_t game_identity(const slp::GameInfo& info, int32_t last_frame);

// splitmix64 finaliser.
uint64_t mix64(uint64_t x);
// Uniform in [0, 1) from (seed, identity): the game goes to validation when below the fraction.
double split_draw(uint64_t seed, uint64_t identity);

// One example source: a game seen from one player.
struct Perspective {
  uint32_t game = 0;
  uint8_t player = 0;    // index into GameFeatures::players
  uint8_t opponent = 0;  // index into GameFeatures::players
};

struct WindowRef {
  uint32_t perspective = 0;
  uint32_t start = 0;  // first kept row of the window
};

// The windows of a split: for each perspective in turn, windows of `window` rows starting every
// `stride` rows while the last label row (start + window - 1 + delay + 1) exists. How many:
size_t count_windows(const std::vector<GameFeatures>& games,
                     const std::vector<Perspective>& perspectives, int window, int stride,
                     int delay);

// Those windows computed rather than listed: 8 bytes a perspective instead of 8 a window (5.7 KB
// a game at stride 10; gigabytes at a million games). Window w is perspective p's
// ((w - first(p)) · stride)-th row, p found by binary search.
class WindowIndex {
 public:
  WindowIndex() = default;
  WindowIndex(const std::vector<GameFeatures>& games, const std::vector<Perspective>& perspectives,
              int window, int stride, int delay);
  uint64_t size() const { return first_.empty() ? 0 : first_.back(); }
  bool empty() const { return size() == 0; }
  WindowRef operator[](uint64_t w) const;
  // Each perspective's first window, then the count: windows grouped by perspective, each
  // group in time order.
  const std::vector<uint64_t>& first() const { return first_; }

 private:
  std::vector<uint64_t> first_;
  uint32_t stride_ = 1;
};

// A permutation of [0, n) that depends only on (seed, epoch): Fisher-Yates over splitmix64, as a
// table of 32-bit indices (n < 2^32; runs written before `shuffle_order` existed use it).
std::vector<uint32_t> epoch_permutation(size_t n, uint64_t seed, uint64_t epoch);

// The same kind of permutation of [0, n), any n < 2^64, computed one position at a time: no
// table, so nothing to build at an epoch's start and no memory that grows with the windows. A
// balanced Feistel network over the smallest even power of two >= n (six rounds of mix64 keyed
// by (seed, epoch, round)), cycle-walked into [0, n): each step is a bijection of the larger
// domain, so the walk from a position in [0, n) lands on a distinct position in [0, n). A few
// rounds of the network per position on average (the domain is less than 4n).
class KeyedPermutation {
 public:
  KeyedPermutation(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t size() const { return n_; }
  uint64_t operator()(uint64_t position) const;  // position < n
  uint64_t inverse(uint64_t value) const;        // value < n
 private:
  uint64_t feistel(uint64_t x) const;
  uint64_t feistel_inverse(uint64_t x) const;
  static constexpr int kRounds = 6;
  uint64_t n_ = 0;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  uint64_t keys_[kRounds] = {};
};

// Pointers to the batch tensors (row-major, shapes of batch_layout.h).
struct BatchView {
  int window = 0;
  float* numeric = nullptr;          // (B, W, kSlots, kNumericFeatures)
  int32_t* action = nullptr;         // (B, W, kSlots)
  int32_t* character = nullptr;      // (B, W, kSlots)
  int32_t* stage = nullptr;          // (B, W)
  float* prev_controller = nullptr;  // (B, W, kControllerFeatures)
  float* target_buttons = nullptr;   // (B, W, kButtons)
  int32_t* target_sticks = nullptr;  // (B, W, kStickHeads)
  float* mask = nullptr;             // (B, W)
  float* continues = nullptr;        // (B)
};

// Writes batch row `row` from the window `w` (frame delay `delay`).
void fill_window(const GameFeatures& game, const Perspective& p, uint32_t start, int delay,
                 const BatchView& out, int64_t row);
// Writes zeros (mask 0) into batch row `row`: padding.
void zero_window(const BatchView& out, int64_t row);

}  // namespace slipstream::melee
