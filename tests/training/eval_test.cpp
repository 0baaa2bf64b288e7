// Scoring checkpoints: `slipstream eval` gives the figures the run's own validation pass gave on
// the same games, --port keeps one player's windows, a mismatched, corrupt or incomplete
// checkpoint is one clear error; Runner::stream (frame by frame, state carried) gives the
// window forward's outputs for Mamba and GRU; `slipstream infer` plays a replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "stages/melee/replay_scoring.h"
#include "stages/melee/slp/synth.h"
#include "tests/support/cli_output.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using namespace slipstream::testing;
namespace fs = std::filesystem;

namespace {

CliOutput run_cli(const std::string& args) {
  return run_command(std::string(SLIPSTREAM_CLI) + " " + args);
}

void stream_equals_window(const RunResult& run, const std::string& replay) {
  const int frames = 40;
  const auto window = head_outputs(run.run_dir, replay, frames, false);
  const auto stream = head_outputs(run.run_dir, replay, frames, true);
  double worst = 0;
  for (size_t h = 0; h < 6; ++h) {
    ASSERT_EQ(window[h].size(), stream[h].size()) << h;
    ASSERT_GT(window[h].size(), 0u);
    for (size_t i = 0; i < window[h].size(); ++i)
      worst = std::max(worst, std::abs(double(window[h][i]) - double(stream[h][i])));
  }
  std::printf("max |window - stream| over %d frames, 6 heads: %.3g\n", frames, worst);
  EXPECT_LT(worst, 1e-4);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(Eval, FiguresEqualTheRunsValidationPassOnTheSameGames) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(d.path(), val, 6);
  ASSERT_EQ(run.final_step, 6u);
  const auto& v = run.last_validation_metrics;  // the last pass: step 6, the last checkpoint
  ASSERT_TRUE(v.count("nll") && v.count("baseline/loss") && v.count("acc/buttons"));

  const std::string out = d.path() + "/eval.json";
  const CliOutput o =
      run_cli("eval --checkpoint " + run.run_dir + " --replays " + val + " --json " + out);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("baseline nll"), std::string::npos) << o.text;
  const nlohmann::json j = read_json(out);
  EXPECT_EQ(j["step"].get<uint64_t>(), 6u);
  EXPECT_GT(j["windows"].get<uint64_t>(), 0u);
  size_t compared = 0;
  for (const auto& [name, value] : v) {
    ASSERT_TRUE(j["metrics"].contains(name)) << name;
    EXPECT_DOUBLE_EQ(j["metrics"][name].get<double>(), value) << name;
    ++compared;
  }
  EXPECT_GE(compared, 26u);  // loss, nll, 6 heads × (loss, nll, acc, baseline loss/acc), baseline
  EXPECT_DOUBLE_EQ(j["heads"]["main_x"]["nll"].get<double>(), v.at("nll/main_x"));
  EXPECT_DOUBLE_EQ(j["total"]["baseline_nll"].get<double>(), v.at("baseline/loss"));

  // Held-out games draw no warning; a game the run trained on is named as such, by its file,
  // under another name, or from a corpus built of the files.
  EXPECT_EQ(o.text.find("training split"), std::string::npos) << o.text;
  EXPECT_EQ(j["perspectives"], "all");
  EXPECT_EQ(j["training_overlap"]["games"].get<size_t>(), 0u);
  const std::string trained = d.path() + "/synth";
  const std::string renamed = d.path() + "/renamed";
  fs::create_directories(renamed);
  for (const auto& f : fs::recursive_directory_iterator(trained))
    if (f.path().extension() == ".slp" && !fs::exists(renamed + "/held_out_honest.slp"))
      fs::copy_file(f.path(), renamed + "/held_out_honest.slp");
  const std::string corpus = d.path() + "/corpus";
  ASSERT_EQ(run_cli("corpus build --out " + corpus + " " + trained).status, 0);
  for (const std::string& given : {trained, renamed, corpus}) {
    const CliOutput t =
        run_cli("eval --checkpoint " + run.run_dir + " --replays " + given + " --json -");
    ASSERT_EQ(t.status, 0) << t.text;
    EXPECT_NE(t.text.find(" games scored were in this run's training split (" + run.run_dir +
                          "/replays.splits.json; matched by the game, whatever its file's "
                          "name): their figures are not held out: "),
              std::string::npos)
        << given << ": " << t.text;
    const nlohmann::json tj = nlohmann::json::parse(t.text.substr(t.text.find("{\n")));
    EXPECT_GT(tj["training_overlap"]["games"].get<size_t>(), 0u) << given;
  }

  // A checkpoint a rewind set aside was trained on its run's splits too.
  const std::string aside = run.run_dir + "/set-aside/after-step-3-x/checkpoints/step-6";
  fs::create_directories(aside);
  fs::copy(run.run_dir + "/checkpoints/step-6", aside, fs::copy_options::recursive);
  const CliOutput sa = run_cli("eval --checkpoint " + aside + " --replays " + trained);
  ASSERT_EQ(sa.status, 0) << sa.text;
  EXPECT_NE(sa.text.find(" games scored were in this run's training split ("), std::string::npos)
      << sa.text;
  fs::remove_all(run.run_dir + "/set-aside");

  // The step directory names the same checkpoint; one port's player is half the windows.
  const std::string step_dir = run.run_dir + "/checkpoints/step-6";
  const CliOutput p =
      run_cli("eval --checkpoint " + step_dir + " --replays " + val + " --port 1 --json -");
  ASSERT_EQ(p.status, 0) << p.text;
  const nlohmann::json pj = nlohmann::json::parse(p.text.substr(p.text.find("{\n")));
  EXPECT_EQ(pj["perspectives"], "port1");
  EXPECT_GT(pj["windows"].get<uint64_t>(), 0u);
  EXPECT_LT(pj["windows"].get<uint64_t>(), j["windows"].get<uint64_t>());

  // The checkpoint copied out of its run (and the run's config.yaml gone): its weights carry the
  // graph, so it rebuilds and scores the same.
  const std::string alone = d.path() + "/shared/model-a";
  fs::create_directories(alone);
  fs::copy(step_dir, alone, fs::copy_options::recursive);
  fs::rename(run.run_dir + "/config.yaml", run.run_dir + "/config.moved.yaml");
  const CheckpointPath where = find_checkpoint(alone);
  ASSERT_TRUE(where.error.empty()) << where.error;
  EXPECT_TRUE(where.run_dir.empty());
  EXPECT_EQ(where.graph_file, alone + "/model.safetensors");
  const CliOutput a = run_cli("eval --checkpoint " + alone + " --replays " + val + " --json -");
  ASSERT_EQ(a.status, 0) << a.text;
  const nlohmann::json aj = nlohmann::json::parse(a.text.substr(a.text.find("{\n")));
  // Away from its run, whether the replays trained it cannot be told: said, and null in JSON.
  EXPECT_NE(a.text.find("whether these replays trained it cannot be told"), std::string::npos)
      << a.text;
  EXPECT_TRUE(aj["training_overlap"].is_null());
  EXPECT_EQ(aj["metrics"], j["metrics"]);
  EXPECT_EQ(aj["step"].get<uint64_t>(), 6u);
  const CliOutput s = run_cli("summary " + alone);
  ASSERT_EQ(s.status, 0) << s.text;
  EXPECT_NE(s.text.find("core"), std::string::npos) << s.text;
  // Resuming needs a run to continue; the message says how to train on from the weights.
  const CliOutput r = run_cli("run --resume " + alone);
  EXPECT_EQ(r.status, 1) << r.text;
  EXPECT_NE(r.text.find("run.init_from=" + alone), std::string::npos) << r.text;
}

// --whole-games: each validation game's windows in order, the model's state carried from one to
// the next (the run's graph connects `continues`): the same windows (the tiny runs' stride is
// their window) scored with other figures, and said so in the text and the JSON.
// A run whose weights started from another run's (run.init_from) saw that run's games too:
// eval names them as not held out, following the chain of config.yaml files.
TEST(Eval, GamesOfTheRunAFineTuneStartedFromAreNotHeldOut) {
  TempDir d, e;
  const std::string val = d.path() + "/val";
  const RunResult base = train_with_pinned_validation(d.path(), val, 4);
  auto sets = tiny_overrides(e.path());  // other synthetic games
  sets.push_back("replays.validation_paths=[" + val + "]");
  sets.push_back("run.steps=2");
  sets.push_back("run.init_from=" + base.run_dir);
  std::ostringstream log;
  Runner r(plan_graph(load_config(source_path("configs/train_bc.yaml"), sets)),
           quiet_run_options(log));
  const RunResult tuned = r.run();
  ASSERT_EQ(tuned.final_step, 2u);

  const std::string base_games = d.path() + "/synth";
  const CliOutput t = run_cli("eval --checkpoint " + tuned.run_dir + " --replays " + base_games);
  ASSERT_EQ(t.status, 0) << t.text;
  EXPECT_NE(t.text.find("games scored were in this run's training split or that of a run its "
                        "weights started from (run.init_from)"),
            std::string::npos)
      << t.text;
  EXPECT_NE(t.text.find(base_games), std::string::npos) << t.text;
  // Its validation games trained in neither run.
  const CliOutput v = run_cli("eval --checkpoint " + tuned.run_dir + " --replays " + val);
  ASSERT_EQ(v.status, 0) << v.text;
  EXPECT_EQ(v.text.find("training split"), std::string::npos) << v.text;
}

TEST(Eval, WholeGamesCarryTheStateThroughEachGame) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(d.path(), val, 4);
  ASSERT_EQ(run.final_step, 4u);
  const CliOutput w =
      run_cli("eval --checkpoint " + run.run_dir + " --replays " + val + " --whole-games --json -");
  ASSERT_EQ(w.status, 0) << w.text;
  EXPECT_NE(w.text.find("whole games, the state carried"), std::string::npos) << w.text;
  const CliOutput o =
      run_cli("eval --checkpoint " + run.run_dir + " --replays " + val + " --json -");
  ASSERT_EQ(o.status, 0) << o.text;
  const nlohmann::json wj = nlohmann::json::parse(w.text.substr(w.text.find("{\n")));
  const nlohmann::json oj = nlohmann::json::parse(o.text.substr(o.text.find("{\n")));
  EXPECT_TRUE(wj["whole_games"].get<bool>());
  EXPECT_FALSE(oj["whole_games"].get<bool>());
  EXPECT_EQ(wj["windows"], oj["windows"]);
  const double a = wj["metrics"]["nll"].get<double>(), b = oj["metrics"]["nll"].get<double>();
  EXPECT_GT(std::abs(a - b), 1e-6 * std::abs(b)) << "the carried state changed no figure";
  // Each game from its first window to its last whatever the batch: one game a batch gives the
  // figures of many (up to the order the sums are taken in).
  const CliOutput one = run_cli("eval --checkpoint " + run.run_dir + " --replays " + val +
                                " --whole-games --json - --set replays.batch_size=1");
  ASSERT_EQ(one.status, 0) << one.text;
  const nlohmann::json j1 = nlohmann::json::parse(one.text.substr(one.text.find("{\n")));
  EXPECT_EQ(j1["windows"], wj["windows"]);
  EXPECT_NEAR(j1["metrics"]["nll"].get<double>(), a, 1e-9 * std::abs(a));
  // A graph that cannot carry the state (its model does not read `continues`) is refused, not
  // scored from zero state under the name of whole games.
  std::string graph;
  {
    std::ifstream f(source_path("configs/train_bc.yaml"));
    graph.assign(std::istreambuf_iterator<char>(f), {});
  }
  const std::string wired = "inputs: [embed, h2d]";
  ASSERT_NE(graph.find(wired), std::string::npos);
  graph.replace(graph.find(wired), wired.size(), "inputs: [embed]");
  const std::string file = d.path() + "/no_carry.yaml";
  std::ofstream(file) << graph;
  auto sets = tiny_overrides(d.path() + "/no_carry");
  sets.push_back("run.steps=2");
  std::ostringstream log;
  Runner r(plan_graph(load_config(file, sets)), quiet_run_options(log));
  const RunResult no_carry = r.run();
  const CliOutput refused =
      run_cli("eval --checkpoint " + no_carry.run_dir + " --replays " + val + " --whole-games");
  EXPECT_EQ(refused.status, 2) << refused.text;
  EXPECT_NE(refused.text.find("stage 'core' (mamba) of this run's graph does not read it"),
            std::string::npos)
      << refused.text;
}

TEST(Eval, MismatchedCorruptOrIncompleteCheckpointIsOneClearError) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(d.path(), val, 2);
  const std::string ckpt = run.run_dir + "/checkpoints/step-2";
  ASSERT_TRUE(fs::exists(ckpt + "/DONE"));

  // Sizes that are not the checkpoint's: the tensor, both shapes, what to check.
  CliOutput o =
      run_cli("eval --checkpoint " + ckpt + " --replays " + val + " --set core.d_model=24");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("in the checkpoint but"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("were the sizes changed?"), std::string::npos) << o.text;

  // A run's config.yaml stands for the run; a checkpoint that is not there names the ones that
  // are; a run directory that lost its config.yaml names its checkpoints to give instead.
  o = run_cli("eval --checkpoint " + run.run_dir + "/config.yaml --replays " + val);
  EXPECT_EQ(o.status, 0) << o.text;
  o = run_cli("eval --checkpoint " + run.run_dir + "/checkpoints/step-999 --replays " + val);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("step-999: no such file or directory (the checkpoints there: "),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("step-2"), std::string::npos) << o.text;
  fs::rename(run.run_dir + "/config.yaml", run.run_dir + "/config.kept");
  o = run_cli("eval --checkpoint " + run.run_dir + " --replays " + val);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("a run directory without its config.yaml; give one of its checkpoints ("),
            std::string::npos)
      << o.text;
  o = run_cli("eval --checkpoint " + ckpt + " --replays " + val);  // as it suggests: it scores
  EXPECT_EQ(o.status, 0) << o.text;
  fs::rename(run.run_dir + "/config.kept", run.run_dir + "/config.yaml");

  // A truncated weights file names itself.
  const std::string model = ckpt + "/model.safetensors";
  fs::resize_file(model, 100);
  o = run_cli("eval --checkpoint " + ckpt + " --replays " + val);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("model.safetensors"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("terminate"), std::string::npos) << o.text;

  // A checkpoint whose write never finished, and a directory that is no run.
  fs::remove(ckpt + "/DONE");
  o = run_cli("eval --checkpoint " + ckpt + " --replays " + val);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("incomplete checkpoint"), std::string::npos) << o.text;
  o = run_cli("eval --checkpoint " + d.path() + " --replays " + val);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("not a run directory"), std::string::npos) << o.text;
  // With no complete checkpoint left the run has nothing to score.
  o = run_cli("eval --checkpoint " + run.run_dir + " --replays " + val);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("no complete periodic checkpoint; its best checkpoint: best-step-2"),
            std::string::npos)
      << o.text;
}

TEST(Stream, FrameByFrameEqualsTheWindowForwardMamba) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(d.path(), val, 3);
  stream_equals_window(run, val + "/synth_00000.slp");
}

TEST(Stream, FrameByFrameEqualsTheWindowForwardGru) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(d.path(), val, 3, "train_bc_gru.yaml",
                                                     {"core.hidden=16", "core.layers=2"});
  stream_equals_window(run, val + "/synth_00000.slp");
}

// A run trained on streams and validated on whole games: infer and eval play it too (infer's
// frame-by-frame loader takes shuffled rows and must not keep the run's whole-game validation,
// which needs streams).
TEST(Infer, PlaysARunValidatedOnWholeGames) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(
      d.path(), val, 4, "train_bc.yaml",
      {"core.d_model=16", "core.layers=1", "core.d_state=8", "replays.rows=streams",
       "replays.stride=0", "replays.validation_rows=whole_games"});
  ASSERT_EQ(run.final_step, 4u);
  const CliOutput o = run_cli("infer --checkpoint " + run.run_dir + " --replay " + val +
                              "/synth_00000.slp --port 2");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("latency per frame"), std::string::npos) << o.text;
  const CliOutput e = run_cli("eval --checkpoint " + run.run_dir + " --replays " + val);
  EXPECT_EQ(e.status, 0) << e.text;
}

TEST(Infer, PlaysAReplayFrameByFrame) {
  TempDir d;
  const std::string val = d.path() + "/val";
  const RunResult run = train_with_pinned_validation(d.path(), val, 3);
  const std::string csv = d.path() + "/frames.csv";
  CliOutput o = run_cli("infer --checkpoint " + run.run_dir + " --replay " + val +
                        "/synth_00000.slp --port 2 --csv " + csv);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("latency per frame"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("baseline acc"), std::string::npos) << o.text;
  const size_t at = o.text.find(" frames, checkpoint step 3");
  ASSERT_NE(at, std::string::npos) << o.text;
  const long frames = std::stol(o.text.substr(o.text.rfind(' ', at - 1) + 1));
  EXPECT_GT(frames, 500);  // a 900-row game, every frame but the last
  std::ifstream f(csv);
  std::string header, line;
  std::getline(f, header);
  EXPECT_EQ(header.rfind("frame,pred_A,", 0), 0u) << header;
  long rows = 0, pred_acts = 0, rec_acts = 0, sampled_acts = 0, sampled_differs = 0;
  int32_t prev_frame = -1000;
  while (std::getline(f, line)) {
    std::vector<double> v;
    std::stringstream cells(line);
    for (std::string c; std::getline(cells, c, ',');) v.push_back(std::stod(c));
    ASSERT_EQ(v.size(), 41u) << line;  // frame, 13 most likely, 13 recorded, 13 sampled, latency
    EXPECT_GT(v[0], prev_frame) << "frames in game order";
    prev_frame = static_cast<int32_t>(v[0]);
    // Acting: a button, a stick off centre or the trigger (13 values: 8 buttons, 5 axes).
    auto acts = [&](size_t at) {
      for (size_t k = at; k < at + 13; ++k)
        if (v[k] != 0) return 1;
      return 0;
    };
    pred_acts += acts(1);
    rec_acts += acts(14);
    sampled_acts += acts(27);
    sampled_differs += !std::equal(v.begin() + 1, v.begin() + 14, v.begin() + 27);
    ++rows;
  }
  EXPECT_EQ(rows, frames);
  // The action rates: the recorded player's, the most likely input's and the sampled policy's
  // (temperature 1 by default) as the CSV has them (rec_*, pred_*, sampled_*).
  const std::regex rates(
      R"(frames acting \(a button, a stick off centre, the trigger\): recorded ([0-9.]+) %, )"
      R"(policy sampled at temperature 1 \(seed 0\) ([0-9.]+) %, most likely input ([0-9.]+) %)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(o.text, m, rates)) << o.text;
  // One line of action rates, the policy's own draws (not also the scoring table's expectation).
  EXPECT_EQ(o.text.find("positions acting"), std::string::npos) << o.text;
  EXPECT_NEAR(std::stod(m[1]), 100.0 * double(rec_acts) / double(rows), 0.051) << o.text;
  EXPECT_NEAR(std::stod(m[2]), 100.0 * double(sampled_acts) / double(rows), 0.051) << o.text;
  EXPECT_NEAR(std::stod(m[3]), 100.0 * double(pred_acts) / double(rows), 0.051) << o.text;
  EXPECT_GT(sampled_differs, rows / 10) << "the sampled columns are draws, not the most likely";
  // At temperature 0 the sampled policy is the most likely input.
  o = run_cli("infer --checkpoint " + run.run_dir + " --replay " + val +
              "/synth_00000.slp --port 2 --temperature 0");
  ASSERT_TRUE(std::regex_search(o.text, m,
                                std::regex(R"(temperature 0 \(seed 0\) ([0-9.]+) %, most likely )"
                                           R"(input ([0-9.]+) %)")))
      << o.text;
  EXPECT_EQ(m[1].str(), m[2].str()) << o.text;

  // A port nobody played is an error, not an empty success.
  o = run_cli("infer --checkpoint " + run.run_dir + " --replay " + val +
              "/synth_00000.slp --port 4");
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_EQ(o.text.find("terminate"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("port 4 has no player (players on ports 1, 2)"), std::string::npos)
      << o.text;
}

// The learning curve, CI-sized: a cpu_quick run (600 steps, about 10 s on 2 cores) on the shared
// replays beats repeating the previous input on games it never trained on (its validation
// games): NLL at most 0.7 of the baseline's, and both main-stick axes more often right. Measured
// at a4e6cc7 (docs/model.md): 0.60, main x 91.6 vs 89.8 %, main y 94.2 vs 93.4 %; without the
// previous input's classes (prev_classes=false) the same run was below on both axes (88.1,
// 91.6 %), which this test would report.
TEST(LearningCurve, CpuQuickBeatsRepeatLastOnGamesItNeverSaw) {
  const std::string replays = shared_replays();
  // CI has the shared replays beside its clone: there a missing folder is a failure, not a skip.
  if (replays.empty() && std::getenv("CI")) FAIL() << "CI without ../shared/replays";
  if (replays.empty()) GTEST_SKIP() << "../shared/replays is not beside the checkout";
  TempDir d;
  const CliOutput r = run_cli("run --preset cpu_quick --set \"replays.paths=[" + replays +
                              "]\" --set run.runs_dir=" + d.path() +
                              "/runs --set run.threads=2 --set run.seed=1 --set ckpt.every=600");
  ASSERT_EQ(r.status, 0) << r.text;
  std::string run_dir;
  for (const auto& e : fs::directory_iterator(d.path() + "/runs")) run_dir = e.path().string();
  ASSERT_FALSE(run_dir.empty());
  const nlohmann::json splits = read_json(run_dir + "/replays.splits.json");
  std::string games;
  for (const auto& g : splits["validation"]) games += " " + g.get<std::string>();
  ASSERT_GE(splits["validation"].size(), 3u);
  for (const auto& g : splits["validation"])
    for (const auto& t : splits["train"]) ASSERT_NE(g, t) << "a validation game was trained on";
  const CliOutput e = run_cli("eval --checkpoint " + run_dir + " --replays" + games + " --json -");
  ASSERT_EQ(e.status, 0) << e.text;
  const nlohmann::json j = nlohmann::json::parse(e.text.substr(e.text.find("{\n")));
  const double ratio = j["total"]["nll"].get<double>() / j["total"]["baseline_nll"].get<double>();
  EXPECT_LE(ratio, 0.7) << e.text;
  for (const char* head : {"main_x", "main_y"})
    EXPECT_GT(j["heads"][head]["acc"].get<double>(), j["heads"][head]["baseline_acc"].get<double>())
        << head << "\n"
        << e.text;
}
