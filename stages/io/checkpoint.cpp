// checkpoint: writes every stage's weights and state every N steps, at the end of the run and on
// SIGINT, and keeps the best checkpoints by validation loss. Layout: engine/checkpoint.h.
#include <algorithm>
#include <filesystem>
#include <iostream>

#include "engine/checkpoint.h"
#include "engine/graph.h"
#include "engine/registry.h"

namespace fs = std::filesystem;

namespace slipstream {

class CheckpointStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("checkpoint")
        .family("io")
        .doc(
            "Saves weights (model.safetensors) and full state (state.safetensors) for exact "
            "resume.")
        .role(StageRole::update)
        .passthrough()
        .param("every", int64_t{1000}, "steps between checkpoints (0: only at the end)")
        .range(0, std::nullopt)
        .param("keep", int64_t{3}, "periodic checkpoints kept (oldest removed first)")
        .range(1, std::nullopt)
        .param("keep_best", int64_t{2}, "checkpoints kept by best validation loss (0: none)")
        .range(0, std::nullopt);
  }

  void setup(StageContext& ctx) override {
    every_ = static_cast<uint64_t>(ctx.params().integer("every"));
    keep_ = static_cast<size_t>(ctx.params().integer("keep"));
    keep_best_ = static_cast<size_t>(ctx.params().integer("keep_best"));
  }

  void forward(Batch& b, StageContext& ctx) override {
    next_batch_ = b.index + 1;
    uint64_t step = ctx.run().step + 1;  // the step this batch completes
    if (!ctx.run().writes_outputs() || every_ == 0 || step % every_ != 0) return;
    write(ctx, step, "step-" + std::to_string(step));
  }

  void finish(StageContext& ctx) override {
    uint64_t step = ctx.run().step;
    if (!ctx.run().writes_outputs() || step == 0 || step == last_written_) return;
    write(ctx, step, "step-" + std::to_string(step));
  }

  void validation_end(const std::map<std::string, double>& metrics, StageContext& ctx) override {
    auto it = metrics.find("loss");
    if (keep_best_ == 0 || !ctx.run().writes_outputs() || it == metrics.end()) return;
    double loss = it->second;
    if (best_.size() >= keep_best_ && loss >= best_.back().first) return;
    std::string name = "best-step-" + std::to_string(ctx.run().step);
    save(ctx, ctx.run().step, name);
    best_.emplace_back(loss, name);
    std::sort(best_.begin(), best_.end());
    while (best_.size() > keep_best_) {
      fs::remove_all(root(ctx) / best_.back().second);
      best_.pop_back();
    }
  }

  void save(StateWriter& w) const override {
    w.integer("best_count", static_cast<int64_t>(best_.size()));
    for (size_t i = 0; i < best_.size(); ++i) {
      w.number("best." + std::to_string(i) + ".loss", best_[i].first);
      w.text("best." + std::to_string(i) + ".name", best_[i].second);
    }
  }
  void load(StateReader& r) override {
    best_.clear();
    if (!r.has("best_count")) return;
    int64_t n = r.integer("best_count");
    for (int64_t i = 0; i < n; ++i)
      best_.emplace_back(r.number("best." + std::to_string(i) + ".loss"),
                         r.text("best." + std::to_string(i) + ".name"));
  }

 private:
  static fs::path root(StageContext& ctx) { return fs::path(ctx.run().run_dir) / "checkpoints"; }

  void save(StageContext& ctx, uint64_t step, const std::string& name) {
    // Saved at the end of this batch's step: the run position is the step being completed.
    RunState& run = ctx.run();
    uint64_t saved_step = run.step;
    run.step = step;
    save_checkpoint(ctx.graph_plan(), run, next_batch_, (root(ctx) / name).string());
    run.step = saved_step;
  }

  void write(StageContext& ctx, uint64_t step, const std::string& name) {
    save(ctx, step, name);
    last_written_ = step;
    periodic_.push_back(name);
    while (periodic_.size() > keep_) {
      fs::remove_all(root(ctx) / periodic_.front());
      periodic_.erase(periodic_.begin());
    }
  }

  uint64_t every_ = 1000, last_written_ = 0, next_batch_ = 0;
  size_t keep_ = 3, keep_best_ = 2;
  std::vector<std::string> periodic_;
  std::vector<std::pair<double, std::string>> best_;
};
SLIPSTREAM_REGISTER_STAGE(CheckpointStage);

}  // namespace slipstream
