// libslipstream_policy (include/slipstream/policy.h): the run's graph with its slippi_replays
// source swapped for melee_frames, driven one frame of each game per step (a batch row a game)
// through Runner::stream_open / stream_next (the stages before the loss, each row's recurrent
// state carried; Runner::stream_restart_row restarts one game), inside the handle's TBB arena:
// the caller's thread alone by default, so a step runs on it; slipstream_policy_set_threads
// lets the stages' loops spread over more. Every entry point catches everything: no
// exception crosses the C boundary.
#include "slipstream/policy.h"

#include <dlfcn.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "engine/graph.h"
#include "engine/runner.h"
#include "stages/melee/batch_layout.h"
#include "stages/melee/controller_choice.h"
#include "stages/melee/controller_sampler.h"
#include "stages/melee/frame_feed.h"
#include "stages/melee/model_math.h"
#include "stages/melee/window_index.h"

using namespace slipstream;
using namespace slipstream::melee;

struct slipstream_policy {
  // The stages' loops run here: the caller's thread, and threads - 1 workers with it.
  std::unique_ptr<tbb::task_arena> arena = std::make_unique<tbb::task_arena>(1, 1);
  int32_t threads = 1;
  std::ostringstream log;  // the runner's progress lines: a library prints nothing
  std::unique_ptr<Runner> runner;
  FrameFeedStage* feed = nullptr;
  size_t heads = 0;
  std::string description;
  int32_t frame_delay = 0;    // the run's replays.delay
  mutable std::string error;  // the last failed call's message
  // The games of the stream: 0 until the first step after open or reset fixes how many; then
  // per game (a batch row) its last distribution, its draws' key (game_seed), the frames it has
  // drawn since it started (its next frame_draws_key) and whether it has stepped.
  int32_t games = 0;
  std::vector<slipstream_distribution> last;
  std::vector<uint64_t> game_keys, frames_drawn;
  std::vector<ChosenController> chosen;
  std::unique_ptr<ControllerSampler> sampler;  // where the heads' logits are: CPU or device
  std::vector<uint8_t> stepped;
  std::vector<FedFrame> frames;  // the step's frames, checked
  // Sampling by default: the most likely input of a behaviour-cloned policy is mostly "nothing
  // pressed, sticks at rest" (docs/policy.md). A game's start restarts its draws from its
  // first frame's, so a game replays alike.
  float temperature = 1;
  uint64_t seed = 0;
  mutable std::atomic<bool> busy{false};  // a call is using the handle (HandleUse)
};

namespace {

thread_local std::string g_open_error;

static_assert(kButtons == 8 && kStickClasses == 17 && kShoulderClasses == 5,
              "slipstream_distribution's sizes are the heads' classes");

slipstream_status fail(const slipstream_policy* p, slipstream_status s, std::string message) {
  (p ? p->error : g_open_error) = std::move(message);
  return s;
}

// The graph as a policy: its replay loader becomes the frame feed. Refuses a graph whose data
// does not come from one slippi_replays source (the feed produces that stage's tensors).
// Returns what the frames given to the policy must follow: how the run read its replays' fields
// (the loader's `fields`: slippi or libmelee) and its frame delay (`delay`).
struct FrameReading {
  std::string fields = "slippi";
  int32_t delay = 0;
};

FrameReading feed_frames(Config& cfg) {
  int loaders = 0;
  FrameReading reading;
  for (StageConfig& s : cfg.stages) {
    if (s.kind != "slippi_replays") continue;
    ++loaders;
    if (auto it = s.params.find("fields"); it != s.params.end() && it->second.node.IsScalar())
      reading.fields = it->second.node.as<std::string>();
    if (auto it = s.params.find("delay"); it != s.params.end() && it->second.node.IsScalar())
      reading.delay = it->second.node.as<int32_t>();
    s.kind = "melee_frames";
    s.params.clear();
  }
  if (loaders != 1 || cfg.stages.empty() || cfg.stages.front().kind != "melee_frames") {
    ConfigIssue issue;
    issue.mark.file = cfg.graph_file;
    issue.message =
        "the run's graph does not read its data with one slippi_replays stage as its source: a "
        "policy feeds frames in that stage's place";
    throw ConfigError({issue});
  }
  return reading;
}

// A graph that names plugins: they resolve the engine's symbols (Stage, the registry, ...) from
// this library, which exports them (exports.map). A program may have loaded the library with
// RTLD_LOCAL (Python's ctypes does), where a plugin loaded later cannot see them: the library
// is made global first. "" or why that failed.
std::string share_symbols_with_plugins() {
  Dl_info self{};
  if (!dladdr(reinterpret_cast<void*>(&slipstream_policy_open), &self) || !self.dli_fname)
    return "cannot find libslipstream_policy's own file (dladdr)";
  if (!dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
    const char* err = dlerror();
    return std::string("cannot make ") + self.dli_fname +
           "'s symbols visible to plugins: " + (err ? err : "dlopen failed");
  }
  return {};
}

// Slot `s` of `f` from `c`; "" or what is wrong, naming the field under `who`.
std::string character_features(const slipstream_character& c, const std::string& who, int s,
                               FedFrame& f) {
  if (c.exists == 0) return {};  // zeros, as the loader writes an absent character
  if (c.exists != 1) return who + ".exists is " + std::to_string(c.exists) + " (0 or 1)";
  if (c.character < 0 || c.character >= kCharacters)
    return who + ".character is " + std::to_string(c.character) + " (internal ids 0.." +
           std::to_string(kCharacters - 1) + ")";
  if (c.action_state < 0) return who + ".action_state is " + std::to_string(c.action_state);
  for (const char* flag : {"on_ground", "invulnerable"}) {
    const int32_t v = flag[0] == 'o' ? c.on_ground : c.invulnerable;
    if (v != 0 && v != 1) return who + "." + flag + " is " + std::to_string(v) + " (0 or 1)";
  }
  const struct {
    const char* name;
    float value;
    int feature;
  } fields[] = {{"percent", c.percent, kPercent},
                {"facing", c.facing, kFacing},
                {"x", c.x, kPosX},
                {"y", c.y, kPosY},
                {"shield", c.shield, kShield},
                {"jumps_left", c.jumps_left, kJumpsLeft},
                {"on_ground", static_cast<float>(c.on_ground), kOnGround},
                {"invulnerable", static_cast<float>(c.invulnerable), kInvulnerable},
                {"hitlag", c.hitlag, kHitlag},
                {"hitstun", c.hitstun, kHitstun},
                {"action_frame", c.action_frame, kActionFrame},
                {"speed_air_x", c.speed_air_x, kSpeedAirX},
                {"speed_y", c.speed_y, kSpeedY},
                {"speed_attack_x", c.speed_attack_x, kSpeedAttackX},
                {"speed_attack_y", c.speed_attack_y, kSpeedAttackY},
                {"speed_ground_x", c.speed_ground_x, kSpeedGroundX},
                {"stocks", static_cast<float>(c.stocks), kStocks}};
  for (const auto& fl : fields) {
    if (!std::isfinite(fl.value)) return who + "." + fl.name + " is not finite";
    f.numeric[s][fl.feature] = fl.value;
  }
  f.numeric[s][kExists] = 1.0f;
  f.action[s] = std::min(c.action_state, kActionStates - 1);
  f.character[s] = c.character;
  return {};
}

std::string frame_features(const slipstream_game_frame& g, FedFrame& f) {
  if (g.stage < 0 || g.stage >= kStages)
    return "frame.stage is " + std::to_string(g.stage) + " (ids 0.." + std::to_string(kStages - 1) +
           ")";
  f.stage = g.stage;
  const slipstream_character* slots[kSlots] = {&g.player, &g.opponent, &g.follower};
  const char* names[kSlots] = {"frame.player", "frame.opponent", "frame.follower"};
  for (int s = 0; s < kSlots; ++s)
    if (std::string e = character_features(*slots[s], names[s], s, f); !e.empty()) return e;
  const slipstream_controller& c = g.controller;
  if (c.buttons & ~static_cast<uint32_t>(SLIPSTREAM_BUTTONS_ALL))
    return "frame.controller.buttons has bits outside SLIPSTREAM_BUTTONS_ALL";
  for (int b = 0; b < kButtons; ++b) f.prev_controller[b] = (c.buttons >> b) & 1 ? 1.0f : 0.0f;
  const float analog[] = {c.main_x, c.main_y, c.c_x, c.c_y, c.shoulder};
  const char* analog_names[] = {"main_x", "main_y", "c_x", "c_y", "shoulder"};
  for (int a = 0; a < 5; ++a) {
    if (!std::isfinite(analog[a]))
      return std::string("frame.controller.") + analog_names[a] + " is not finite";
    // Clamped as the loader clamps what a replay recorded.
    f.prev_controller[kButtons + a] =
        a == 4 ? std::clamp(analog[a], 0.0f, 1.0f) : std::clamp(analog[a], -1.0f, 1.0f);
  }
  return {};
}

// Game i's draws' key (frame_draws_key's): the handle's seed for game 0 (a single game, and
// `slipstream infer --seed`, draw with the seed itself), a mix of (seed, i) for the others.
uint64_t game_seed(uint64_t seed, int32_t game) {
  return game == 0 ? seed
                   : mix64(seed ^ mix64(0x6A09E667F3BCC909ull + static_cast<uint64_t>(game)));
}

// The stream's games fixed at n: each starts with its generator at its seed.
void start_games(slipstream_policy& p, int32_t n) {
  p.games = n;
  const size_t g = static_cast<size_t>(n);
  p.last.assign(g, slipstream_distribution{});
  p.chosen.assign(g, ChosenController{});
  p.stepped.assign(g, 0);
  p.frames_drawn.assign(g, 0);
  p.game_keys.clear();
  for (int32_t i = 0; i < n; ++i) p.game_keys.push_back(game_seed(p.seed, i));
}

// One frame of each game through the graph (batch row i: game i), then each game's distribution
// of the next input into p.last and its controller drawn from it into p.chosen, where the heads'
// logits are (on a device only those come back). The draws are the frame's answer
// (Runner::stream_next): on a device they replay inside the frame's CUDA graph, and their
// results have come back when stream_next returns.
void forward(slipstream_policy& p) {
  p.feed->push(p.frames);
  const size_t games = p.frames.size();
  static_assert(sizeof(slipstream_distribution) == kHeadsWidth * sizeof(float),
                "slipstream_distribution is the heads' 81 columns in order");
  const auto draw = [&](const Batch& b) {
    const StageContext& hc = p.runner->graph().context(p.heads);
    const float* logits[kHeads];
    for (int h = 0; h < kHeads; ++h)
      logits[h] = static_cast<const float*>(hc.output(b, kHeadNames[h]).raw());
    p.sampler->draw(logits, p.temperature, p.game_keys.data(), p.frames_drawn.data(), games,
                    reinterpret_cast<float*>(p.last.data()), p.chosen.data());
  };
  Batch b;
  if (!p.runner->stream_next(b, draw)) throw std::logic_error("the frame feed produced no batch");
  for (size_t i = 0; i < games; ++i) ++p.frames_drawn[i];
}

// Game i's answer: the controller drawn for it (autoregressive heads: item by item, each given
// the ones drawn before it).
slipstream_controller answer(const slipstream_policy& p, size_t i) {
  const ChosenController& chosen = p.chosen[i];
  slipstream_controller c{};
  c.buttons = chosen.buttons;
  float* values[kStickHeads] = {&c.main_x, &c.main_y, &c.c_x, &c.c_y, &c.shoulder};
  for (int h = 0; h < kStickHeads; ++h)
    *values[h] =
        h == kShoulder ? shoulder_value(chosen.classes[h]) : stick_value(chosen.classes[h]);
  return c;
}

// One handle, one thread at a time: a call that finds the handle in use by another thread is
// refused with SLIPSTREAM_E_BUSY (its message on this thread, slipstream_policy_error(NULL)),
// never a race on the model's state. The handle's own message stays the other call's.
class HandleUse {
 public:
  explicit HandleUse(const slipstream_policy* p) : p_(p), owned_(!p->busy.exchange(true)) {}
  HandleUse(const HandleUse&) = delete;
  HandleUse& operator=(const HandleUse&) = delete;
  ~HandleUse() {
    if (owned_) p_->busy = false;
  }
  slipstream_status refused(const char* call) const {
    g_open_error = std::string(call) +
                   ": the handle is in use by another thread (one handle from one thread at a "
                   "time; open a handle per thread)";
    return SLIPSTREAM_E_BUSY;
  }
  bool owned() const { return owned_; }

 private:
  const slipstream_policy* p_;
  bool owned_;
};

template <class Fn>
slipstream_status guarded(slipstream_policy* p, slipstream_status on_error, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return fail(p, on_error, "out of memory");
  } catch (const std::exception& e) {
    return fail(p, on_error, e.what());
  } catch (...) {
    return fail(p, on_error, "unknown error");
  }
}

slipstream_status open_policy(const char* checkpoint, const char* device, slipstream_policy** out) {
  if (!out) return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_open: out is NULL");
  *out = nullptr;
  if (!checkpoint || !*checkpoint)
    return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_open: no checkpoint path");
  const std::string dev = device && *device ? device : "cpu";
  bool emulated = false;  // the CUDA path on host memory: the runner's device says "cpu"
  try {
    emulated = choose_device(dev).emulate_cuda;  // an unknown or absent device is refused here
  } catch (const std::exception& e) {
    return fail(nullptr, SLIPSTREAM_E_DEVICE, "device '" + dev + "': " + e.what());
  }
  const CheckpointPath where = find_checkpoint(checkpoint);
  if (!where.error.empty()) return fail(nullptr, SLIPSTREAM_E_CHECKPOINT, where.error);
  auto p = std::make_unique<slipstream_policy>();
  GraphPlan plan;
  FrameReading reading;
  try {
    Config cfg = load_config(where.graph_file, {"run.device=" + dev});
    if (!cfg.plugins.empty())
      if (std::string e = share_symbols_with_plugins(); !e.empty())
        return fail(nullptr, SLIPSTREAM_E_CONFIG, e);
    reading = feed_frames(cfg);
    plan = plan_graph(std::move(cfg));
  } catch (const std::exception& e) {
    return fail(nullptr, SLIPSTREAM_E_CONFIG, e.what());
  }
  std::string chain;
  int heads = -1;
  for (size_t k = static_cast<size_t>(plan.section_begin); k < plan.stages.size(); ++k) {
    const auto& ps = plan.stages[k];
    if (ps.after_loss || ps.schema->stage_role() == StageRole::loss) break;
    chain += (chain.empty() ? "" : " -> ") + ps.schema->kind();
    if (ps.schema->kind() == "controller_heads") heads = static_cast<int>(k);
  }
  if (heads < 0)
    return fail(nullptr, SLIPSTREAM_E_CONFIG,
                "the run's graph has no controller_heads stage before its loss");
  p->heads = static_cast<size_t>(heads);
  slipstream_status s = SLIPSTREAM_OK;
  std::string err;
  p->arena->execute([&] {
    try {
      p->runner = std::make_unique<Runner>(std::move(plan), RunOptions::embedded(&p->log));
      p->feed = dynamic_cast<FrameFeedStage*>(&p->runner->graph().stage(0));
      const uint64_t step = p->runner->stream_open(where.checkpoint);
      p->sampler = make_controller_sampler(p->runner->graph().context(p->heads).exec(),
                                           p->runner->graph().stage(p->heads));
      p->description = "slipstream policy: " + where.checkpoint + " (step " + std::to_string(step) +
                       "), " + chain + ", fields " + reading.fields + ", frame delay " +
                       std::to_string(reading.delay) + ", device " +
                       (emulated ? std::string("emulated") : p->runner->state().device.str());
    } catch (const StageError& e) {
      s = SLIPSTREAM_E_CONFIG;  // a stage refused to start the stream
      err = e.what();
    } catch (const std::exception& e) {
      // Setup names the stage that failed; anything else is the checkpoint not loading.
      const std::string what = e.what();
      s = what.find("setup failed") != std::string::npos ? SLIPSTREAM_E_CONFIG
                                                         : SLIPSTREAM_E_CHECKPOINT;
      err = what;
    }
  });
  if (s != SLIPSTREAM_OK) return fail(nullptr, s, err);
  if (!p->feed)
    return fail(nullptr, SLIPSTREAM_E_CONFIG, "the graph's source is not the frame feed");
  p->frame_delay = reading.delay;
  *out = p.release();
  g_open_error.clear();
  return SLIPSTREAM_OK;
}

}  // namespace

extern "C" {

int slipstream_policy_version(void) {
  return SLIPSTREAM_POLICY_VERSION;
}

slipstream_status slipstream_policy_open(const char* checkpoint, const char* device,
                                         slipstream_policy** out) {
  return guarded(nullptr, SLIPSTREAM_E_RUNTIME,
                 [&] { return open_policy(checkpoint, device, out); });
}

slipstream_status slipstream_policy_reset(slipstream_policy* p) {
  if (!p) return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_reset: policy is NULL");
  const HandleUse use(p);
  if (!use.owned()) return use.refused("slipstream_policy_reset");
  return guarded(p, SLIPSTREAM_E_RUNTIME, [&] {
    p->arena->execute([&] { p->runner->stream_restart(); });
    p->games = 0;  // the next step fixes the number of games again
    return SLIPSTREAM_OK;
  });
}

slipstream_status slipstream_policy_reset_game(slipstream_policy* p, int32_t game) {
  if (!p)
    return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_reset_game: policy is NULL");
  const HandleUse use(p);
  if (!use.owned()) return use.refused("slipstream_policy_reset_game");
  if (game < 0 || game >= p->games)
    return fail(p, SLIPSTREAM_E_ARGUMENT,
                "slipstream_policy_reset_game: game " + std::to_string(game) + " of a stream of " +
                    std::to_string(p->games) + " game(s)" +
                    (p->games == 0 ? " (no step since open or reset)" : ""));
  return guarded(p, SLIPSTREAM_E_RUNTIME, [&] {
    p->arena->execute([&] { p->runner->stream_restart_row(game); });
    const size_t g = static_cast<size_t>(game);
    p->frames_drawn[g] = 0;
    p->stepped[g] = 0;
    return SLIPSTREAM_OK;
  });
}

namespace {
// slipstream_policy_step_batch, and slipstream_policy_step (`batch` false: its errors name it).
slipstream_status step_games(bool batch, slipstream_policy* p, int32_t n,
                             const slipstream_game_frame* frames, slipstream_controller* out) {
  const char* fn = batch ? "slipstream_policy_step_batch" : "slipstream_policy_step";
  const std::string at = std::string(fn) + ": ";
  if (!p) return fail(nullptr, SLIPSTREAM_E_ARGUMENT, at + "policy is NULL");
  const HandleUse use(p);
  if (!use.owned()) return use.refused(fn);
  if (!frames || !out)
    return fail(p, SLIPSTREAM_E_ARGUMENT, at + (batch ? "frames" : "frame") + " or out is NULL");
  if (n < 1) return fail(p, SLIPSTREAM_E_ARGUMENT, at + "n must be >= 1");
  if (p->games != 0 && n != p->games)
    return fail(p, SLIPSTREAM_E_ARGUMENT,
                at + "this stream plays " + std::to_string(p->games) + " game(s), not " +
                    std::to_string(n) +
                    " (slipstream_policy_reset starts a stream of another number)");
  p->frames.assign(static_cast<size_t>(n), FedFrame{});
  for (int32_t i = 0; i < n; ++i)
    if (std::string e = frame_features(frames[i], p->frames[static_cast<size_t>(i)]); !e.empty())
      return fail(p, SLIPSTREAM_E_ARGUMENT, n == 1 ? e : "game " + std::to_string(i) + ": " + e);
  return guarded(p, SLIPSTREAM_E_RUNTIME, [&] {
    if (p->games == 0) start_games(*p, n);
    p->arena->execute([&] { forward(*p); });
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      p->stepped[i] = 1;
      out[i] = answer(*p, i);
    }
    return SLIPSTREAM_OK;
  });
}
}  // namespace

slipstream_status slipstream_policy_step_batch(slipstream_policy* p, int32_t n,
                                               const slipstream_game_frame* frames,
                                               slipstream_controller* out) {
  return step_games(true, p, n, frames, out);
}

slipstream_status slipstream_policy_set_threads(slipstream_policy* p, int32_t threads) {
  if (!p)
    return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_set_threads: policy is NULL");
  const HandleUse use(p);
  if (!use.owned()) return use.refused("slipstream_policy_set_threads");
  if (threads < 1 || threads > 1024)
    return fail(p, SLIPSTREAM_E_ARGUMENT,
                "slipstream_policy_set_threads: threads must be in [1, 1024], got " +
                    std::to_string(threads));
  return guarded(p, SLIPSTREAM_E_RUNTIME, [&] {
    // At most the cores TBB may use: past them TBB prints a warning on stderr (a library
    // prints nothing) and the answers are the same.
    const int use = std::min(threads, tbb::info::default_concurrency());
    if (use != p->threads) {
      p->arena = std::make_unique<tbb::task_arena>(use, 1);
      p->threads = use;
    }
    return SLIPSTREAM_OK;
  });
}

slipstream_status slipstream_policy_step(slipstream_policy* p, const slipstream_game_frame* frame,
                                         slipstream_controller* out) {
  return step_games(false, p, 1, frame, out);
}

slipstream_status slipstream_policy_distribution_of(const slipstream_policy* p, int32_t game,
                                                    slipstream_distribution* out) {
  if (!p) return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_distribution: NULL");
  const HandleUse use(p);
  if (!use.owned()) return use.refused("slipstream_policy_distribution");
  if (!out) return fail(p, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_distribution: out is NULL");
  if (game < 0 || (p->games > 0 && game >= p->games))
    return fail(p, SLIPSTREAM_E_ARGUMENT,
                "slipstream_policy_distribution: game " + std::to_string(game) +
                    " of a stream of " + std::to_string(p->games) + " game(s)");
  if (game >= p->games || !p->stepped[static_cast<size_t>(game)])
    return fail(p, SLIPSTREAM_E_ARGUMENT,
                game == 0
                    ? std::string("slipstream_policy_distribution: no step since open or reset")
                    : "slipstream_policy_distribution: no step of game " + std::to_string(game) +
                          " since it started");
  *out = p->last[static_cast<size_t>(game)];
  return SLIPSTREAM_OK;
}

slipstream_status slipstream_policy_distribution(const slipstream_policy* p,
                                                 slipstream_distribution* out) {
  return slipstream_policy_distribution_of(p, 0, out);
}

slipstream_status slipstream_policy_set_sampling(slipstream_policy* p, float temperature,
                                                 uint64_t seed) {
  if (!p) return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_set_sampling: NULL");
  const HandleUse use(p);
  if (!use.owned()) return use.refused("slipstream_policy_set_sampling");
  if (!std::isfinite(temperature) || temperature < 0)
    return fail(p, SLIPSTREAM_E_ARGUMENT,
                "slipstream_policy_set_sampling: temperature must be finite and >= 0");
  p->temperature = temperature;
  p->seed = seed;
  for (size_t i = 0; i < p->game_keys.size(); ++i) {
    p->game_keys[i] = game_seed(seed, static_cast<int32_t>(i));
    p->frames_drawn[i] = 0;
  }
  return SLIPSTREAM_OK;
}

slipstream_status slipstream_policy_frame_tensors(const slipstream_game_frame* frame,
                                                  slipstream_frame_tensors* out) {
  if (!frame || !out)
    return fail(nullptr, SLIPSTREAM_E_ARGUMENT, "slipstream_policy_frame_tensors: a NULL pointer");
  FedFrame f;
  if (std::string e = frame_features(*frame, f); !e.empty())
    return fail(nullptr, SLIPSTREAM_E_ARGUMENT, e);
  static_assert(sizeof out->numeric == sizeof f.numeric &&
                    sizeof out->prev_controller == sizeof f.prev_controller,
                "slipstream_frame_tensors holds one FedFrame");
  std::memcpy(out->numeric, f.numeric, sizeof f.numeric);
  std::memcpy(out->prev_controller, f.prev_controller, sizeof f.prev_controller);
  for (int s = 0; s < kSlots; ++s) {
    out->action[s] = f.action[s];
    out->character[s] = f.character[s];
  }
  out->stage = f.stage;
  return SLIPSTREAM_OK;
}

const char* slipstream_policy_describe(const slipstream_policy* p) {
  return p ? p->description.c_str() : "";
}

int32_t slipstream_policy_frame_delay(const slipstream_policy* p) {
  return p ? p->frame_delay : -1;
}

const char* slipstream_policy_error(const slipstream_policy* p) {
  return p ? p->error.c_str() : g_open_error.c_str();
}

void slipstream_policy_close(slipstream_policy* p) {
  if (!p) return;
  // A call in progress on another thread (a worker's step while the program shuts down) ends
  // first: freeing the model under it crashed the process. Calls after close are the caller's
  // mistake, as with any freed pointer.
  while (p->busy.exchange(true)) std::this_thread::sleep_for(std::chrono::microseconds(100));
  try {
    p->arena->execute([&] { p->runner.reset(); });
  } catch (...) {
  }
  delete p;
}

}  // extern "C"
