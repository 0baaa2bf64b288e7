// Drives the slippi_replays stage without a runner, and makes small replay sets on disk.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/stage_harness.h"
#include "stages/melee/replays.h"
#include "stages/melee/slp/synth.h"

namespace slipstream::melee::testing {

namespace fs = std::filesystem;

inline fs::path replay_dir() {
  return fs::path(SLIPSTREAM_SOURCE_DIR) / ".." / "shared" / "replays";
}

#define LOADER_REQUIRE_REPLAYS()                                                                  \
  do {                                                                                            \
    if (!fs::is_directory(::slipstream::melee::testing::replay_dir()))                            \
      GTEST_SKIP() << "real replays not found at " << ::slipstream::melee::testing::replay_dir(); \
  } while (0)

// A directory removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ =
        fs::temp_directory_path() / ("slipstream_melee_data_" + tag + "_" +
                                     std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// Synthetic games shared by the tests of one process.
inline const fs::path& synth_dir() {
  static TempDir dir("synth");
  static bool made = [] {
    slp::write_synthetic_games(dir.path(), 8, 42, 1500);
    return true;
  }();
  (void)made;
  return dir.path();
}

using Tensors = std::map<std::string, Tensor>;

inline const char* kPorts[] = {"numeric",         "action",         "character",     "stage",
                               "prev_controller", "target_buttons", "target_sticks", "mask",
                               "continues"};

// What `f` throws, or "" when it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class Loader {
 public:
  using RankReduceFn = std::function<void(std::span<double>, RankReduce, const std::string&)>;
  explicit Loader(std::vector<std::string> overrides, uint64_t seed = 1, int64_t epochs = 1,
                  bool validation = false, int rank = 0, int world_size = 1, uint64_t steps = 0,
                  std::string run_dir = "", RankReduceFn reduce = {})
      : h_("slippi_replays", overrides, "replays", Precision::fp32, seed) {
    h_.run().run_dir = run_dir;
    h_.run().reduce_over_ranks = std::move(reduce);
    h_.run().epochs = epochs;
    h_.run().total_steps = steps;  // run.steps
    h_.run().rank = rank;
    h_.run().world_size = world_size;
    if (validation) stage().force_split(StageContext::Split::validation);
    h_.setup({});
  }
  ReplaysStage& stage() { return dynamic_cast<ReplaysStage&>(h_.stage()); }
  StageContext& ctx() { return h_.context(); }
  RunState& run() { return h_.run(); }

  // Batch `k` as the runner asks for it (out.index = k); empty when the stream has ended.
  Tensors batch(uint64_t k, Batch* meta = nullptr) {
    Batch b;
    b.slots.resize(64);
    b.index = k;
    if (!stage().produce(b, ctx())) return {};
    Tensors out;
    for (const char* p : kPorts) out[p] = ctx().output(b, p);
    if (meta) *meta = b;
    return out;
  }

 private:
  StageHarness h_;
};

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

inline bool same_batch(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, t] : a)
    if (!b.count(k) || !same_bytes(t, b.at(k))) return false;
  return true;
}

}  // namespace slipstream::melee::testing
