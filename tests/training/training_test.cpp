// The behaviour-cloning graph end to end: exact resume (fp32 and bf16), checkpoints PyTorch can
// read, SIGINT, `stage run`, and learning on real replays.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "engine/checkpoint.h"
#include "engine/safetensors.h"
#include "engine/stats_record.h"
#include "kernels/gemm_onednn.h"
#include "stages/dist/grad_buckets.h"
#include "tests/support/cli_output.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using namespace slipstream::testing;

namespace {

std::map<std::string, Tensor> all_weights(Runner& r) {
  std::map<std::string, Tensor> w;
  for (size_t k = 0; k < r.graph().size(); ++k)
    for (Parameter* p : r.graph().stage(k).parameters())
      w[r.graph().plan().stages[k].name + "." + p->name] = p->value.clone();
  return w;
}

void expect_bit_equal(const std::map<std::string, Tensor>& a,
                      const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0) << name << " differs";
  }
}

// The tiny graph's overrides for train_bc.yaml, or train_bc_gru.yaml (its core a small GRU).
std::vector<std::string> tiny_graph_overrides(const std::string& dir, bool gru) {
  auto sets = tiny_overrides(dir);
  if (gru) {
    std::erase_if(sets, [](const std::string& s) { return s.starts_with("core."); });
    sets.push_back("core.hidden=12");
  }
  return sets;
}
std::string bc_graph(bool gru) {
  return source_path(gru ? "configs/train_bc_gru.yaml" : "configs/train_bc.yaml");
}

void resume_is_exact(const std::string& precision, const std::vector<std::string>& more = {},
                     bool gru = false) {
  TempDir d;
  std::ostringstream log;
  auto sets = tiny_graph_overrides(d.path(), gru);
  sets.insert(sets.end(), more.begin(), more.end());
  sets.push_back("run.precision=" + precision);
  sets.push_back("step.ema=0.9");  // EMA state must survive the resume too
  sets.push_back("ckpt.every=5");
  const std::string graph = bc_graph(gru);

  auto straight_sets = sets;
  straight_sets.push_back("run.steps=12");
  Runner straight(plan_graph(load_config(graph, straight_sets)), quiet_run_options(log));
  straight.run();
  auto wa = all_weights(straight);

  auto first_sets = sets;
  first_sets.push_back("run.steps=7");
  Runner first(plan_graph(load_config(graph, first_sets)), quiet_run_options(log));
  RunResult r1 = first.run();
  ASSERT_EQ(r1.final_step, 7u);

  RunOptions ro = quiet_run_options(log);
  ro.resume_dir = r1.run_dir;
  Runner second(plan_graph(load_config(graph, straight_sets)), ro);
  RunResult r2 = second.run();
  EXPECT_EQ(r2.final_step, 12u);
  EXPECT_EQ(r2.steps, 5u);
  expect_bit_equal(wa, all_weights(second));
}

using Output = slipstream::testing::CliOutput;
Output run_cli(const std::string& args) {
  return slipstream::testing::run_command(std::string(SLIPSTREAM_CLI) + " " + args);
}

}  // namespace

TEST(Training, ResumeIsBitExactFp32) {
  resume_is_exact("fp32");
}
// rows: streams: the rows' carried state goes into the checkpoint, so the resumed run's rows go
// on from where they were.
TEST(Training, ResumeIsBitExactWithCarriedState) {
  resume_is_exact("fp32", {"replays.rows=streams"});
  resume_is_exact("fp32", {"replays.rows=streams", "core.layers=2"}, true);
}

// Under rows: streams the model carries each row's state to the row's next window: with the
// loader's `continues` connected the second step's loss differs from the same run's without it
// (every row starts afresh), the first step's (nothing carried yet) does not. Mamba and GRU.
void streams_carry_the_models_state(bool gru) {
  SCOPED_TRACE(gru ? "gru" : "mamba");
  TempDir d;
  std::ostringstream log;
  auto sets = tiny_graph_overrides(d.path(), gru);
  for (const char* s : {"replays.rows=streams", "run.steps=3", "run.log_every=1"})
    sets.push_back(s);
  const std::string graph = bc_graph(gru);
  auto losses = [&](bool connected) {
    Config c = load_config(graph, sets);
    for (auto& s : c.stages)
      if (s.name == "core" && !connected)
        std::erase_if(s.inputs, [](const InputRef& r) { return r.stage == "h2d"; });
    Runner r(plan_graph(c), quiet_run_options(log));
    const RunResult res = r.run();
    std::vector<double> out;
    std::ifstream in(res.run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto row = nlohmann::json::parse(line);
      if (row.value("split", std::string()) == "train" && row.contains("loss"))
        out.push_back(row["loss"].get<double>());
    }
    return out;
  };
  const auto carried = losses(true), afresh = losses(false);
  ASSERT_EQ(carried.size(), 3u);
  ASSERT_EQ(afresh.size(), 3u);
  EXPECT_NEAR(carried[0], afresh[0], 1e-6 * std::abs(afresh[0]));
  EXPECT_GT(std::abs(carried[1] - afresh[1]), 1e-4 * std::abs(afresh[1]));
}

TEST(Training, StreamsCarryTheModelsState) {
  streams_carry_the_models_state(false);
  streams_carry_the_models_state(true);
}

// Under bf16 the stages write the bf16 copies that the next stages' GEMMs read (the embedding's
// x and prev_input, the core's y; run.bf16_copies), where those stages would round them
// themselves: the same bits either way, on the CPU and on the CUDA code path (the emulator).
TEST(Training, Bf16CopiesChangeNoBit) {
  for (const std::string device : {"cpu", "emulated"}) {
    SCOPED_TRACE(device);
    std::map<std::string, Tensor> weights[2];
    for (const bool copies : {true, false}) {
      TempDir d;
      std::ostringstream log;
      auto sets = tiny_graph_overrides(d.path(), false);
      std::erase(sets, "run.device=cpu");
      sets.push_back("run.device=" + device);
      sets.push_back("run.precision=bf16");
      sets.push_back("run.steps=3");
      sets.push_back(std::string("run.bf16_copies=") + (copies ? "true" : "false"));
      Runner r(plan_graph(load_config(bc_graph(false), sets)), quiet_run_options(log));
      r.run();
      weights[copies ? 0 : 1] = all_weights(r);
    }
    expect_bit_equal(weights[0], weights[1]);
  }
}

TEST(Training, ResumeIsBitExactBf16) {
  resume_is_exact("bf16");
}

// The model's weights are one block (engine/param_arena.h): every parameter of the embedding,
// the core and the heads views the run's arena — values, gradients and the bf16 copies — so an
// allreduce bucket that spans two stages is reduced where it lies.
TEST(Training, TheModelIsOneBlockAndBucketsNeedNoStaging) {
  TempDir d;
  std::ostringstream log;
  for (const bool gru : {false, true}) {
    SCOPED_TRACE(gru ? "gru" : "mamba");
    auto sets = tiny_graph_overrides(d.path(), gru);
    sets.push_back("run.precision=bf16");
    Runner r(plan_graph(load_config(bc_graph(gru), sets)), quiet_run_options(log));
    r.graph().setup();
    std::vector<Parameter*> params;
    for (size_t k = 0; k < r.graph().size(); ++k)
      for (Parameter* p : r.graph().stage(k).parameters()) params.push_back(p);
    ASSERT_GT(params.size(), 10u);
    const ParamArena& arena = *r.state().param_arena;
    ASSERT_TRUE(arena.packed());
    EXPECT_EQ(arena.stores(), 3u);  // embedding, core, heads
    size_t elems = 0;
    for (const Parameter* p : params) {
      EXPECT_TRUE(p->value.same_block(arena.values())) << p->name;
      EXPECT_TRUE(p->grad.same_block(arena.grads())) << p->name;
      if (p->low_precision.defined()) {
        EXPECT_TRUE(p->low_precision.same_block(arena.shadow())) << p->name;
      }
      elems += static_cast<size_t>(p->value.numel());
    }
    EXPECT_EQ(elems, static_cast<size_t>(arena.values().numel()));
    // Walked from the arena's end down, small buckets tile it: none crosses a gap, including
    // the two where one stage's weights end and the next's begin.
    std::sort(params.begin(), params.end(), [](const Parameter* a, const Parameter* b) {
      return a->grad.data<float>() > b->grad.data<float>();
    });
    const dist::GradBuckets buckets(params, 1000, 100);
    EXPECT_GT(buckets.count(), 3u);
    EXPECT_EQ(buckets.staging_elems(), 0u);
  }
}

TEST(Training, CheckpointHasMambaSsmNamesAndLoadsInPython) {
  TempDir d;
  std::ostringstream log;
  auto sets = tiny_overrides(d.path());
  sets.push_back("run.steps=3");
  Runner r(plan_graph(load_config(source_path("configs/train_bc.yaml"), sets)),
           quiet_run_options(log));
  RunResult res = r.run();
  auto ckpt = latest_checkpoint(res.run_dir);
  ASSERT_TRUE(ckpt);
  std::string model = *ckpt + "/model.safetensors";
  auto f = read_safetensors(model);
  // mamba-ssm's names and shapes (d_model 16, expand 2 -> d_inner 32, d_state 8, d_conv 4).
  EXPECT_EQ(f.tensors.at("core.layers.0.mixer.conv1d.weight").shape(), (Shape{32, 1, 4}));
  EXPECT_EQ(f.tensors.at("core.layers.0.mixer.A_log").shape(), (Shape{32, 8}));
  EXPECT_EQ(f.tensors.at("core.layers.0.mixer.in_proj.weight").shape(), (Shape{64, 16}));
  EXPECT_TRUE(f.tensors.count("core.layers.0.mixer.D"));
  EXPECT_TRUE(f.tensors.count("core.layers.0.norm.weight"));
  EXPECT_TRUE(f.tensors.count("core.norm_f.weight"));
  EXPECT_TRUE(f.tensors.count("embed.action_table.weight"));
  EXPECT_TRUE(f.tensors.count("heads.buttons.weight"));
  if (std::system("python3 -c 'import safetensors, numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3 with safetensors and numpy not available (make deps installs them)";
  std::string script = d.write("check.py", R"(import sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
assert t["core.layers.0.mixer.conv1d.weight"].shape == (32, 1, 4)
assert t["core.layers.0.mixer.A_log"].shape == (32, 8)
assert t["core.layers.0.mixer.x_proj.weight"].shape == (1 + 2 * 8, 32)
assert t["core.layers.0.mixer.dt_proj.weight"].shape == (32, 1)
assert t["core.layers.0.mixer.out_proj.weight"].shape == (16, 32)
assert str(t["core.norm_f.weight"].dtype) == "float32"
print("ok", len(t))
)");
  EXPECT_EQ(std::system(("python3 " + script + " " + model).c_str()), 0);
}

// precision bf16 on the CPU says at start what it does here: native bf16 GEMMs (oneDNN on a CPU
// with AVX-512 BF16) or rounded operands through sgemm, and then to prefer fp32.
TEST(Training, Bf16OnTheCpuSaysWhichGemmsRun) {
  TempDir d;
  std::ostringstream log;
  auto sets = tiny_overrides(d.path());
  sets.push_back("run.steps=2");
  sets.push_back("run.precision=bf16");
  Runner r(plan_graph(load_config(source_path("configs/train_bc.yaml"), sets)),
           quiet_run_options(log));
  EXPECT_EQ(r.run().final_step, 2u);
  const std::string text = log.str();
  const std::string want =
      kernels::onednn_bf16_gemm_native()
          ? "the GEMMs multiply bf16 natively (oneDNN, " + kernels::onednn_bf16_gemm_kernel()
          : std::string("use precision fp32 for speed on this CPU");
  EXPECT_NE(text.find("note: precision bf16 on the CPU: "), std::string::npos) << text;
  EXPECT_NE(text.find(want), std::string::npos) << text;
}

// run.init_from: a fine-tuning run starts from another run's weights with fresh optimizer state
// at step 0, its EMA starting from those weights; wrong sizes are one error naming the tensor.
TEST(Training, InitFromWarmStartsWeightsOnly) {
  TempDir d;
  std::ostringstream log;
  const std::string graph = source_path("configs/train_bc.yaml");
  auto sets = tiny_overrides(d.path());
  sets.push_back("run.steps=3");
  Runner first(plan_graph(load_config(graph, sets)), quiet_run_options(log));
  const RunResult a = first.run();
  const auto wa = all_weights(first);

  // lr 0: the weights stay what was loaded, so the run's checkpoint shows what it started from.
  auto tune = tiny_overrides(d.path());
  tune.push_back("run.steps=2");
  tune.push_back("step.lr=0");
  tune.push_back("step.ema=0.5");
  tune.push_back("run.init_from=" + a.run_dir);
  std::ostringstream tune_log;
  Runner second(plan_graph(load_config(graph, tune)), quiet_run_options(tune_log));
  const RunResult b = second.run();
  EXPECT_EQ(b.final_step, 2u) << "the step count starts at 0";
  EXPECT_NE(
      tune_log.str().find("initialised the weights from " + a.run_dir + "/checkpoints/step-3"),
      std::string::npos)
      << tune_log.str();
  expect_bit_equal(wa, all_weights(second));
  const auto state = read_safetensors(*latest_checkpoint(b.run_dir) + "/state.safetensors");
  EXPECT_EQ(state.metadata.at("step.step"), "2") << "optimizer state starts fresh";
  const Tensor& ema = state.tensors.at("step.ema.core.layers.0.mixer.in_proj.weight");
  const Tensor& w = wa.at("core.layers.0.mixer.in_proj.weight");
  ASSERT_EQ(ema.nbytes(), w.nbytes());
  EXPECT_EQ(std::memcmp(ema.raw(), w.raw(), w.nbytes()), 0) << "the EMA starts from the weights";

  auto wrong = tune;
  wrong.push_back("core.d_model=24");
  Runner third(plan_graph(load_config(graph, wrong)), quiet_run_options(tune_log));
  try {
    third.run();
    ADD_FAILURE() << "sizes that are not the checkpoint's must be refused";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("run.init_from:"), std::string::npos) << what;
    EXPECT_NE(what.find("in the checkpoint but"), std::string::npos) << what;
  }
  // A path that is not there is a validation error.
  auto missing = tiny_overrides(d.path());
  missing.push_back("run.init_from=" + d.path() + "/nowhere");
  EXPECT_THROW(plan_graph(load_config(graph, missing)), ConfigError);
}

TEST(Training, SigintFinishesStepWritesCheckpointExits130) {
  TempDir d;
  std::string args = "run --config " + source_path("configs/train_bc.yaml");
  for (const auto& s : tiny_overrides(d.path())) args += " --set " + s;
  args += " --set run.steps=1000000 --set run.epochs=100000 --set ckpt.every=0";
  args += " --set run.log_every=100000";  // the interrupt falls inside a row's window
  // The child publishes its stats record here: the test interrupts once it is training.
  setenv("SLIPSTREAM_STATS_DIR", d.path().c_str(), 1);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string log = d.path() + "/log.txt";
    freopen(log.c_str(), "w", stdout);
    execl("/bin/sh", "sh", "-c", (std::string("exec ") + SLIPSTREAM_CLI + " " + args).c_str(),
          nullptr);
    _exit(127);
  }
  // Wait until the run is taking steps (setup, synthetic games, ... may take a while on a slow
  // machine), then interrupt.
  bool stepping = false;
  for (int i = 0; i < 1200 && !stepping; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& f : stats::find_records(d.path()))
      stepping = stepping ||
                 (f.result.record && f.result.record->pid == pid && f.result.record->step >= 5);
  }
  unsetenv("SLIPSTREAM_STATS_DIR");
  if (!stepping) {  // don't leave the child running
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  ASSERT_TRUE(stepping) << "the run never started stepping";
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  std::ifstream in(d.path() + "/log.txt");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("interrupted"), std::string::npos) << text;
  std::optional<std::string> ckpt;
  for (const auto& e : std::filesystem::directory_iterator(d.path() + "/runs"))
    if (!ckpt) ckpt = latest_checkpoint(e.path().string());
  ASSERT_TRUE(ckpt.has_value()) << "no checkpoint after SIGINT";
  // The steps since the last row get a train row of their own before the end row (they were
  // in no row at all).
  {
    std::ifstream rows(std::filesystem::path(*ckpt).parent_path().parent_path() / "metrics.jsonl");
    std::vector<nlohmann::json> train, end;
    for (std::string line; std::getline(rows, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["split"] == "train") train.push_back(j);
      if (j["split"] == "end") end.push_back(j);
    }
    ASSERT_EQ(train.size(), 1u);
    ASSERT_FALSE(end.empty());
    EXPECT_EQ(train[0]["step"], end.back()["step"]);
    EXPECT_EQ(train[0]["steps_averaged"], end.back()["step"]);
  }

  // --resume takes the checkpoint directory itself; a resume past run.steps does nothing.
  const std::string name = std::filesystem::path(*ckpt).filename().string();
  const uint64_t step = std::stoull(name.substr(5));
  const std::string until = " --set run.steps=" + std::to_string(step + 2);
  Output more = run_cli("run --resume " + *ckpt + until);
  EXPECT_EQ(more.status, 0) << more.text;
  // The run's steps, then this process's part of them.
  EXPECT_NE(more.text.find("done: " + std::to_string(step + 2) + " steps; this resume 2 steps, "),
            std::string::npos)
      << more.text;
  Output again = run_cli("run --resume " + *ckpt + "/.." + "/.." + until);
  EXPECT_EQ(again.status, 0) << again.text;
  EXPECT_NE(again.text.find("nothing to do"), std::string::npos) << again.text;
}

TEST(Training, StageRunMatchesItselfAndWritesGradients) {
  TempDir d;
  Tensor x = Tensor::empty({2, 5, 16}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = 0.1f * static_cast<float>((i * 37) % 19) - 0.9f;
  Tensor dy = Tensor::empty({2, 5, 16}, DType::f32);
  for (int64_t i = 0; i < dy.numel(); ++i)
    dy.data<float>()[i] = 0.05f * static_cast<float>((i * 11) % 7) + 0.1f;
  write_safetensors(d.path() + "/in.safetensors", {{"x", x}});
  write_safetensors(d.path() + "/dy.safetensors", {{"y", dy}});
  Output o = run_cli("stage run mamba --set d_model=16 --set layers=1 --inputs " + d.path() +
                     "/in.safetensors --grad " + d.path() + "/dy.safetensors --out " + d.path() +
                     "/out.safetensors");
  ASSERT_EQ(o.status, 0) << o.text;
  auto out = read_safetensors(d.path() + "/out.safetensors").tensors;
  ASSERT_TRUE(out.count("y"));
  ASSERT_TRUE(out.count("grad.x"));
  ASSERT_TRUE(out.count("grad.layers.0.mixer.A_log"));
  EXPECT_EQ(out.at("y").shape(), (Shape{2, 5, 16}));
  // Re-running with the weights it wrote gives the same outputs: weights round-trip.
  std::map<std::string, Tensor> w;
  for (auto& [k, v] : out)
    if (k.starts_with("weight.")) w[k.substr(7)] = v;
  write_safetensors(d.path() + "/w.safetensors", w);
  Output o2 = run_cli("stage run mamba --set d_model=16 --set layers=1 --set seed=5 --inputs " +
                      d.path() + "/in.safetensors --weights " + d.path() + "/w.safetensors --out " +
                      d.path() + "/out2.safetensors");
  if (o2.status == 2) {  // `seed` is not a mamba parameter: run without it
    o2 = run_cli("stage run mamba --set d_model=16 --set layers=1 --inputs " + d.path() +
                 "/in.safetensors --weights " + d.path() + "/w.safetensors --out " + d.path() +
                 "/out2.safetensors");
  }
  ASSERT_EQ(o2.status, 0) << o2.text;
  auto out2 = read_safetensors(d.path() + "/out2.safetensors").tensors;
  EXPECT_EQ(std::memcmp(out.at("y").raw(), out2.at("y").raw(), out.at("y").nbytes()), 0);
  // Bad input names the problem.
  Output bad = run_cli("stage run mamba --inputs " + d.path() + "/dy.safetensors --out " +
                       d.path() + "/x.safetensors");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.text.find("has no input 'y'"), std::string::npos) << bad.text;
  // A gradient under a name that is no output would leave the output's at zero: refused.
  write_safetensors(d.path() + "/dY.safetensors", {{"Y", dy}});
  bad = run_cli("stage run mamba --set d_model=16 --set layers=1 --inputs " + d.path() +
                "/in.safetensors --grad " + d.path() + "/dY.safetensors --out " + d.path() +
                "/x.safetensors");
  EXPECT_EQ(bad.status, 1) << bad.text;
  EXPECT_NE(bad.text.find("'Y' is not an output of mamba (its outputs: y); did you mean 'y'?"),
            std::string::npos)
      << bad.text;
  // The weights it wrote read back as written (weight.NAME), as well as bare.
  std::map<std::string, Tensor> prefixed;
  for (auto& [k, v] : out)
    if (k.starts_with("weight.")) prefixed[k] = v;
  write_safetensors(d.path() + "/wp.safetensors", prefixed);
  Output o3 = run_cli("stage run mamba --set d_model=16 --set layers=1 --inputs " + d.path() +
                      "/in.safetensors --weights " + d.path() + "/wp.safetensors --out " +
                      d.path() + "/out3.safetensors");
  ASSERT_EQ(o3.status, 0) << o3.text;
  auto out3 = read_safetensors(d.path() + "/out3.safetensors").tensors;
  EXPECT_EQ(std::memcmp(out.at("y").raw(), out3.at("y").raw(), out.at("y").nbytes()), 0);
}

TEST(Training, CpuQuickBeatsBaselineOnRealReplays) {
  std::string replays = shared_replays();
  if (replays.empty()) GTEST_SKIP() << "../shared/replays not present";
  TempDir d;
  std::ostringstream log;
  std::vector<std::string> sets{"replays.paths=[" + replays + "]",
                                "run.runs_dir=" + d.path() + "/runs", "run.validate_every=600",
                                "run.validate_batches=40", "ckpt.every=0"};
  Runner r(plan_graph(load_config(source_path("presets/cpu_quick.yaml"), sets)),
           quiet_run_options(log));
  RunResult res = r.run();
  const auto& v = res.last_validation_metrics;
  ASSERT_TRUE(v.count("nll")) << log.str();
  ASSERT_TRUE(v.count("baseline/loss")) << log.str();
  std::printf("real replays, cpu_quick, %llu steps: validation nll %.4f vs baseline %.4f\n",
              static_cast<unsigned long long>(res.final_step), v.at("nll"), v.at("baseline/loss"));
  for (const auto& [k, x] : v)
    if (k.starts_with("nll/") || k.starts_with("acc/") || k.starts_with("baseline/"))
      std::printf("  %s %.4f\n", k.c_str(), x);
  EXPECT_LT(v.at("nll"), v.at("baseline/loss"));
}

TEST(Training, GruPresetTrainsAndBeatsItsStart) {
  TempDir d;
  std::ostringstream log;
  std::vector<std::string> sets{"replays.synthetic=6",
                                "replays.synthetic_dir=" + d.path() + "/synth",
                                "run.runs_dir=" + d.path() + "/runs",
                                "run.steps=120",
                                "run.epochs=5",
                                "run.validate_every=120",
                                "run.validate_batches=4",
                                "ckpt.every=0"};
  Runner r(plan_graph(load_config(source_path("presets/cpu_quick_gru.yaml"), sets)),
           quiet_run_options(log));
  RunResult res = r.run();
  EXPECT_EQ(res.final_step, 120u);
  const auto& v = res.last_validation_metrics;
  ASSERT_TRUE(v.count("nll")) << log.str();
  EXPECT_LT(v.at("nll"), v.at("baseline/loss")) << log.str();
  // The checkpoint carries PyTorch nn.GRU names.
  auto f = read_safetensors(*latest_checkpoint(res.run_dir) + "/model.safetensors");
  EXPECT_EQ(f.tensors.at("core.weight_ih_l0").shape()[0], 3 * 64);
  EXPECT_TRUE(f.tensors.count("core.bias_hh_l0"));
}

TEST(Training, TwoRanksUnderMpirunTrainInStep) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not found";
  TempDir d;
  std::string args = "run --config " + source_path("configs/train_bc.yaml");
  for (const auto& s : tiny_overrides(d.path())) args += " --set " + s;
  args += " --set run.steps=20 --set run.epochs=10 --set ckpt.every=10";
  // detect_leaks=0 matters only in sanitizer builds: Open MPI leaks in MPI_Init from components
  // it dlopens and unloads, which LeakSanitizer then cannot name (so cannot suppress).
  auto o = slipstream::testing::run_command(
      "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np 2 " +
      std::string(SLIPSTREAM_CLI) + " " + args);
  ASSERT_EQ(o.status, 0) << o.text;
  // Both ranks finish the same number of steps; one run directory, written by rank 0.
  size_t done = 0;
  for (size_t p = o.text.find("done: 20 steps"); p != std::string::npos;
       p = o.text.find("done: 20 steps", p + 1))
    ++done;
  EXPECT_EQ(done, 2u) << o.text;
  size_t run_dirs = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path() + "/runs")) {
    ++run_dirs;
    EXPECT_TRUE(latest_checkpoint(e.path().string()).has_value());
  }
  EXPECT_EQ(run_dirs, 1u);
}

// The tiny graph's overrides as `--set` arguments.
std::string tiny_set_args(const std::string& dir) {
  std::string args;
  for (const std::string& s : tiny_overrides(dir)) args += " --set " + s;
  return args;
}

// `slipstream bench`: the steps it says it timed, each stage's share, JSON for scripts, nothing
// written besides it; no steps to time is an error.
TEST(Bench, MeasuresTheSteadyStateAndWritesOnlyItsJson) {
  TempDir d;
  const std::string args = tiny_set_args(d.path());
  const std::string json = d.path() + "/bench.json";
  Output o = run_cli("bench --config " + source_path("configs/train_bc.yaml") + args +
                     " --steps 4 --warmup 2 --json " + json);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("4 steps timed after"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("data wait"), std::string::npos) << o.text;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("steps"), 4);
  EXPECT_GT(j.at("step_median_ms").get<double>(), 0);
  EXPECT_GE(j.at("step_p90_ms").get<double>(), j.at("step_median_ms").get<double>());
  EXPECT_GT(j.at("samples_per_s").get<double>(), 0);
  // 8 windows of 16 frames per step.
  EXPECT_NEAR(j.at("frames_per_s").get<double>() / j.at("samples_per_s").get<double>(), 16, 1e-9);
  bool core = false;
  for (const auto& s : j.at("stages")) core |= s.at("name") == "core" && s.at("busy_pct") > 0;
  EXPECT_TRUE(core) << j.dump();
  EXPECT_GT(j.at("host_peak_rss_bytes").get<double>(), 0);
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/runs")) << "a benchmark writes no run";

  o = run_cli("bench --config " + source_path("configs/train_bc.yaml") + args + " --steps 0");
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("--steps"), std::string::npos) << o.text;
}

// `slipstream bench --overlap`: the same step on loaded and on resident batches, alternating,
// and their ratio; the resident runs load nothing after their batches; no GPU, no GPU busy.
TEST(Bench, OverlapTimesTheStepWithAndWithoutTheDataPath) {
  TempDir d;
  const std::string args = tiny_set_args(d.path());
  const std::string json = d.path() + "/overlap.json";
  Output o = run_cli("bench --config " + source_path("configs/train_bc.yaml") + args +
                     " --steps 6 --warmup 2 --overlap --repeats 2 --resident 3 --json " + json);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("on 3 resident batches"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("overlap: "), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("GPU busy"), std::string::npos) << o.text;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j.at("loading").size(), 2u);
  ASSERT_EQ(j.at("resident").size(), 2u);
  EXPECT_EQ(j.at("loading")[0].at("resident_batches"), 0);
  EXPECT_EQ(j.at("resident")[1].at("resident_batches"), 3);
  EXPECT_EQ(j.at("resident")[1].at("steps"), 6);
  EXPECT_FALSE(j.at("resident")[1].contains("gpu_busy_pct"));
  const double ratio = j.at("overlap_ratio").get<double>();
  EXPECT_NEAR(
      ratio, j.at("loading_steps_per_s").get<double>() / j.at("resident_steps_per_s").get<double>(),
      1e-12);
  EXPECT_GT(ratio, 0);
}

// `slipstream summary`: every stage's parameters add up to what a checkpoint of the same graph
// holds, a step's FLOPs are the stages' sum (mamba's GEMMs at their exact count), and a run
// directory gives the same figures as the graph that made it.
TEST(Summary, CountsWhatTheCheckpointHoldsAndWhatAStepComputes) {
  TempDir d;
  auto sets = tiny_overrides(d.path());
  std::string args;
  for (const std::string& s : sets) args += " --set " + s;
  const std::string json = d.path() + "/summary.json";
  Output o = run_cli("summary " + source_path("configs/train_bc.yaml") + args + " --json " + json);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("per optimizer step"), std::string::npos) << o.text;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("samples_per_batch"), 8);
  double step = 0;
  uint64_t params = 0;
  for (const auto& st : j.at("stages")) {
    params += st.at("parameters").get<uint64_t>();
    step += st.at("flops_per_step").get<double>();
    if (st.at("name") == "core") {
      EXPECT_GT(st.at("forward_flops").get<double>(), 0);
      EXPECT_GT(st.at("backward_flops").get<double>(), st.at("forward_flops").get<double>());
    }
  }
  EXPECT_EQ(params, j.at("parameters").get<uint64_t>());
  EXPECT_NEAR(step, j.at("flops_per_step").get<double>(), 1e-6 * step);
  EXPECT_NEAR(j.at("flops_per_sample").get<double>() * 8, step, 1e-6 * step);

  sets.push_back("run.steps=1");
  std::ostringstream log;
  Runner r(plan_graph(load_config(source_path("configs/train_bc.yaml"), sets)),
           quiet_run_options(log));
  const RunResult res = r.run();
  const auto weights = read_safetensors(*latest_checkpoint(res.run_dir) + "/model.safetensors");
  uint64_t stored = 0;
  for (const auto& [name, t] : weights.tensors) stored += static_cast<uint64_t>(t.numel());
  EXPECT_EQ(stored, params);

  o = run_cli("summary " + res.run_dir + " --json " + json);
  ASSERT_EQ(o.status, 0) << o.text;
  std::ifstream again(json);
  const auto k = nlohmann::json::parse(again);
  EXPECT_EQ(k.at("parameters"), j.at("parameters"));
  EXPECT_EQ(k.at("flops_per_step"), j.at("flops_per_step"));

  o = run_cli("summary " + d.path());  // a directory that is no run
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("without config.yaml"), std::string::npos) << o.text;
  // A checkpoint that is not there: the run's, by name, as eval and infer say it.
  o = run_cli("summary " + res.run_dir + "/checkpoints/step-999999");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("no such file or directory (the checkpoints there: step-"),
            std::string::npos)
      << o.text;
  // A binary file (a replay given by mistake) is said as that, its bytes not printed.
  const std::string binary = d.path() + "/game.slp";
  std::ofstream(binary, std::ios::binary) << std::string("{U\x03raw[$U#l\0\0\x0f\x01", 14);
  o = run_cli("summary " + binary);
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("is not a YAML file (it holds binary data)"), std::string::npos) << o.text;
}

// `slipstream reference-step` writes the first training step as the run takes it: its loss is
// the first train row's, the batch and every weight's gradient are there under their names.
TEST(ReferenceStep, IsTheFirstTrainingStep) {
  TempDir d;
  auto sets = tiny_overrides(d.path());
  std::string args;
  for (const std::string& s : sets) args += " --set " + s;
  Output o = run_cli("reference-step --config " + source_path("configs/train_bc.yaml") + args +
                     " --out " + d.path() + "/ref");
  ASSERT_EQ(o.status, 0) << o.text;
  std::ifstream gj(d.path() + "/ref/graph.json");
  const auto graph = nlohmann::json::parse(gj);
  const double loss = graph.at("metrics").at("loss");
  EXPECT_EQ(graph.at("stages").size(), 9u);
  const auto batch = read_safetensors(d.path() + "/ref/batch.safetensors");
  EXPECT_EQ(batch.tensors.at("replays.numeric").shape(), (Shape{8, 16, 3, 18}));
  EXPECT_EQ(batch.tensors.size(), 9u);  // the loader's eight ports and `continues`
  const auto weights = read_safetensors(d.path() + "/ref/model.safetensors");
  const auto grads = read_safetensors(d.path() + "/ref/grads.safetensors");
  ASSERT_EQ(weights.tensors.size(), grads.tensors.size());
  size_t moved = 0;
  for (const auto& [name, w] : weights.tensors) {
    const Tensor& g = grads.tensors.at(name);
    EXPECT_EQ(g.shape(), w.shape()) << name;
    for (float v : g.span<float>()) moved += v != 0.0f;
  }
  EXPECT_GT(moved, 1000u);

  // The same step in a run: its first row (log_every 1) has the same loss.
  sets.push_back("run.steps=1");
  sets.push_back("run.log_every=1");
  std::ostringstream log;
  Runner r(plan_graph(load_config(source_path("configs/train_bc.yaml"), sets)),
           quiet_run_options(log));
  const RunResult run = r.run();
  std::ifstream rows(run.run_dir + "/metrics.jsonl");
  std::string first;
  std::getline(rows, first);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(first).at("loss").get<double>(), loss) << first;
}
