// checkpoint: writes every stage's weights and state every N steps, at the end of the run and on
// SIGINT/SIGTERM, and keeps the best checkpoints by validation loss. Layout: engine/checkpoint.h.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

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

  // A resumed run finds its books on disk: checkpoints already written count against `keep`
  // and `keep_best`, leftovers of an interrupted write or prune go, and checkpoints past the
  // resume point (a resume from an older checkpoint rewinds the run) are removed.
  void start(StageContext& ctx) override {
    if (!ctx.run().writes_outputs()) return;
    const fs::path dir = root(ctx);
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return;
    const uint64_t at = ctx.run().step;
    std::erase_if(best_, [](const auto& b) { return !std::isfinite(b.first); });
    std::vector<std::pair<uint64_t, std::string>> periodic;
    std::vector<std::string> removed;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name == kLast) continue;  // pointed again below
      const bool complete = !name.ends_with(".tmp") && fs::exists(e.path() / "DONE", ec);
      std::optional<uint64_t> step = complete ? step_of(name) : std::nullopt;
      bool keep = false;
      if (step && name.starts_with("step-") && *step <= at) {
        periodic.emplace_back(*step, name);
        keep = true;
      } else if (step && name.starts_with("best-step-") && *step <= at) {
        keep = std::any_of(best_.begin(), best_.end(),
                           [&](const auto& b) { return b.second == name; });
      }
      if (keep) continue;
      fs::remove_all(e.path());
      if (!name.ends_with(".tmp")) removed.push_back(name);
    }
    std::erase_if(best_, [&](const auto& b) { return !fs::exists(dir / b.second / "DONE", ec); });
    std::sort(periodic.begin(), periodic.end());
    periodic_.clear();
    for (auto& p : periodic) periodic_.push_back(p.second);
    if (!periodic.empty() && periodic.back().first == at) last_written_ = at;
    prune(ctx);
    point_last(ctx);
    if (!removed.empty()) {
      std::string list;
      for (const auto& r : removed) list += (list.empty() ? "" : ", ") + r;
      std::cerr << ctx.name() << ": removed checkpoints not part of the run at step " << at << ": "
                << list << "\n";
    }
  }

  // The position a checkpoint of this step resumes from (validation batches do not move it).
  void forward(Batch& b, StageContext& ctx) override {
    if (ctx.run().training) next_batch_ = b.index + 1;
  }

  void step_end(const Batch& b, StageContext& ctx) override {
    (void)b;
    uint64_t step = ctx.run().step;
    if (!ctx.run().writes_outputs() || every_ == 0 || step % every_ != 0) return;
    write(ctx, step, "step-" + std::to_string(step));
  }

  // A checkpoint copies the weights and the optimizer's state off the device: the runner ends the
  // step before it enqueues the next.
  bool step_end_reads_device(uint64_t step) const override {
    return every_ != 0 && step % every_ == 0;
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
    // A diverged model is never "best", and neither is a step whose training loss was not finite.
    if (!std::isfinite(loss) || ctx.run().nonfinite_streak > 0) return;
    if (best_.size() >= keep_best_ && loss >= best_.back().first) return;
    std::string name = "best-step-" + std::to_string(ctx.run().step);
    if (!save(ctx, name)) return;
    best_.emplace_back(loss, name);
    prune(ctx);
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
  static constexpr const char* kLast = "last";
  static fs::path root(StageContext& ctx) { return fs::path(ctx.run().run_dir) / "checkpoints"; }

  // "step-120" and "best-step-120" -> 120.
  static std::optional<uint64_t> step_of(const std::string& name) {
    size_t dash = name.rfind('-');
    if (dash == std::string::npos || dash + 1 == name.size()) return std::nullopt;
    uint64_t v = 0;
    auto r = std::from_chars(name.data() + dash + 1, name.data() + name.size(), v);
    if (r.ec != std::errc() || r.ptr != name.data() + name.size()) return std::nullopt;
    return v;
  }

  // False when the run's state cannot be complete at this step: an optimizer sharded over the
  // ranks (sync.shard_optimizer) whose state was not gathered to this rank for it (the ranks
  // gather at checkpoint steps, validations and the end; an interrupt stops them apart).
  bool save(StageContext& ctx, const std::string& name) {
    const RunState& run = ctx.run();
    if (run.optimizer_shard && run.optimizer_shard->gather_state &&
        run.optimizer_shard->gathered_step != run.step) {
      std::cerr << ctx.name() << ": " << name
                << " not written: the optimizer's state is spread over the ranks "
                   "(sync.shard_optimizer) and the ranks did not gather it at step "
                << run.step << "; the last checkpoint written stays the newest\n";
      return false;
    }
    save_checkpoint(ctx.graph_plan(), run, next_batch_, (root(ctx) / name).string());
    return true;
  }

  void write(StageContext& ctx, uint64_t step, const std::string& name) {
    // The last good step stays the newest checkpoint while the loss is not finite.
    if (ctx.run().nonfinite_streak > 0) return;
    if (!save(ctx, name)) return;
    last_written_ = step;
    periodic_.push_back(name);
    prune(ctx);
    point_last(ctx);
  }

  // checkpoints/last: a relative symlink to the newest periodic checkpoint (none: no link),
  // replaced by a rename so a reader never finds it missing or half made.
  void point_last(StageContext& ctx) const {
    const fs::path link = root(ctx) / kLast, tmp = root(ctx) / (std::string(kLast) + ".tmp");
    std::error_code ec;
    fs::remove(tmp, ec);
    if (periodic_.empty()) {
      fs::remove(link, ec);
      return;
    }
    fs::create_directory_symlink(periodic_.back(), tmp);
    fs::rename(tmp, link);
  }

  // Removal renames first: a kill mid-removal leaves a `.tmp` (cleared at the next start),
  // never a half-deleted directory that looks like a checkpoint.
  static void remove_checkpoint(StageContext& ctx, const std::string& name) {
    fs::path dir = root(ctx) / name, doomed = root(ctx) / (name + ".tmp");
    std::error_code ec;
    fs::remove_all(doomed, ec);
    fs::rename(dir, doomed, ec);
    fs::remove_all(ec ? dir : doomed);
  }

  void prune(StageContext& ctx) {
    while (periodic_.size() > keep_) {
      remove_checkpoint(ctx, periodic_.front());
      periodic_.erase(periodic_.begin());
    }
    std::sort(best_.begin(), best_.end());
    while (best_.size() > keep_best_) {
      remove_checkpoint(ctx, best_.back().second);
      best_.pop_back();
    }
  }

  uint64_t every_ = 1000, last_written_ = 0, next_batch_ = 0;
  size_t keep_ = 3, keep_best_ = 2;
  std::vector<std::string> periodic_;
  std::vector<std::pair<double, std::string>> best_;
};
SLIPSTREAM_REGISTER_STAGE(CheckpointStage);

}  // namespace slipstream
