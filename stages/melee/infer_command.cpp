// `slipstream infer`: drives a checkpoint's policy over one replay frame by frame, as a bot in
// the game would: the run's graph reads the replay as windows of one frame, in order, for one
// port's player, and Runner::stream carries the temporal model's state from each frame to the
// next (Streaming::recurrent). Writes each frame's most likely controller, the recorded one and
// the sampled policy's (--csv; with --probabilities also the distribution they came from),
// prints per-head accuracy against the recorded inputs, how
// often the policy acts (sampled, as the policy library answers by default, and its most likely
// input) against how often the player did, and the policy's per-frame latency (the section's
// stages before the loss: embedding, temporal step, heads).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/command_registry.h"
#include "engine/graph.h"
#include "engine/quantile.h"
#include "engine/runner.h"
#include "stages/melee/controller_choice.h"
#include "stages/melee/model_math.h"
#include "stages/melee/replay_scoring.h"
#include "stages/melee/replays.h"
#include "stages/melee/slp/parser.h"

namespace slipstream::melee {
namespace {

struct InferArgs {
  std::string checkpoint;
  std::string replay;
  int port = 1;
  std::string csv;
  bool probabilities = false;  // the CSV also holds each frame's distribution
  std::string device;
  std::vector<std::string> sets;
  float temperature = 1;  // of the sampled policy whose action rate is reported
  uint64_t seed = 0;
  bool op_times = false;  // each operation of a frame's CUDA graph timed on the device
};

// --op-times: the frames before these are not timed (graphs captured, caches warm).
constexpr uint64_t kUntimedFrames = 20;

// How often a policy acts (a button, a stick off centre, the trigger) against the recorded
// player: a behaviour-cloned policy's most likely input mostly stands still.
struct ActionRates {
  size_t frames = 0, recorded = 0, sampled = 0, most_likely = 0;
  // One frame: the recorded controller (the labels) and the policy's from the heads' `logits`
  // (81; `ar` the autoregressive weight or null), drawn at `temperature` and most likely. The
  // draws of frame f are the policy library's for a game keyed `seed` at its frame f (game 0 of
  // a handle with that seed).
  struct Frame {
    ChosenController recorded, sampled, most_likely;
  };
  Frame add(const float* rec_buttons, const int32_t* rec_sticks, const float* logits,
            const float* ar, float temperature, uint64_t seed) {
    Frame f;
    for (int k = 0; k < kButtons; ++k)
      if (rec_buttons[k] > 0.5f) f.recorded.buttons |= 1u << k;
    std::copy_n(rec_sticks, kStickHeads, f.recorded.classes);
    const uint64_t key = frame_draws_key(seed, frames++);
    f.sampled = choose_controller(logits, ar, temperature, key);
    f.most_likely = choose_controller(logits, ar, 0, key);
    recorded += f.recorded.acts();
    sampled += f.sampled.acts();
    most_likely += f.most_likely.acts();
    return f;
  }
  static double pct(size_t n, size_t of) { return of ? 100.0 * double(n) / double(of) : 0.0; }
};

// One CSV row: the frame the policy saw, its most likely controller (pred_*: the policy at
// temperature 0), the recorded one (rec_*), the sampled policy's (sampled_*: at --temperature,
// the policy library's draws for a game of --seed), and (with probabilities) the distribution:
// p_<button> and p_<head>_<class>, as the policy library's.
class FrameWriter {
 public:
  FrameWriter(const std::string& path, bool probabilities)
      : out_(path), probabilities_(probabilities) {
    if (!out_) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    static constexpr const char* kButtonNames[kButtons] = {"A", "B", "X", "Y",
                                                           "Z", "L", "R", "DUp"};
    out_ << "frame";
    for (const char* who : {"pred", "rec", "sampled"}) {
      for (const char* b : kButtonNames) out_ << ',' << who << '_' << b;
      for (const char* s : {"main_x", "main_y", "c_x", "c_y", "shoulder"})
        out_ << ',' << who << '_' << s;
    }
    if (probabilities_) {
      for (const char* b : kButtonNames) out_ << ",p_" << b;
      for (int h = 1; h < kHeads; ++h)
        for (int c = 0; c < head_width(h); ++c) out_ << ",p_" << kHeadNames[h] << '_' << c;
    }
    out_ << ",latency_us\n";
  }
  // `all`: the heads' 81 logits of the frame, in their column order.
  void row(int32_t frame, const float* all, const ActionRates::Frame& f, double seconds) {
    out_ << frame;
    for (const ChosenController* c : {&f.most_likely, &f.recorded, &f.sampled}) {
      for (int b = 0; b < kButtons; ++b) out_ << ',' << ((c->buttons >> b) & 1u);
      for (int h = 0; h < kStickHeads; ++h) out_ << ',' << value(h, c->classes[h]);
    }
    if (probabilities_) {  // the policy library's distribution, column by column
      float d[kHeadsWidth];
      heads_distribution(all, d);
      char p[32];
      for (const float q : d) {
        std::snprintf(p, sizeof p, ",%.9g", q);
        out_ << p;
      }
    }
    char lat[32];
    std::snprintf(lat, sizeof lat, ",%.1f\n", seconds * 1e6);
    out_ << lat;
  }
  bool ok() {
    out_.flush();
    return static_cast<bool>(out_);
  }

 private:
  static float value(int head, int cls) {
    return head == kShoulder ? shoulder_value(cls) : stick_value(cls);
  }
  std::ofstream out_;
  bool probabilities_;
};

// Why a replay gave no frame of `port` when the port has no player: ": port 1 has no player
// (players on ports 2, 4)". Empty otherwise (the loader said why it left the game out).
std::string ports_played(const std::string& replay, int port) {
  slp::ParseOptions o;
  o.items = false;
  try {
    const slp::Game g = slp::parse_slp_file(replay, o);
    std::string ports;
    for (const auto& p : g.info.start.players) {
      if (p.port + 1 == port) return "";
      ports += (ports.empty() ? "" : ", ") + std::to_string(p.port + 1);
    }
    return ": port " + std::to_string(port) + " has no player (" +
           (ports.empty() ? std::string("no players") : "players on ports " + ports) + ")";
  } catch (const slp::ParseError&) {
    return "";  // the loader's lines above name the damage
  }
}

int infer_command(const InferArgs& a) {
  const auto found = command_checkpoint(a.checkpoint, std::cerr, std::cerr);
  if (!found) return 1;
  const CheckpointPath& where = *found;
  std::vector<std::string> sets = a.sets;
  if (!a.device.empty()) sets.push_back("run.device=" + a.device);
  if (a.op_times) add_operation_time_sets(sets, a.device);
  GraphPlan plan;
  try {
    const ReplaySelection sel = frame_by_frame(a.replay, a.port, "infer");
    plan = plan_graph(config_for_replays(where.graph_file, sets, sel));
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  std::optional<FrameWriter> csv;
  std::vector<double> latency;
  ActionRates acts;
  std::vector<float> ar;  // the autoregressive heads' weight (empty: independent heads)
  bool ar_read = false;
  EvalResult r;
  TrainingOverlap overlap;
  try {
    if (!a.csv.empty()) csv.emplace(a.csv, a.probabilities);
    RunOptions options = RunOptions::embedded();
    if (a.op_times) options.time_operations_after_batches = kUntimedFrames;
    Runner runner(std::move(plan), options);
    Graph& g = runner.graph();
    const int src = stage_of_kind(g.plan(), "slippi_replays"),
              heads = stage_of_kind(g.plan(), "controller_heads");
    if (heads < 0) throw std::runtime_error("the run's graph has no controller_heads stage");
    auto* loader = dynamic_cast<ReplaysStage*>(&g.stage(static_cast<size_t>(src)));
    r = runner.stream(where.checkpoint, [&](const Batch& b, double seconds) {
      latency.push_back(seconds);
      const StageContext& hc = g.context(static_cast<size_t>(heads));
      float all[kHeadsWidth];  // the six heads' logits side by side
      for (int h = 0; h < kHeads; ++h) {
        const Tensor out = hc.output(b, kHeadNames[h]).to(Device::cpu());
        std::copy_n(out.data<float>(), head_width(h), all + head_offset(h));
      }
      if (!ar_read) {  // the weights are the checkpoint's from the first frame on
        ar = autoregressive_weight(g.stage(static_cast<size_t>(heads)));
        ar_read = true;
      }
      const StageContext& sc = g.context(static_cast<size_t>(src));
      const Tensor tb = sc.output(b, "target_buttons").to(Device::cpu());
      const Tensor ts = sc.output(b, "target_sticks").to(Device::cpu());
      const ActionRates::Frame f =
          acts.add(tb.data<float>(), ts.data<int32_t>(), all, ar.empty() ? nullptr : ar.data(),
                   a.temperature, a.seed);
      if (!csv) return;
      csv->row(loader ? loader->window(b.index, 0).frame : static_cast<int32_t>(b.index), all, f,
               seconds);
    });
    overlap = training_overlap(where, g);
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  if (csv && !csv->ok()) {
    std::cerr << "error: cannot write " << a.csv << "\n";
    return 1;
  }
  if (latency.empty()) {
    const std::string why = ports_played(a.replay, a.port);
    std::cerr << "error: " << a.replay << ": no frame of port " << a.port << " to play"
              << (why.empty() ? " (the loader's lines above say why)" : why) << "\n";
    return 1;
  }
  note_training_overlap(overlap, where, std::cerr);
  std::printf("infer: %s, port %d: %zu frames, checkpoint step %llu\n", a.replay.c_str(), a.port,
              latency.size(), static_cast<unsigned long long>(r.step));
  // The frames acting as this policy's own draws below, not the table's expectation of them.
  auto table = r.metrics;
  std::erase_if(table, [](const auto& kv) { return kv.first.starts_with("acts/"); });
  std::cout << head_table(table);
  std::printf(
      "frames acting (a button, a stick off centre, the trigger): recorded %.1f %%, policy "
      "sampled at temperature %g (seed %llu) %.1f %%, most likely input %.1f %%\n",
      ActionRates::pct(acts.recorded, acts.frames), double(a.temperature),
      static_cast<unsigned long long>(a.seed), ActionRates::pct(acts.sampled, acts.frames),
      ActionRates::pct(acts.most_likely, acts.frames));
  double sum = 0;
  for (double s : latency) sum += s;
  std::printf(
      "latency per frame (embedding, temporal step, heads): p50 %.1f us, p99 %.1f us, "
      "mean %.1f us, max %.1f us\n",
      quantile(latency, 0.5) * 1e6, quantile(latency, 0.99) * 1e6,
      sum / static_cast<double>(latency.size()) * 1e6,
      *std::max_element(latency.begin(), latency.end()) * 1e6);
  const auto& g = r.graph_steps;
  if (const uint64_t all = g.replayed + g.captured + g.issued + g.uncaptured; all > 0)
    std::printf(
        "cuda graph: %llu of %llu frames replayed (%llu captured, %llu issued, %llu "
        "uncaptured), %llu operations a frame%s\n",
        static_cast<unsigned long long>(g.replayed), static_cast<unsigned long long>(all),
        static_cast<unsigned long long>(g.captured), static_cast<unsigned long long>(g.issued),
        static_cast<unsigned long long>(g.uncaptured), static_cast<unsigned long long>(g.ops),
        r.graph_off_reason.empty() ? "" : ("; off: " + r.graph_off_reason).c_str());
  if (a.op_times) std::cout << format_operation_times(r.operation_times, 1, "frame");
  return 0;
}

// CLI11's NonNegativeNumber names its range's top (DBL_MAX, 300 digits), and an unsigned option
// takes -1 as 2^64 - 1: a value with a minus sign is refused in a word.
CLI::Validator not_negative(const std::string& what) {
  return CLI::Validator(
      [](std::string& v) {
        return !v.empty() && v[0] != '-' ? std::string() : "must be 0 or more, not " + v;
      },
      what);
}

void setup_infer(CLI::App& parent) {
  auto a = std::make_shared<InferArgs>();
  CLI::App* infer = parent.add_subcommand(
      "infer",
      "Play a checkpoint's policy over a replay frame by frame (state carried, as a bot would): "
      "accuracy against the recorded inputs, per-frame latency, optionally every prediction");
  add_checkpoint_option(*infer, a->checkpoint);
  infer->add_option("--replay", a->replay, "the replay (.slp) to play")->required();
  infer->add_option("--port", a->port, "the player whose inputs are predicted (1-4)")
      ->required()
      ->check(CLI::Range(1, 4));
  infer->add_option("--csv", a->csv,
                    "write each frame's controllers: the most likely (pred_*), the recorded "
                    "(rec_*) and the sampled policy's at --temperature and --seed (sampled_*)");
  CLI::Option* csv = infer->get_option("--csv");
  infer
      ->add_flag("--probabilities", a->probabilities,
                 "with --csv: also each frame's distribution (p_A .. p_DUp, p_main_x_0 .. "
                 "p_shoulder_4), as the policy library gives it")
      ->needs(csv);
  infer->add_option("--device", a->device, "auto | cpu | cuda | cuda:N | emulated");
  infer
      ->add_option("--temperature", a->temperature,
                   "of the sampled policy whose action rate is reported (the policy library's "
                   "default: 1; 0 is the most likely input)")
      ->check(not_negative("NUMBER >= 0"));
  infer->add_option("--seed", a->seed, "of the sampled policy's draws (0 to 2^64 - 1)")
      ->check(not_negative("UINT"));
  infer->add_option("--set,-s", a->sets, "override stage.param=value or run.key=value");
  infer->add_flag("--op-times", a->op_times,
                  "also time each operation of a frame's CUDA graph on the device (time stamps "
                  "between them; a CUDA device, or --device emulated), "
                  "after the first 20 frames: kernels by stage, microseconds a frame");
  infer->callback([a] {
    if (const int code = infer_command(*a); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace
}  // namespace slipstream::melee

SLIPSTREAM_REGISTER_COMMAND(melee_infer, "infer", slipstream::melee::setup_infer);
