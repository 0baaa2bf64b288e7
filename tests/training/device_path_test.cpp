// The behaviour-cloning graph's device path (every stage's CUDA code: embedding, Mamba or GRU,
// heads, BC loss, the fused AdamW) against the CPU path: the same losses, gradient norms and
// validation metrics step by step, in fp32 and bf16 with mirroring, noise, label smoothing, a
// hidden head layer and an EMA; and an exact resume on the device path. Built twice: on the CPU
// emulator (SLIPSTREAM_TEST_DEVICE "emulated", label integration) and on a GPU ("cuda", label gpu,
// SKIPPED without one).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "engine/device.h"
#include "engine/memory_pool.h"
#include "engine/step_benchmark.h"
#include "stages/melee/melee_kernels.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using namespace slipstream::testing;

namespace {

std::vector<std::string> device_overrides(const std::string& dir, const std::string& device,
                                          const std::string& precision) {
  auto sets = tiny_overrides(dir);
  sets.back() = "run.device=" + device;  // tiny_overrides ends with run.device=cpu
  for (const char* s :
       {"replays.batch_size=4", "run.steps=4", "run.log_every=1", "run.validate_every=4",
        "run.validate_batches=1", "embed.mirror=true", "embed.noise=0.05",
        "loss.label_smoothing=0.1", "heads.hidden=16", "step.ema=0.9", "step.clip=0.5"})
    sets.push_back(s);
  sets.push_back("run.precision=" + precision);
  return sets;
}

// metrics.jsonl rows: train rows by step, validation rows by step.
struct Metrics {
  std::map<uint64_t, nlohmann::json> train, validation;
};

Metrics read_metrics(const std::string& run_dir) {
  Metrics m;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto row = nlohmann::json::parse(line);
    if (!row.contains("step") || !row.contains("loss")) continue;
    const bool val = row.value("split", std::string()) != "train";
    (val ? m.validation : m.train)[row["step"].get<uint64_t>()] = row;
  }
  return m;
}

// `accuracies`: also the accuracy figures (counts of argmax hits: a prediction near a tie may
// flip between two forms that round differently, so looser comparisons leave them out).
void expect_close_rows(const nlohmann::json& a, const nlohmann::json& b, const char* what,
                       double rel, bool accuracies = true) {
  for (const char* key :
       {"loss", "nll", "grad_norm", "lr", "acc/buttons", "acc/main_x", "loss/shoulder",
        "baseline/loss", "all_right", "baseline/all_right", "changed/acc/buttons",
        "changed/nll/main_x", "baseline/changed/nll/main_x", "changed/share/c_x"}) {
    if (!a.contains(key)) continue;
    const std::string k = key;
    if (!accuracies && (k.starts_with("acc/") || k == "all_right" || k == "changed/acc/buttons"))
      continue;
    ASSERT_TRUE(b.contains(key)) << what << " " << key;
    const double x = a[key].get<double>(), y = b[key].get<double>();
    EXPECT_NEAR(x, y, rel * std::max(1.0, std::abs(x))) << what << " " << key;
  }
}

constexpr const char* kDevice = SLIPSTREAM_TEST_DEVICE;

bool skip_without_device() {
  if (std::string(kDevice) != "cuda" || probe_cuda().available) return false;
  return true;
}

// The graph's sets for `device`: train_bc.yaml's Mamba, or train_bc_gru.yaml's GRU (two layers,
// so the second reads the first's states and sends it its gradient).
std::vector<std::string> graph_overrides(const std::string& dir, const std::string& device,
                                         const std::string& precision, bool gru) {
  auto sets = device_overrides(dir, device, precision);
  if (gru) {
    std::erase_if(sets, [](const std::string& s) { return s.starts_with("core."); });
    sets.push_back("core.hidden=12");
    sets.push_back("core.layers=2");
  }
  return sets;
}

// Every weight of two runs of one graph, bit for bit.
void expect_same_weights(Runner& x, Runner& y, const std::string& when) {
  for (size_t k = 0; k < x.graph().size(); ++k) {
    auto a = x.graph().stage(k).parameters(), b = y.graph().stage(k).parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const Tensor u = a[i]->value.to(Device::cpu()), v = b[i]->value.to(Device::cpu());
      EXPECT_EQ(std::memcmp(u.raw(), v.raw(), u.nbytes()), 0) << a[i]->name << " differs " << when;
    }
  }
}

// `device_sets`: more overrides for the device run only (another backend of a stage); `rel`: the
// relative tolerance of every figure, accuracies compared only at the default's; `both_sets`:
// overrides of both runs (a model option).
void device_path_matches_cpu(const std::string& precision, bool gru = false,
                             const std::vector<std::string>& device_sets = {}, double rel = 2e-4,
                             const std::vector<std::string>& both_sets = {}) {
  const bool accuracies = rel <= 2e-4;
  TempDir d;
  std::ostringstream log;
  const std::string graph =
      source_path(gru ? "configs/train_bc_gru.yaml" : "configs/train_bc.yaml");
  auto cpu_sets = graph_overrides(d.path(), "cpu", precision, gru);
  cpu_sets.insert(cpu_sets.end(), both_sets.begin(), both_sets.end());
  Runner cpu(plan_graph(load_config(graph, cpu_sets)), quiet_run_options(log));
  const RunResult rc = cpu.run();
  auto sets = graph_overrides(d.path(), kDevice, precision, gru);
  sets.insert(sets.end(), both_sets.begin(), both_sets.end());
  sets.insert(sets.end(), device_sets.begin(), device_sets.end());
  Runner dev(plan_graph(load_config(graph, sets)), quiet_run_options(log));
  const RunResult re = dev.run();
  ASSERT_EQ(rc.final_step, 4u);
  ASSERT_EQ(re.final_step, 4u);
  const Metrics mc = read_metrics(rc.run_dir), me = read_metrics(re.run_dir);
  ASSERT_EQ(mc.train.size(), 4u);
  ASSERT_EQ(me.train.size(), mc.train.size());
  // The kernels sum in other orders than the CPU; over a few Adam steps that stays far below
  // what a wrong index, a missed mirror or a lost gradient would give.
  for (const auto& [step, row] : mc.train)
    expect_close_rows(row, me.train.at(step), ("train step " + std::to_string(step)).c_str(), rel,
                      accuracies);
  ASSERT_EQ(me.validation.size(), mc.validation.size());
  for (const auto& [step, row] : mc.validation)
    expect_close_rows(row, me.validation.at(step), "validation", rel, accuracies);
}

TEST(DevicePath, MatchesCpuFp32) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  device_path_matches_cpu("fp32");
}

TEST(DevicePath, MatchesCpuBf16) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  device_path_matches_cpu("bf16");
}

// The embedding's table gradients in their sorted form (melee_cuda.inc's EmbedBackwardVariant,
// off by default until a GPU times it) in the whole step, for this build's device kernels.
template <class K>
void matches_cpu_with_sorted_table_gradients() {
  const auto was = K::embed_backward_variant();
  K::set_embed_backward_variant(K::EmbedBackwardVariant::sorted);
  device_path_matches_cpu("fp32");
  device_path_matches_cpu("bf16");
  K::set_embed_backward_variant(was);
}

TEST(DevicePath, SortedTableGradientsMatchCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  if (std::string(kDevice) == "cuda") {
#if SLIPSTREAM_KERNELS_CUDA
    matches_cpu_with_sorted_table_gradients<melee::cuda::Kernels>();
#endif
  } else {
#if SLIPSTREAM_CUDA_EMULATOR
    matches_cpu_with_sorted_table_gradients<melee::cuda_emulated::Kernels>();
#endif
  }
}

// Autoregressive heads: teacher-forced training (mirrored windows included) and the in-order
// decode of validation on the device kernels, as on the CPU.
TEST(DevicePath, AutoregressiveHeadsMatchCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  device_path_matches_cpu("fp32", false, {}, 2e-4, {"heads.autoregressive=true"});
  device_path_matches_cpu("bf16", false, {}, 2e-4, {"heads.autoregressive=true"});
}

// rows: streams: each row's state carried from its window to the next (the scan's initial state,
// the conv's inputs before the window, mirror flags kept per game) on the device kernels, as on
// the CPU; two layers, so the second layer's carried state is not the first's.
TEST(DevicePath, CarriedStateMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  for (const bool gru : {false, true}) {
    SCOPED_TRACE(gru ? "gru" : "mamba");
    device_path_matches_cpu("fp32", gru, {}, 2e-4, {"replays.rows=streams", "core.layers=2"});
    device_path_matches_cpu("bf16", gru, {}, 2e-4, {"replays.rows=streams", "core.layers=2"});
  }
}

// The host one batch ahead of the device (rows every 4 steps, a validation at 8, a checkpoint at
// 6): the rows, the validation and the checkpoint are the CPU run's, as if every step had
// waited for the device.
TEST(DevicePath, RunningAheadChangesNoFigure) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  TempDir d;
  std::ostringstream log;
  const std::string graph = source_path("configs/train_bc.yaml");
  auto sets_for = [&](const std::string& device) {
    auto sets = graph_overrides(d.path(), device, "bf16", false);
    for (const char* s : {"run.steps=8", "run.log_every=4", "run.validate_every=8", "ckpt.every=6"})
      sets.push_back(s);
    return sets;
  };
  Runner cpu(plan_graph(load_config(graph, sets_for("cpu"))), quiet_run_options(log));
  const RunResult rc = cpu.run();
  Runner dev(plan_graph(load_config(graph, sets_for(kDevice))), quiet_run_options(log));
  const RunResult re = dev.run();
  EXPECT_EQ(rc.steps_ended_ahead, 0u);  // the CPU does not run ahead
  EXPECT_EQ(re.steps_ended_ahead, 5u) << "steps 1, 2, 3, 5, 7 end after the next is enqueued";
  const Metrics mc = read_metrics(rc.run_dir), me = read_metrics(re.run_dir);
  ASSERT_EQ(mc.train.size(), 2u);
  ASSERT_EQ(me.train.size(), 2u);
  for (const auto& [step, row] : mc.train) {
    expect_close_rows(row, me.train.at(step), ("train step " + std::to_string(step)).c_str(), 2e-4);
    EXPECT_EQ(row.at("steps_averaged"), me.train.at(step).at("steps_averaged"));
    // The section's wait for data is measured between its batches, ahead or not.
    const double wait = me.train.at(step).at("data_wait_pct").get<double>();
    EXPECT_GE(wait, 0.0);
    EXPECT_LE(wait, 100.0);
  }
  ASSERT_EQ(me.validation.size(), 1u);
  expect_close_rows(mc.validation.at(8), me.validation.at(8), "validation", 2e-4);
  // The checkpoint of step 6 holds step 6's weights: a resume from it ends where this run did.
  RunOptions ro = quiet_run_options(log);
  ro.resume_checkpoint = re.run_dir + "/checkpoints/step-6";
  ro.resume_dir = re.run_dir;
  auto resumed_sets = sets_for(kDevice);
  Runner again(plan_graph(load_config(graph, resumed_sets)), ro);
  const RunResult ra = again.run();
  ASSERT_EQ(ra.final_step, 8u);
  expect_same_weights(dev, again, "after resuming from step 6");
}

// Frame by frame (Runner::stream: `infer`, the policy library) on the device the model carries
// each row's state itself (its window forward from the state the last batch left) where the CPU
// steps its recurrent form: the heads' logits agree within float rounding, for Mamba and the GRU,
// with each frame's work as a CUDA graph (run.cuda_graph=on: replayed once it recurs) or not.
TEST(DevicePath, StreamMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  for (const bool gru : {false, true}) {
    SCOPED_TRACE(gru ? "gru" : "mamba");
    TempDir d;
    std::ostringstream log;
    const std::string graph =
        source_path(gru ? "configs/train_bc_gru.yaml" : "configs/train_bc.yaml");
    Runner train(plan_graph(load_config(graph, graph_overrides(d.path(), "cpu", "fp32", gru))),
                 quiet_run_options(log));
    const RunResult run = train.run();
    // A short game: the stream plays every frame of it (the emulator takes milliseconds each).
    const int frames = 300;
    const std::string replay =
        slp::write_synthetic_games(d.path() + "/play", 1, 7, frames + 150).at(0).string();
    const auto cpu = head_outputs(run.run_dir, replay, frames, true, {"run.device=cpu"});
    for (const char* graphs : {"off", "on"}) {
      EvalResult e;
      // With graphs, each frame's operations are also timed after the first 20 frames
      // (`slipstream infer --op-times`): the time stamps change no answer.
      const bool on = std::string(graphs) == "on";
      const auto dev = head_outputs(
          run.run_dir, replay, frames, true,
          {std::string("run.device=") + kDevice, std::string("run.cuda_graph=") + graphs}, &e,
          on ? std::optional<uint64_t>(20) : std::nullopt);
      double worst = 0;
      for (size_t h = 0; h < cpu.size(); ++h) {
        ASSERT_EQ(cpu[h].size(), dev[h].size()) << h;
        ASSERT_GT(cpu[h].size(), size_t(frames)) << h;
        for (size_t i = 0; i < cpu[h].size(); ++i)
          worst = std::max(worst, std::abs(double(cpu[h][i]) - double(dev[h][i])) /
                                      std::max(1.0, std::abs(double(cpu[h][i]))));
      }
      const auto& g = e.graph_steps;
      std::printf(
          "max |cpu - %s| over %d streamed frames, 6 heads, cuda graph %s: %.3g (frames "
          "replayed %llu, captured %llu, issued %llu, uncaptured %llu)\n",
          kDevice, frames, graphs, worst, (unsigned long long)g.replayed,
          (unsigned long long)g.captured, (unsigned long long)g.issued,
          (unsigned long long)g.uncaptured);
      EXPECT_LT(worst, 1e-4) << graphs;
      if (on) {
        EXPECT_EQ(e.graph_off_reason, "");
        EXPECT_GT(g.replayed, uint64_t(frames) / 2) << "the frames' work recurs";
        const OperationTimes& t = e.operation_times;
        EXPECT_EQ(t.graphs + t.untimed, g.replayed + g.captured + g.issued + g.uncaptured - 20)
            << "every frame after the first 20, timed or counted";
        EXPECT_GT(t.graphs, uint64_t(frames) / 2);
        uint64_t launches = 0;
        for (const OperationTime& op : t.ops) {
          EXPECT_FALSE(op.stage_name.empty()) << op.what;
          launches += op.launches;
        }
        EXPECT_EQ(launches, t.graphs * g.ops) << "every operation of each timed frame";
        EXPECT_NE(format_operation_times(t, 1, "frame").find("device time a frame"),
                  std::string::npos);
      } else {
        EXPECT_EQ(g.replayed + g.captured + g.issued + g.uncaptured, 0u);
      }
    }
  }
}

TEST(DevicePath, GruMatchesCpu) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  device_path_matches_cpu("fp32", true);
}

// The GRU's bf16 form on the device trains as the CPU's bf16 form does.
TEST(DevicePath, GruMatchesCpuBf16) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  device_path_matches_cpu("bf16", true);
}

// The GRU stack in cuDNN's RNN (core.backend=cudnn) trains as the CPU does: in fp32 within the
// kernels' tolerance; under bf16 cuDNN's bf16 RNN (bf16 states, unlike the CPU's bf16 form,
// which keeps them fp32) within bf16's. The emulator has no cuDNN: there the stage must refuse
// it, saying why.
TEST(DevicePath, GruOnCudnnMatchesCpu) {
  if (std::string(kDevice) == "emulated") {
    TempDir d;
    std::ostringstream log;
    auto sets = graph_overrides(d.path(), kDevice, "fp32", true);
    sets.push_back("core.backend=cudnn");
    Runner r(plan_graph(load_config(source_path("configs/train_bc_gru.yaml"), sets)),
             quiet_run_options(log));
    try {
      r.run();
      FAIL() << "backend cudnn ran on the emulator";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("backend cudnn runs on a CUDA device"),
                std::string::npos)
          << e.what();
    }
    return;
  }
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  device_path_matches_cpu("fp32", true, {"core.backend=cudnn"});
  device_path_matches_cpu("bf16", true, {"core.backend=cudnn"}, 3e-2);
}

// Steady state on the device path, its steps replayed from CUDA graphs: after a few steps no
// memory pool grows (no cudaMalloc, no
// new host block: the copy ring, the read-back staging and the models reuse theirs), nothing
// waits for the whole device, and the host waits for the compute stream at most once per step
// (the step's read-backs; under the emulator there is no stream to wait for). The prefetch
// ring's wait for an old copy's event is its throttle, allowed. The first 8 steps are the
// warm-up (the ring's slots and the models' buffers). The host pool's batches are reserved by
// the ring at its first batch: before that, copies left unfinished by a GPU shared with two
// other processes made it grow by a batch at step 14 on an H200. A single growth past the
// warm-up is allowed (below); a recurring one is not.
TEST(DevicePath, SteadyStateAllocatesNothingAndWaitsOncePerStep) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  TempDir d;
  std::ostringstream log;
  for (bool gru : {false, true}) {
    SCOPED_TRACE(gru ? "gru" : "mamba");
    auto sets = graph_overrides(d.path(), kDevice, "bf16", gru);
    // Steps replayed from CUDA graphs, as a CUDA run's are by default (cuda_graph: auto).
    for (const char* s : {"run.steps=20", "run.log_every=5", "run.validate_every=0",
                          "ckpt.every=1000", "run.cuda_graph=on"})
      sets.push_back(s);
    struct Snapshot {
      std::map<std::string, uint64_t> reserved;
      CudaSyncCounts syncs;
    };
    auto snapshot = [] {
      Snapshot s;
      for (MemoryPool* p : Pools::all()) s.reserved[p->name()] = p->stats().reserved_bytes;
      s.syncs = cuda_sync_counts();
      return s;
    };
    // Every step's reservations, so a failure says at which step a pool grew and how full the
    // pipeline had been by then.
    std::map<uint64_t, Snapshot> steps;
    std::map<uint64_t, uint64_t> in_flight_seen;
    const Runner* runner = nullptr;
    RunOptions o = quiet_run_options(log);
    o.on_step = [&](uint64_t step, uint64_t) {
      steps[step] = snapshot();
      in_flight_seen[step] = runner->max_in_flight_seen();
    };
    Runner r(plan_graph(load_config(
                 source_path(gru ? "configs/train_bc_gru.yaml" : "configs/train_bc.yaml"), sets)),
             o);
    runner = &r;
    const RunResult result = r.run();
    ASSERT_EQ(result.final_step, 20u);
    EXPECT_GE(result.graph_steps.replayed, 8u) << result.graph_off_reason;
    ASSERT_TRUE(steps.count(8) && steps.count(20));
    const Snapshot &warm = steps[8], &end = steps[20];
    auto reserved = [](const Snapshot& snap, const std::string& pool) {
      auto it = snap.reserved.find(pool);
      return it == snap.reserved.end() ? uint64_t{0} : it->second;
    };
    for (const auto& [pool, bytes] : end.reserved) {
      std::string history;
      int grew = 0;  // steps past the warm-up at which the pool grew
      uint64_t before = reserved(warm, pool);
      for (const auto& [step, snap] : steps) {
        history += " " + std::to_string(step) + ":" + std::to_string(reserved(snap, pool)) + "(" +
                   std::to_string(in_flight_seen[step]) + ")";
        if (step <= 8) continue;
        grew += reserved(snap, pool) > before;
        before = reserved(snap, pool);
      }
      // One growth is a peak, not a per-step allocation: with the emulated twin beside four
      // other test processes and a sanitizer on 16 cores, one batch more than the ring reserves
      // for was once alive, and the host pool gained a 1 KiB block at step 16. An allocation
      // that recurs (every step, every log step) grows the pool at two steps or more of these 12.
      EXPECT_LE(grew, 1) << "pool " << pool << " grew in steady state (from "
                         << reserved(warm, pool) << " to " << bytes
                         << " bytes); step:bytes(most batches in flight so far):" << history;
    }
    EXPECT_EQ(end.syncs.device, warm.syncs.device) << "a step waited for the whole device";
    EXPECT_LE(end.syncs.stream + end.syncs.event - warm.syncs.stream - warm.syncs.event, 12u);
  }
}

// `slipstream bench --op-times`: every operation of the timed steps' graphs is timed and named
// with its stage — on a GPU by CUDA events captured into the graph, under the emulator by the
// host's clock — and the batches of the timed steps are each either a timed graph or counted as
// untimed.
TEST(DevicePath, OperationTimesCoverEveryOperationOfTheTimedSteps) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  TempDir d;
  StepBenchmarkOptions o;
  o.preset_or_file = source_path("configs/train_bc.yaml");
  o.sets = graph_overrides(d.path(), kDevice, "bf16", false);
  o.sets.push_back("run.cuda_graph=on");
  o.warmup = 8;
  o.steps = 4;
  o.operation_times = true;
  const StepBenchmark b = run_step_benchmark(o);
  ASSERT_TRUE(b.operations.has_value());
  const OperationTimes& t = *b.operations;
  EXPECT_EQ(t.graphs + t.untimed, 4u) << "one batch a step, 4 steps timed";
  ASSERT_GE(t.graphs, 1u) << b.cuda_graph;
  EXPECT_GT(t.graph_ms, 0);
  std::set<std::string> stages;
  for (const auto& s : b.stages) stages.insert(s.name);
  uint64_t launches = 0;
  double ms = 0;
  bool scan_forward = false, scan_backward = false, gemm = false;
  const std::regex gemm_name("gemm (bf16|fp32) [0-9]+x[0-9]+x[0-9]+ [NT][NT]");
  for (const OperationTime& op : t.ops) {
    gemm = gemm || std::regex_match(op.what, gemm_name);
    EXPECT_TRUE(stages.count(op.stage_name)) << op.what << " in stage '" << op.stage_name << "'";
    EXPECT_FALSE(op.what.empty());
    EXPECT_GE(op.device_ms, 0) << op.what;
    EXPECT_EQ(op.launches % t.graphs, 0u) << op.what << ": the same calls every batch";
    launches += op.launches;
    ms += op.device_ms;
    scan_forward = scan_forward || (op.stage_name == "core" && op.what.starts_with("scan_forward"));
    scan_backward =
        scan_backward || (op.stage_name == "core" && op.what.starts_with("scan_backward"));
  }
  EXPECT_EQ(launches, t.graphs * b.graph_steps.ops) << "every operation of each timed graph";
  EXPECT_NEAR(ms, t.graph_ms, 1e-6 * t.graph_ms) << "the stamps' intervals add up to the graphs'";
  EXPECT_TRUE(scan_forward && scan_backward) << "the Mamba stage's scan kernels are named";
  EXPECT_TRUE(gemm) << "the products are named by their shapes";
  const std::string table = format_step_benchmark(b);
  EXPECT_NE(table.find("device time a step"), std::string::npos) << table;
  // The device as --device names it: the emulator's host memory is not a CPU run.
  EXPECT_EQ(b.device, std::string(kDevice) == "emulated" ? "emulated" : "cuda:0");
  EXPECT_EQ(step_benchmark_json(b).at("operations").at("ops").size(), t.ops.size());
}

// run.cuda_graph: a training step replayed from a graph is the step issued op by op — the same
// rows and weights, bit for bit — for Mamba and the GRU (our kernels, and on a GPU cuDNN's) in
// bf16, with mirroring and noise (their per-batch key reaches the kernels through device
// memory), running ahead between rows, across a validation pass. And the steps did replay: a
// step's work recurs (each slot of the prefetch ring gives its own graph, captured the second
// time the slot comes round).
TEST(DevicePath, CudaGraphStepsEqualUncapturedSteps) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  TempDir d;
  std::ostringstream log;
  // Mamba, the GRU, Mamba accumulating two batches a step (the last one also steps the
  // optimizer: another shape of work, with graphs of its own), and on a GPU the GRU's stack in
  // cuDNN's RNN (the emulator has no cuDNN).
  const int variants = std::string(kDevice) == "cuda" ? 4 : 3;
  for (int variant = 0; variant < variants; ++variant) {
    const bool gru = variant == 1 || variant == 3;
    const uint64_t accumulate = variant == 2 ? 2 : 1;
    SCOPED_TRACE(variant == 0   ? "mamba"
                 : variant == 1 ? "gru"
                 : variant == 2 ? "mamba, accumulate 2"
                                : "gru on cudnn");
    const std::string graph =
        source_path(gru ? "configs/train_bc_gru.yaml" : "configs/train_bc.yaml");
    auto sets_for = [&](const char* mode) {
      auto sets = graph_overrides(d.path(), kDevice, "bf16", gru);
      for (const char* s :
           {"run.steps=16", "run.log_every=2", "run.validate_every=8", "ckpt.every=1000"})
        sets.push_back(s);
      sets.push_back(std::string("run.cuda_graph=") + mode);
      sets.push_back("step.accumulate=" + std::to_string(accumulate));
      if (variant == 3) sets.push_back("core.backend=cudnn");
      return sets;
    };
    Runner off(plan_graph(load_config(graph, sets_for("off"))), quiet_run_options(log));
    const RunResult ro = off.run();
    Runner on(plan_graph(load_config(graph, sets_for("on"))), quiet_run_options(log));
    const RunResult rn = on.run();
    EXPECT_EQ(ro.graph_steps.replayed + ro.graph_steps.captured, 0u);
    EXPECT_EQ(rn.graph_off_reason, "");
    EXPECT_GE(rn.graph_steps.captured, 1u);
    EXPECT_GE(rn.graph_steps.replayed, 4u)
        << "captured " << rn.graph_steps.captured << ", issued " << rn.graph_steps.issued
        << ", uncaptured " << rn.graph_steps.uncaptured;
    EXPECT_EQ(rn.graph_steps.replayed + rn.graph_steps.captured + rn.graph_steps.issued +
                  rn.graph_steps.uncaptured,
              16u * accumulate);
    const Metrics mo = read_metrics(ro.run_dir), mn = read_metrics(rn.run_dir);
    ASSERT_EQ(mo.train.size(), 8u);
    ASSERT_EQ(mn.train.size(), 8u);
    for (const auto& [step, row] : mo.train)
      expect_close_rows(row, mn.train.at(step), ("train step " + std::to_string(step)).c_str(),
                        0.0);
    ASSERT_EQ(mn.validation.size(), mo.validation.size());
    for (const auto& [step, row] : mo.validation)
      expect_close_rows(row, mn.validation.at(step), "validation", 0.0);
    expect_same_weights(off, on, "after 16 steps");
  }
}

// Moments, EMA, the device's step counter and the bf16 copies come back from a checkpoint.
TEST(DevicePath, ResumeIsExact) {
  if (skip_without_device()) GTEST_SKIP() << "no CUDA device: " << probe_cuda().reason;
  TempDir d;
  std::ostringstream log;
  const std::string graph = source_path("configs/train_bc.yaml");
  auto sets = device_overrides(d.path(), kDevice, "bf16");
  sets.push_back("run.validate_every=0");
  sets.push_back("ckpt.every=2");
  Runner straight(plan_graph(load_config(graph, sets)), quiet_run_options(log));
  straight.run();
  auto first_sets = sets;
  first_sets.push_back("run.steps=2");
  Runner first(plan_graph(load_config(graph, first_sets)), quiet_run_options(log));
  const RunResult r1 = first.run();
  ASSERT_EQ(r1.final_step, 2u);
  RunOptions ro = quiet_run_options(log);
  ro.resume_dir = r1.run_dir;
  Runner second(plan_graph(load_config(graph, sets)), ro);
  const RunResult r2 = second.run();
  ASSERT_EQ(r2.final_step, 4u);
  expect_same_weights(straight, second, "after the resume");
}

}  // namespace
