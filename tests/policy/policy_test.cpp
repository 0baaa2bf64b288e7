// libslipstream_policy through its C interface: the distribution a policy gives, frame by frame,
// equals the training graph's streamed forward (Runner::stream over a replay) on the same frames;
// reset, independent handles and seeded sampling; every misuse is a status and a message.
#include <gtest/gtest.h>
#include <slipstream/policy.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/device.h"
#include "engine/safetensors.h"
#include "stages/melee/batch_layout.h"
#include "stages/melee/controller_choice.h"
#include "stages/melee/model_math.h"
#include "stages/melee/replay_scoring.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

using namespace slipstream;
using namespace slipstream::testing;
using namespace slipstream::melee;
namespace fs = std::filesystem;

namespace {

// The frame a bot would give for one position of the loader's tensors (batch_layout.h).
slipstream_character character_of(const float* n, int32_t action, int32_t character) {
  slipstream_character c{};
  c.exists = n[kExists] > 0.5f ? 1 : 0;
  c.character = character;
  c.action_state = action;
  c.action_frame = n[kActionFrame];
  c.percent = n[kPercent];
  c.facing = n[kFacing];
  c.x = n[kPosX];
  c.y = n[kPosY];
  c.shield = n[kShield];
  c.jumps_left = n[kJumpsLeft];
  c.on_ground = static_cast<int32_t>(n[kOnGround]);
  c.invulnerable = static_cast<int32_t>(n[kInvulnerable]);
  c.hitlag = n[kHitlag];
  c.hitstun = n[kHitstun];
  c.speed_air_x = n[kSpeedAirX];
  c.speed_y = n[kSpeedY];
  c.speed_attack_x = n[kSpeedAttackX];
  c.speed_attack_y = n[kSpeedAttackY];
  c.speed_ground_x = n[kSpeedGroundX];
  c.stocks = static_cast<int32_t>(n[kStocks]);
  return c;
}

struct StreamedFrame {
  slipstream_game_frame frame;
  float logits[kHeadsWidth];
};

// Port 1's view of `replay`, frame by frame through the run's own graph (Runner::stream): each
// frame as a bot would give it, and the heads' logits the graph answered.
std::vector<StreamedFrame> stream_replay(const std::string& run_dir, const std::string& replay) {
  ReplaySelection sel{{replay}, 1, "test", {}};
  sel.loader = {{"batch_size", YAML::Node(1)},
                {"window", YAML::Node(1)},
                {"stride", YAML::Node(1)},
                {"shuffle", YAML::Node(false)}};
  std::ostringstream log;
  RunOptions opt = quiet_run_options(log);
  opt.create_run_dir = false;
  opt.handle_sigint = false;
  Runner r(plan_graph(config_for_replays(run_dir + "/config.yaml", {}, sel)), opt);
  const auto src = static_cast<size_t>(r.graph().find("replays"));
  const auto heads = static_cast<size_t>(r.graph().find("heads"));
  std::vector<StreamedFrame> out;
  r.stream(*latest_checkpoint(run_dir), [&](const Batch& b, double) {
    const StageContext& sc = r.graph().context(src);
    const float* num = sc.output(b, "numeric").data<float>();
    const int32_t* act = sc.output(b, "action").data<int32_t>();
    const int32_t* chr = sc.output(b, "character").data<int32_t>();
    const float* pc = sc.output(b, "prev_controller").data<float>();
    StreamedFrame s{};
    s.frame.stage = sc.output(b, "stage").data<int32_t>()[0];
    slipstream_character* slots[kSlots] = {&s.frame.player, &s.frame.opponent, &s.frame.follower};
    for (int k = 0; k < kSlots; ++k)
      *slots[k] = character_of(num + k * kNumericFeatures, act[k], chr[k]);
    for (int k = 0; k < kButtons; ++k)
      if (pc[k] > 0.5f) s.frame.controller.buttons |= 1u << k;
    s.frame.controller.main_x = pc[kButtons + 0];
    s.frame.controller.main_y = pc[kButtons + 1];
    s.frame.controller.c_x = pc[kButtons + 2];
    s.frame.controller.c_y = pc[kButtons + 3];
    s.frame.controller.shoulder = pc[kButtons + 4];
    for (int h = 0; h < kHeads; ++h) {
      const Tensor& t = r.graph().context(heads).output(b, kHeadNames[h]);
      std::copy_n(t.data<float>(), head_width(h), s.logits + head_offset(h));
    }
    out.push_back(s);
  });
  return out;
}

// |p - softmax/sigmoid(logits)| over every class of every head.
double distance(const slipstream_distribution& d, const float* logits) {
  double worst = 0;
  for (int b = 0; b < kButtons; ++b)
    worst = std::max(worst, std::abs(d.buttons[b] - 1.0 / (1.0 + std::exp(-double(logits[b])))));
  const float* probs[kStickHeads] = {d.main_x, d.main_y, d.c_x, d.c_y, d.shoulder};
  for (int h = 0; h < kStickHeads; ++h) {
    const float* z = logits + head_offset(h + 1);
    const int n = head_classes(h);
    double m = z[0], sum = 0;
    for (int i = 1; i < n; ++i) m = std::max(m, double(z[i]));
    for (int i = 0; i < n; ++i) sum += std::exp(z[i] - m);
    for (int i = 0; i < n; ++i)
      worst = std::max(worst, std::abs(probs[h][i] - std::exp(z[i] - m) / sum));
  }
  return worst;
}

// The policy of `run` at temperature 0 over `frames`, one step a frame: the largest distance of
// its distribution from the stream's logits; `answered(i, c)` sees frame i's answer.
double play_most_likely(const std::string& run, const std::vector<StreamedFrame>& frames,
                        const std::function<void(size_t, const slipstream_controller&)>& answered) {
  slipstream_policy* p = nullptr;
  EXPECT_EQ(slipstream_policy_open(run.c_str(), "cpu", &p), SLIPSTREAM_OK)
      << slipstream_policy_error(nullptr);
  if (!p) return INFINITY;
  EXPECT_EQ(slipstream_policy_set_sampling(p, 0.0f, 0), SLIPSTREAM_OK);
  double worst = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    slipstream_controller c;
    slipstream_distribution d;
    if (slipstream_policy_step(p, &frames[i].frame, &c) != SLIPSTREAM_OK ||
        slipstream_policy_distribution(p, &d) != SLIPSTREAM_OK) {
      ADD_FAILURE() << "frame " << i << ": " << slipstream_policy_error(p);
      worst = INFINITY;
      break;
    }
    worst = std::max(worst, distance(d, frames[i].logits));
    answered(i, c);
  }
  slipstream_policy_close(p);
  return worst;
}

struct Trained {
  TempDir dir;
  std::string run_dir, replay;
};

// One tiny trained run per test binary (a few seconds).
const Trained& trained() {
  static Trained* t = [] {
    auto* t = new Trained;
    const std::string val = t->dir.path() + "/val";
    t->run_dir = train_with_pinned_validation(t->dir.path(), val, 3).run_dir;
    t->replay = val + "/synth_00000.slp";
    return t;
  }();
  return *t;
}

// The largest difference between two handles' probabilities (every item) for game `i` of
// their last step.
double distribution_gap(slipstream_policy* a, slipstream_policy* b, size_t i) {
  slipstream_distribution da{}, db{};
  EXPECT_EQ(slipstream_policy_distribution_of(a, int32_t(i), &da), SLIPSTREAM_OK);
  EXPECT_EQ(slipstream_policy_distribution_of(b, int32_t(i), &db), SLIPSTREAM_OK);
  const float* pa = &da.buttons[0];
  const float* pb = &db.buttons[0];
  double worst = 0;
  for (size_t k = 0; k < sizeof(da) / sizeof(float); ++k)
    worst = std::max(worst, static_cast<double>(std::abs(pa[k] - pb[k])));
  return worst;
}

bool same_controller(const slipstream_controller& a, const slipstream_controller& b) {
  return a.buttons == b.buttons && a.main_x == b.main_x && a.main_y == b.main_y && a.c_x == b.c_x &&
         a.c_y == b.c_y && a.shoulder == b.shoulder;
}

bool acts(const slipstream_controller& c) {
  return c.buttons || c.main_x != 0 || c.main_y != 0 || c.c_x != 0 || c.c_y != 0 || c.shoulder != 0;
}

// The device the device tests play on: a GPU when there is one, else the CUDA code path on the
// emulator; empty (with why in `skip`) when neither is in this build.
std::string test_device(std::string& skip) {
  const char* device = probe_cuda().available ? "cuda" : "emulated";
  try {
    (void)choose_device(device);
  } catch (const std::exception& e) {
    skip = std::string(device) + ": " + e.what();
    return {};
  }
  return device;
}

struct Handle {
  slipstream_policy* p = nullptr;
  explicit Handle(const std::string& ckpt, const char* device = "cpu") {
    EXPECT_EQ(slipstream_policy_open(ckpt.c_str(), device, &p), SLIPSTREAM_OK)
        << slipstream_policy_error(nullptr);
  }
  ~Handle() { slipstream_policy_close(p); }
};

}  // namespace

TEST(Policy, FrameByFrameEqualsTheTrainingGraphsStream) {
  const Trained& t = trained();
  const auto frames = stream_replay(t.run_dir, t.replay);
  ASSERT_GT(frames.size(), 500u);  // a 900-row game
  {
    Handle h(t.run_dir);
    ASSERT_NE(h.p, nullptr);
    EXPECT_NE(std::string(slipstream_policy_describe(h.p)).find("step 3"), std::string::npos)
        << slipstream_policy_describe(h.p);
    // The replay reading its frames must follow (the tiny run reads the replay's own).
    EXPECT_NE(std::string(slipstream_policy_describe(h.p)).find(", fields slippi, "),
              std::string::npos)
        << slipstream_policy_describe(h.p);
  }
  size_t pressed_differs = 0;
  const double worst = play_most_likely(t.run_dir, frames, [&](size_t i, const auto& c) {
    // The answer is the most likely input of that distribution.
    for (int b = 0; b < kButtons; ++b)
      if (((c.buttons >> b) & 1) != (frames[i].logits[b] > 0 ? 1u : 0u)) ++pressed_differs;
  });
  std::printf("max |policy - stream| over %zu frames, every class of 6 heads: %.3g\n",
              frames.size(), worst);
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(pressed_differs, 0u);
}

// A checkpoint with autoregressive heads: the policy's distribution is the training graph's
// stream (the heads' in-order decode), its most likely answer is that decode, and its checkpoint
// carries the conditioning weight the answers are drawn with.
TEST(Policy, AutoregressiveHeadsAnswerTheDecodedController) {
  TempDir dir;
  const std::string val = dir.path() + "/val";
  const std::string run =
      train_with_pinned_validation(
          dir.path(), val, 3, "train_bc.yaml",
          {"core.d_model=16", "core.layers=1", "core.d_state=8", "heads.autoregressive=true"})
          .run_dir;
  const auto frames = stream_replay(run, val + "/synth_00000.slp");
  ASSERT_GT(frames.size(), 500u);
  size_t differs = 0;
  const double worst = play_most_likely(run, frames, [&](size_t i, const auto& c) {
    const ChosenController want = choose_controller(frames[i].logits, nullptr, 0.0f, 0);
    differs += c.buttons != want.buttons || stick_class(c.main_x) != want.classes[kMainX] ||
               shoulder_class(c.shoulder) != want.classes[kShoulder];
  });
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(differs, 0u);
  {  // sampled on a device with the conditioning weight there: the CPU's answers, with a weight
     // strong enough (3 steps leave it near 0) that drawing without it would answer otherwise
    std::string skip;
    const std::string device = test_device(skip);
    if (!device.empty()) {
      const std::string strong = dir.path() + "/strong";
      fs::copy(run, strong, fs::copy_options::recursive);
      std::mt19937_64 rng(3);
      std::uniform_real_distribution<float> strength(-1.5f, 1.5f);
      std::vector<float> w(size_t(kHeadsWidth) * kHeadsWidth);
      for (float& v : w) v = strength(rng);
      heads_ar_mask(w.data());
      // The weights and their average (which the library plays with) both get it.
      for (const auto& [file, name] : {std::pair{"model", "heads.ar.weight"},
                                       std::pair{"state", "step.ema.heads.ar.weight"}}) {
        const std::string path = *latest_checkpoint(strong) + "/" + file + ".safetensors";
        SafetensorsFile f = read_safetensors(path);
        Tensor& wa = f.tensors.at(name);
        ASSERT_EQ(size_t(wa.numel()), w.size()) << name;
        std::copy(w.begin(), w.end(), wa.data<float>());
        add_tensor_checksums(f.tensors, f.metadata);  // the edit is ours, not damage
        write_safetensors(path, f.tensors, f.metadata);
      }
      Handle cpu(strong), dev(strong, device.c_str());
      // The description names the device asked for (the emulator's memory is the host's).
      EXPECT_NE(std::string(slipstream_policy_describe(dev.p))
                    .find(device == "emulated" ? "device emulated" : "device cuda:"),
                std::string::npos)
          << slipstream_policy_describe(dev.p);
      // Hot draws, so earlier items often differ from the most likely ones and condition later
      // items otherwise than the decode did.
      ASSERT_EQ(slipstream_policy_set_sampling(cpu.p, 1.5f, 5), SLIPSTREAM_OK);
      ASSERT_EQ(slipstream_policy_set_sampling(dev.p, 1.5f, 5), SLIPSTREAM_OK);
      size_t answers_differ = 0, acting = 0;
      const size_t n = std::min<size_t>(frames.size(), 200);
      for (size_t i = 0; i < n; ++i) {
        slipstream_controller a, b;
        ASSERT_EQ(slipstream_policy_step(cpu.p, &frames[i].frame, &a), SLIPSTREAM_OK);
        ASSERT_EQ(slipstream_policy_step(dev.p, &frames[i].frame, &b), SLIPSTREAM_OK)
            << slipstream_policy_error(dev.p);
        EXPECT_LT(distribution_gap(cpu.p, dev.p, 0), 1e-5) << "frame " << i;
        answers_differ += !same_controller(a, b);
        acting += acts(a);
      }
      EXPECT_LE(answers_differ, 1u) << device;
      EXPECT_GT(acting, n / 10) << "the sampled answers hardly act: nothing was compared";
    }
  }
  std::ifstream weights(run + "/checkpoints/step-3/model.safetensors");
  std::string bytes((std::istreambuf_iterator<char>(weights)), std::istreambuf_iterator<char>());
  EXPECT_NE(bytes.find("heads.ar.weight"), std::string::npos) << "no ar.weight in the checkpoint";
}

// Several games per call are several games: game i of a batch (each from its own frame of the
// replay) answers as a handle of its own playing the same frames; game 0 from the first frame
// answers as the training graph's stream; a game restarted mid-stream (reset_game) answers as a
// fresh handle while the others carry on; game 0 samples as a single game with the same seed.
// Threads spread a batch's loops, never its answers: two handles, one of them on 2 threads,
// answer 32 games alike (sampled, same seeds) with the same distributions; 0 threads is refused.
TEST(Policy, ThreadsChangeNoAnswer) {
  const Trained& t = trained();
  const auto frames = stream_replay(t.run_dir, t.replay);
  const size_t n = 32;
  ASSERT_GT(frames.size(), 8 * n + 40);
  Handle one(t.run_dir), two(t.run_dir);
  ASSERT_EQ(slipstream_policy_set_threads(two.p, 2), SLIPSTREAM_OK);
  EXPECT_EQ(slipstream_policy_set_threads(two.p, 0), SLIPSTREAM_E_ARGUMENT);
  double worst = 0;
  for (size_t step = 0; step < 40; ++step) {
    std::vector<slipstream_game_frame> in(n);
    for (size_t i = 0; i < n; ++i) in[i] = frames[8 * i + step].frame;
    std::vector<slipstream_controller> a(n), b(n);
    ASSERT_EQ(slipstream_policy_step_batch(one.p, int32_t(n), in.data(), a.data()), SLIPSTREAM_OK);
    ASSERT_EQ(slipstream_policy_step_batch(two.p, int32_t(n), in.data(), b.data()), SLIPSTREAM_OK)
        << slipstream_policy_error(two.p);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof a[i]), 0) << "step " << step << " game " << i;
      worst = std::max(worst, distribution_gap(one.p, two.p, i));
    }
  }
  EXPECT_EQ(worst, 0.0);
}

TEST(Policy, ManyGamesPerCallAreIndependentGames) {
  const Trained& t = trained();
  const auto frames = stream_replay(t.run_dir, t.replay);
  const size_t n = 4, steps = 120, restart_at = 60;
  const size_t offsets[n] = {0, 100, 250, 400}, restart_offset = 500;
  ASSERT_GT(frames.size(), restart_offset + steps);
  Handle batch(t.run_dir);
  std::vector<std::unique_ptr<Handle>> alone;
  for (size_t i = 0; i < n; ++i) alone.push_back(std::make_unique<Handle>(t.run_dir));
  double worst = 0, worst_stream = 0;
  for (size_t step = 0; step < steps; ++step) {
    if (step == restart_at) {
      ASSERT_EQ(slipstream_policy_reset_game(batch.p, 2), SLIPSTREAM_OK)
          << slipstream_policy_error(batch.p);
      ASSERT_EQ(slipstream_policy_reset(alone[2]->p), SLIPSTREAM_OK);
    }
    std::vector<slipstream_game_frame> in(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t at =
          i == 2 && step >= restart_at ? restart_offset + step - restart_at : offsets[i] + step;
      in[i] = frames[at].frame;
    }
    std::vector<slipstream_controller> out(n);
    ASSERT_EQ(slipstream_policy_step_batch(batch.p, static_cast<int32_t>(n), in.data(), out.data()),
              SLIPSTREAM_OK)
        << step << ": " << slipstream_policy_error(batch.p);
    for (size_t i = 0; i < n; ++i) {
      slipstream_controller c;
      ASSERT_EQ(slipstream_policy_step(alone[i]->p, &in[i], &c), SLIPSTREAM_OK);
      slipstream_distribution a, b;
      ASSERT_EQ(slipstream_policy_distribution_of(batch.p, static_cast<int32_t>(i), &a),
                SLIPSTREAM_OK);
      ASSERT_EQ(slipstream_policy_distribution(alone[i]->p, &b), SLIPSTREAM_OK);
      const float* pa = &a.buttons[0];
      const float* pb = &b.buttons[0];
      for (size_t k = 0; k < sizeof(a) / sizeof(float); ++k)
        worst = std::max(worst, static_cast<double>(std::abs(pa[k] - pb[k])));
      // Same seed (0), same distribution: game 0 draws what a single game draws.
      if (i == 0) {
        EXPECT_EQ(out[0].buttons, c.buttons) << step;
        EXPECT_EQ(out[0].main_x, c.main_x) << step;
        worst_stream = std::max(worst_stream, distance(a, frames[step].logits));
      }
    }
  }
  std::printf(
      "max |batch game - its own handle| over %zu steps of %zu games: %.3g; game 0 "
      "against the training graph's stream: %.3g\n",
      steps, n, worst, worst_stream);
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(worst_stream, 1e-5);

  // The number of games is the stream's until a reset; games out of range are refused.
  std::vector<slipstream_game_frame> two = {frames[0].frame, frames[1].frame};
  std::vector<slipstream_controller> out(2);
  EXPECT_EQ(slipstream_policy_step_batch(batch.p, 2, two.data(), out.data()),
            SLIPSTREAM_E_ARGUMENT);
  EXPECT_NE(std::string(slipstream_policy_error(batch.p)).find("plays 4 game(s), not 2"),
            std::string::npos)
      << slipstream_policy_error(batch.p);
  EXPECT_EQ(slipstream_policy_reset_game(batch.p, 4), SLIPSTREAM_E_ARGUMENT);
  slipstream_distribution d;
  EXPECT_EQ(slipstream_policy_distribution_of(batch.p, -1, &d), SLIPSTREAM_E_ARGUMENT);
  ASSERT_EQ(slipstream_policy_reset(batch.p), SLIPSTREAM_OK);
  EXPECT_EQ(slipstream_policy_step_batch(batch.p, 2, two.data(), out.data()), SLIPSTREAM_OK)
      << slipstream_policy_error(batch.p);
  // A bad frame names its game and steps none.
  two[1].stage = 99;
  EXPECT_EQ(slipstream_policy_step_batch(batch.p, 2, two.data(), out.data()),
            SLIPSTREAM_E_ARGUMENT);
  EXPECT_NE(std::string(slipstream_policy_error(batch.p)).find("game 1: frame.stage"),
            std::string::npos)
      << slipstream_policy_error(batch.p);
}

// On a device (a GPU when there is one, else the CUDA code path on the emulator) the policy's
// games answer as on the CPU, a game restarted mid-stream included: the temporal model carries
// each game's state there (its window forward from the last frame's state) where the CPU steps
// its recurrent form, and the device draws the controllers (policy_choose) with the CPU's
// uniforms, so the sampled answers are the CPU's too — all but where logits that differ in their
// last bits put a uniform on the other side of a decision (at most one answer here).
// `run_dir` the run the device plays (the CPU plays t.run_dir).
void device_answers_as_the_cpu(const std::string& device, const std::string& run_dir) {
  const Trained& t = trained();
  const auto frames = stream_replay(t.run_dir, t.replay);
  const size_t n = 3, steps = 60, restart_at = 30;
  const size_t offsets[n] = {0, 100, 250}, restart_offset = 400;
  ASSERT_GT(frames.size(), restart_offset + steps);
  Handle cpu(t.run_dir), dev(run_dir, device.c_str());
  double worst = 0;
  size_t differ = 0, acting = 0;
  for (size_t step = 0; step < steps; ++step) {
    if (step == restart_at) {
      ASSERT_EQ(slipstream_policy_reset_game(cpu.p, 1), SLIPSTREAM_OK);
      ASSERT_EQ(slipstream_policy_reset_game(dev.p, 1), SLIPSTREAM_OK)
          << slipstream_policy_error(dev.p);
    }
    std::vector<slipstream_game_frame> in(n);
    for (size_t i = 0; i < n; ++i)
      in[i] = frames[i == 1 && step >= restart_at ? restart_offset + step - restart_at
                                                  : offsets[i] + step]
                  .frame;
    std::vector<slipstream_controller> a(n), b(n);
    ASSERT_EQ(slipstream_policy_step_batch(cpu.p, int32_t(n), in.data(), a.data()), SLIPSTREAM_OK);
    ASSERT_EQ(slipstream_policy_step_batch(dev.p, int32_t(n), in.data(), b.data()), SLIPSTREAM_OK)
        << slipstream_policy_error(dev.p);
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, distribution_gap(cpu.p, dev.p, i));
      differ += !same_controller(a[i], b[i]);
      acting += acts(a[i]);
    }
  }
  std::printf(
      "max |cpu - %s| over %zu steps of %zu games: %.3g; sampled answers differing: %zu "
      "of %zu (%zu acting)\n",
      device.c_str(), steps, n, worst, differ, steps * n, acting);
  EXPECT_LT(worst, 1e-5);
  EXPECT_LE(differ, 1u);
  EXPECT_GT(acting, steps * n / 10) << "the sampled answers hardly act: nothing was compared";
}

TEST(Policy, OnADeviceAnswersAsOnTheCpu) {
  std::string skip;
  const std::string device = test_device(skip);
  if (device.empty()) GTEST_SKIP() << skip;
  device_answers_as_the_cpu(device, trained().run_dir);
}

// The same with each frame's work as a CUDA graph (run.cuda_graph: on; on a GPU `auto` is that
// already): the frame's draws, their keys' uploads and the answers' read-back are recorded with
// it and replay inside the graph, the kernel counting each game's frames on at every replay.
TEST(Policy, OnADeviceAnswersAsOnTheCpuFromTheFramesGraph) {
  std::string skip;
  const std::string device = test_device(skip);
  if (device.empty()) GTEST_SKIP() << skip;
  TempDir d;
  const std::string copy = d.path() + "/graphs";
  fs::copy(trained().run_dir, copy, fs::copy_options::recursive);
  const std::string model = *latest_checkpoint(copy) + "/model.safetensors";
  SafetensorsFile f = read_safetensors(model);
  std::string& cfg = f.metadata.at("slipstream.config");
  const std::string from = "cuda_graph: auto";
  const size_t at = cfg.find(from);
  ASSERT_NE(at, std::string::npos) << cfg;
  cfg.replace(at, from.size(), "cuda_graph: on");
  write_safetensors(model, f.tensors, f.metadata);
  device_answers_as_the_cpu(device, copy);
}

// A checkpoint directory copied out of its run opens alone: its weights carry the graph.
TEST(Policy, OpensACheckpointCopiedOutOfItsRun) {
  const Trained& t = trained();
  TempDir elsewhere;
  const std::string alone = elsewhere.path() + "/bot";
  std::filesystem::copy(*latest_checkpoint(t.run_dir), alone,
                        std::filesystem::copy_options::recursive);
  Handle h(alone);
  ASSERT_NE(h.p, nullptr);
  EXPECT_NE(std::string(slipstream_policy_describe(h.p)).find("step 3"), std::string::npos)
      << slipstream_policy_describe(h.p);
  const auto frames = stream_replay(t.run_dir, t.replay);
  ASSERT_FALSE(frames.empty());
  slipstream_controller c;
  EXPECT_EQ(slipstream_policy_step(h.p, &frames[0].frame, &c), SLIPSTREAM_OK)
      << slipstream_policy_error(h.p);
}

TEST(Policy, ResetHandlesAndSamplingAreIndependentAndRepeatable) {
  const Trained& t = trained();
  const auto frames = stream_replay(t.run_dir, t.replay);
  ASSERT_GT(frames.size(), 100u);
  Handle a(t.run_dir), b(t.run_dir);
  ASSERT_TRUE(a.p && b.p);
  auto play = [&](slipstream_policy* p, size_t n) {
    std::vector<slipstream_distribution> out(n);
    for (size_t i = 0; i < n; ++i) {
      slipstream_controller c;
      EXPECT_EQ(slipstream_policy_step(p, &frames[i].frame, &c), SLIPSTREAM_OK);
      slipstream_policy_distribution(p, &out[i]);
    }
    return out;
  };
  const auto first = play(a.p, 100);
  // b has seen nothing: its first frames are a's first frames.
  const auto other = play(b.p, 100);
  EXPECT_EQ(std::memcmp(first.data(), other.data(), sizeof(first[0]) * first.size()), 0);
  // Without a reset the state carries on: the same frames again answer otherwise.
  const auto carried = play(a.p, 100);
  EXPECT_NE(std::memcmp(first.data(), carried.data(), sizeof(first[0]) * first.size()), 0);
  ASSERT_EQ(slipstream_policy_reset(a.p), SLIPSTREAM_OK);
  const auto again = play(a.p, 100);
  EXPECT_EQ(std::memcmp(first.data(), again.data(), sizeof(first[0]) * first.size()), 0);

  // Sampling: the same seed gives the same answers; temperature 0 is the most likely input.
  auto answers = [&](slipstream_policy* p, float temperature, uint64_t seed) {
    EXPECT_EQ(slipstream_policy_reset(p), SLIPSTREAM_OK);
    EXPECT_EQ(slipstream_policy_set_sampling(p, temperature, seed), SLIPSTREAM_OK);
    std::vector<slipstream_controller> out(100);
    for (size_t i = 0; i < out.size(); ++i)
      EXPECT_EQ(slipstream_policy_step(p, &frames[i].frame, &out[i]), SLIPSTREAM_OK);
    return out;
  };
  auto same = [](const std::vector<slipstream_controller>& x,
                 const std::vector<slipstream_controller>& y) {
    return std::memcmp(x.data(), y.data(), sizeof(x[0]) * x.size()) == 0;
  };
  // The default is sampling at temperature 1 from seed 0: a fresh handle answers so, and again
  // after a reset (which restarts the generator).
  {
    Handle fresh(t.run_dir);
    ASSERT_NE(fresh.p, nullptr);
    std::vector<slipstream_controller> first_game(100), second_game(100);
    for (size_t i = 0; i < first_game.size(); ++i)
      EXPECT_EQ(slipstream_policy_step(fresh.p, &frames[i].frame, &first_game[i]), SLIPSTREAM_OK);
    EXPECT_EQ(slipstream_policy_reset(fresh.p), SLIPSTREAM_OK);
    for (size_t i = 0; i < second_game.size(); ++i)
      EXPECT_EQ(slipstream_policy_step(fresh.p, &frames[i].frame, &second_game[i]), SLIPSTREAM_OK);
    EXPECT_TRUE(same(first_game, second_game));
    EXPECT_TRUE(same(first_game, answers(a.p, 1.0f, 0)));
    EXPECT_FALSE(same(first_game, answers(a.p, 0.0f, 0)));
  }
  EXPECT_TRUE(same(answers(a.p, 1.0f, 7), answers(b.p, 1.0f, 7)));
  EXPECT_FALSE(same(answers(a.p, 1.0f, 7), answers(a.p, 1.0f, 8)));
  const auto greedy = answers(a.p, 0.0f, 0);
  for (size_t i = 0; i < greedy.size(); ++i) {
    const float* z = frames[i].logits + head_offset(1);  // main_x
    const int best = static_cast<int>(std::max_element(z, z + kStickClasses) - z);
    EXPECT_FLOAT_EQ(greedy[i].main_x, stick_value(best)) << i;
  }
}

TEST(Policy, MisuseAndBadCheckpointsAreAStatusAndAMessage) {
  const Trained& t = trained();
  slipstream_policy* p = reinterpret_cast<slipstream_policy*>(0x1);
  auto open_error = [&](const std::string& path, const char* device) {
    const slipstream_status s = slipstream_policy_open(path.c_str(), device, &p);
    EXPECT_EQ(p, nullptr);
    return std::make_pair(s, std::string(slipstream_policy_error(nullptr)));
  };
  auto [s, msg] = open_error(t.dir.path() + "/nothing-here", "cpu");
  EXPECT_EQ(s, SLIPSTREAM_E_CHECKPOINT);
  EXPECT_NE(msg.find("nothing-here"), std::string::npos) << msg;
  std::tie(s, msg) = open_error(t.run_dir, "cuda:77");
  EXPECT_EQ(s, SLIPSTREAM_E_DEVICE) << msg;
  std::tie(s, msg) = open_error(t.run_dir, "tpu");
  EXPECT_EQ(s, SLIPSTREAM_E_DEVICE) << msg;
  // Without a GPU: none to use (with one the policy plays there: OnADeviceAnswersAsOnTheCpu).
  if (!probe_cuda().available) {
    std::tie(s, msg) = open_error(t.run_dir, "cuda");
    EXPECT_EQ(s, SLIPSTREAM_E_DEVICE) << msg;
  }
  EXPECT_EQ(slipstream_policy_open(t.run_dir.c_str(), "cpu", nullptr), SLIPSTREAM_E_ARGUMENT);
  EXPECT_EQ(slipstream_policy_open(nullptr, "cpu", &p), SLIPSTREAM_E_ARGUMENT);

  // A copy of the run whose newest checkpoint's graph (the one its weights carry, which it is
  // opened with) says `to` where it said `from`.
  TempDir d;
  auto edited_copy = [&](const std::string& name, const std::string& from, const std::string& to) {
    const std::string copy = d.path() + "/" + name;
    fs::copy(t.run_dir, copy, fs::copy_options::recursive);
    const std::string model = *latest_checkpoint(copy) + "/model.safetensors";
    SafetensorsFile f = read_safetensors(model);
    std::string& cfg = f.metadata.at("slipstream.config");
    const size_t at = cfg.find(from);
    EXPECT_NE(at, std::string::npos) << cfg;
    if (at != std::string::npos) cfg.replace(at, from.size(), to);
    write_safetensors(model, f.tensors, f.metadata);
    return copy;
  };
  // A checkpoint of other sizes than the run's config says.
  std::tie(s, msg) = open_error(edited_copy("sizes", "d_model: 16", "d_model: 24"), "cpu");
  EXPECT_EQ(s, SLIPSTREAM_E_CHECKPOINT) << msg;
  EXPECT_NE(msg.find("core"), std::string::npos) << msg;
  // A graph whose data does not come from the replay loader cannot be fed frames.
  std::tie(s, msg) =
      open_error(edited_copy("fed", "kind: slippi_replays", "kind: melee_frames"), "cpu");
  EXPECT_EQ(s, SLIPSTREAM_E_CONFIG) << msg;
  EXPECT_NE(msg.find("slippi_replays"), std::string::npos) << msg;

  // A damaged one.
  const std::string ckpt = *latest_checkpoint(t.run_dir);
  const std::string broken = d.path() + "/broken";
  fs::copy(t.run_dir, broken, fs::copy_options::recursive);
  const fs::path weights = fs::path(broken) / fs::relative(ckpt, t.run_dir) / "model.safetensors";
  ASSERT_TRUE(fs::exists(weights));
  fs::resize_file(weights, fs::file_size(weights) / 2);
  std::tie(s, msg) = open_error(broken, "cpu");
  EXPECT_EQ(s, SLIPSTREAM_E_CHECKPOINT) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;

  // Bad frames: refused with the field's name, and the model's state is untouched.
  const auto frames = stream_replay(t.run_dir, t.replay);
  Handle a(t.run_dir), b(t.run_dir);
  ASSERT_TRUE(a.p && b.p);
  slipstream_distribution dist;
  EXPECT_EQ(slipstream_policy_distribution(a.p, &dist), SLIPSTREAM_E_ARGUMENT);
  slipstream_controller c;
  struct Bad {
    void (*spoil)(slipstream_game_frame&);
    const char* names;
  } bad[] = {
      {[](slipstream_game_frame& f) { f.opponent.percent = NAN; }, "frame.opponent.percent"},
      {[](slipstream_game_frame& f) { f.player.character = 40; }, "frame.player.character"},
      {[](slipstream_game_frame& f) { f.player.action_state = -1; }, "frame.player.action_state"},
      {[](slipstream_game_frame& f) { f.player.exists = 2; }, "frame.player.exists"},
      {[](slipstream_game_frame& f) { f.player.on_ground = 5; }, "frame.player.on_ground"},
      {[](slipstream_game_frame& f) { f.stage = 64; }, "frame.stage"},
      {[](slipstream_game_frame& f) { f.controller.buttons = 0x100; }, "frame.controller.buttons"},
      {[](slipstream_game_frame& f) { f.controller.c_y = INFINITY; }, "frame.controller.c_y"},
  };
  for (size_t i = 0; i < 20; ++i) {
    slipstream_game_frame f = frames[i].frame;
    bad[i % std::size(bad)].spoil(f);
    EXPECT_EQ(slipstream_policy_step(a.p, &f, &c), SLIPSTREAM_E_ARGUMENT);
    EXPECT_NE(std::string(slipstream_policy_error(a.p)).find(bad[i % std::size(bad)].names),
              std::string::npos)
        << slipstream_policy_error(a.p);
    slipstream_distribution da, db;
    ASSERT_EQ(slipstream_policy_step(a.p, &frames[i].frame, &c), SLIPSTREAM_OK);
    ASSERT_EQ(slipstream_policy_step(b.p, &frames[i].frame, &c), SLIPSTREAM_OK);
    slipstream_policy_distribution(a.p, &da);
    slipstream_policy_distribution(b.p, &db);
    EXPECT_EQ(std::memcmp(&da, &db, sizeof da), 0) << i;
  }
  // A character that is absent is zeros whatever its fields hold, as the loader writes it.
  slipstream_game_frame f = frames[0].frame;
  f.follower = {};
  f.follower.percent = NAN;
  f.follower.character = 99;
  EXPECT_EQ(slipstream_policy_step(a.p, &f, &c), SLIPSTREAM_OK) << slipstream_policy_error(a.p);
  EXPECT_EQ(slipstream_policy_step(a.p, nullptr, &c), SLIPSTREAM_E_ARGUMENT);
  EXPECT_EQ(slipstream_policy_step(nullptr, &f, &c), SLIPSTREAM_E_ARGUMENT);
  EXPECT_EQ(slipstream_policy_set_sampling(a.p, -1.0f, 0), SLIPSTREAM_E_ARGUMENT);
  EXPECT_EQ(slipstream_policy_version(), SLIPSTREAM_POLICY_VERSION);
  slipstream_policy_close(nullptr);
}

// One handle stepped from two threads at once (documented as forbidden): each call either runs
// alone or is refused with E_BUSY and a message on its own thread; never a crash or a torn state.
TEST(Policy, AHandleUsedFromTwoThreadsAtOnceIsRefusedNotRaced) {
  const Trained& t = trained();
  const auto frames = stream_replay(t.run_dir, t.replay);
  ASSERT_GT(frames.size(), 50u);
  Handle h(t.run_dir);
  ASSERT_TRUE(h.p);
  std::atomic<int> busy{0}, other{0};
  std::string busy_message;
  std::mutex mu;
  auto hammer = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (size_t i = 0; std::chrono::steady_clock::now() < until && busy.load() < 3; ++i) {
      slipstream_controller c;
      const slipstream_status s = slipstream_policy_step(h.p, &frames[i % frames.size()].frame, &c);
      if (s == SLIPSTREAM_E_BUSY) {
        ++busy;
        std::lock_guard lock(mu);
        busy_message = slipstream_policy_error(nullptr);
      } else if (s != SLIPSTREAM_OK) {
        ++other;
      }
    }
  };
  std::thread a(hammer), b(hammer);
  a.join();
  b.join();
  EXPECT_GE(busy.load(), 3);
  EXPECT_EQ(other.load(), 0);
  EXPECT_NE(busy_message.find("in use by another thread"), std::string::npos) << busy_message;
  slipstream_controller c;
  EXPECT_EQ(slipstream_policy_step(h.p, &frames[0].frame, &c), SLIPSTREAM_OK);
}
