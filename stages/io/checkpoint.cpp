// checkpoint: writes every stage's weights and state every N steps, at the end of the run and on
// SIGINT/SIGTERM, and keeps the best checkpoints by validation loss. Layout: engine/checkpoint.h.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/atomic_file.h"
#include "engine/checkpoint.h"
#include "engine/graph.h"
#include "engine/registry.h"
#include "engine/run_directory.h"
#include "engine/safetensors.h"
#include "engine/state_io.h"

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
  // and `keep_best`, and leftovers of an interrupted write or prune (`step-N.tmp`) go. The
  // runner has moved checkpoints past the resume point aside (engine/run_directory.h); anything
  // here that is not a complete checkpoint of this run by name stays as it is.
  void start(StageContext& ctx) override {
    if (!ctx.run().writes_outputs()) return;
    const fs::path dir = root(ctx);
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return;
    const uint64_t at = ctx.run().step;
    std::erase_if(best_, [](const auto& b) { return !std::isfinite(b.first); });
    std::vector<std::pair<uint64_t, std::string>> periodic;
    std::vector<std::string> foreign;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name == kLast || name == std::string(kLast) + ".tmp") continue;  // pointed again below
      uint64_t step = 0;
      const bool ours = run_checkpoint_step(name, step);
      if (!ours) {
        // This stage's leftovers: a write or a removal a kill cut short.
        const std::string stem = name.ends_with(".tmp") ? name.substr(0, name.size() - 4) : "";
        if (!stem.empty() && (run_checkpoint_step(stem, step))) {
          fs::remove_all(e.path(), ec);
          continue;
        }
        foreign.push_back(name);
        continue;
      }
      if (!fs::exists(e.path() / "DONE", ec) || step > at) {
        foreign.push_back(name +
                          (step > at ? " (past step " + std::to_string(at) + ")" : " (no DONE)"));
        continue;
      }
      if (name.starts_with("step-")) {
        periodic.emplace_back(step, name);
      } else if (step == at && !listed(name)) {
        adopt_own_best(ctx, dir, name);
      }
      // Any other best checkpoint the saved state does not list was not written by this run's
      // history up to `at` (a copy, or a keep_best of another value): it stays, outside the count.
    }
    std::erase_if(best_, [&](const auto& b) { return !fs::exists(dir / b.second / "DONE", ec); });
    std::sort(periodic.begin(), periodic.end());
    periodic_.clear();
    for (auto& p : periodic) periodic_.push_back(p.second);
    if (!periodic.empty() && periodic.back().first == at) last_written_ = at;
    // A keep_best lowered on a resume removes no best checkpoint at the start (a model worth
    // keeping is not lost to a setting): they go as better ones are written, the worst first.
    std::sort(best_.begin(), best_.end());
    std::vector<std::string> bests_over;
    for (size_t i = keep_best_; i < best_.size(); ++i) bests_over.push_back(best_[i].second);
    const std::vector<std::string> removed = prune(ctx, /*bests=*/false);
    point_last(ctx);
    auto joined = [](const std::vector<std::string>& v) {
      std::string list;
      for (const auto& r : v) list += (list.empty() ? "" : ", ") + r;
      return list;
    };
    if (!removed.empty())
      ctx.log("keep " + std::to_string(keep_) + " and keep_best " + std::to_string(keep_best_) +
              " (this run's settings) removed " + joined(removed));
    if (!bests_over.empty())
      ctx.log("keep_best " + std::to_string(keep_best_) +
              " (this run's setting) keeps fewer best " +
              "checkpoints than the run has: " + joined(bests_over) +
              (keep_best_ == 0 ? " stay (keep_best 0 writes no more)"
                               : " stay until better ones are written"));
    if (!foreign.empty())
      ctx.log("left alone in " + dir.string() +
              ", not counted as this run's checkpoints: " + joined(foreign));
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
    // Better than the keep_best-th best (the books may hold more, left from a higher keep_best).
    std::sort(best_.begin(), best_.end());
    if (best_.size() >= keep_best_ && loss >= best_[keep_best_ - 1].first) return;
    std::string name = "best-step-" + std::to_string(ctx.run().step);
    // Listed before the save, so the checkpoint's own state names it with its loss: a resume
    // from a periodic checkpoint of the same step, written before this validation (the one at
    // a run's end), finds it there (adopt_own_best).
    best_.emplace_back(loss, name);
    if (!save(ctx, name)) {
      best_.pop_back();
      return;
    }
    prune(ctx);
  }

  void save(StateWriter& w) const override {
    w.integer("best_count", static_cast<int64_t>(best_.size()));
    for (size_t i = 0; i < best_.size(); ++i) {
      w.number("best." + std::to_string(i) + ".loss", best_[i].first);
      w.text("best." + std::to_string(i) + ".name", best_[i].second);
    }
  }
  void load(StateReader& r) override { best_ = listed_bests(r); }

 private:
  // The (loss, name) list save() writes.
  static std::vector<std::pair<double, std::string>> listed_bests(const StateReader& r) {
    std::vector<std::pair<double, std::string>> out;
    if (!r.has("best_count")) return out;
    const int64_t n = r.integer("best_count");
    for (int64_t i = 0; i < n; ++i)
      out.emplace_back(r.number("best." + std::to_string(i) + ".loss"),
                       r.text("best." + std::to_string(i) + ".name"));
    return out;
  }

  static constexpr const char* kLast = "last";
  static fs::path root(StageContext& ctx) { return fs::path(ctx.run().run_dir) / "checkpoints"; }

  bool listed(const std::string& name) const {
    return std::any_of(best_.begin(), best_.end(), [&](const auto& b) { return b.second == name; });
  }

  // A best checkpoint of the resume's own step that the resumed state does not list: the
  // validation at a run's end comes after that step's periodic checkpoint. Its own state names it
  // with its loss (validation_end), so it counts again; one that does not (written before this
  // rule, or unreadable) stays outside the count, as any other.
  void adopt_own_best(StageContext& ctx, const fs::path& dir, const std::string& name) {
    try {
      const std::string path = (dir / name / "state.safetensors").string();
      const SafetensorsFile f = read_safetensors(path, SafetensorsRead::metadata);
      for (const auto& [loss, listed] :
           listed_bests(StateReader(f.tensors, f.metadata, ctx.name(), path)))
        if (listed == name) {
          if (std::isfinite(loss)) best_.emplace_back(loss, name);
          return;
        }
    } catch (const std::exception& e) {
      ctx.log(name + " not counted as a best checkpoint: " + e.what());
    }
  }

  // False when the run's state cannot be complete at this step: an optimizer sharded over the
  // ranks (sync.shard_optimizer) whose state was not gathered to this rank for it (the ranks
  // gather at checkpoint steps, validations and the end; an interrupt stops them apart).
  bool save(StageContext& ctx, const std::string& name) {
    const RunState& run = ctx.run();
    const OptimizerShard* shard = ctx.optimizer_shard().get();
    if (shard && shard->gather_state && shard->gathered_step != run.step) {
      ctx.log(name +
              " not written: the optimizer's state is spread over the ranks "
              "(sync.shard_optimizer) and the ranks did not gather it at step " +
              std::to_string(run.step) + "; the last checkpoint written stays the newest");
      return false;
    }
    try {
      // The run directory removed while the checkpoint was written (its step-N.tmp went from
      // under the write): again, into the directory made again, a few times while a removal
      // may still be going on.
      for (int attempt = 1;; ++attempt) {
        try {
          save_checkpoint(ctx.graph_plan(), run, next_batch_, (root(ctx) / name).string());
          break;
        } catch (const CheckpointRemoved& e) {
          if (attempt == 3) throw;
          ctx.log("warning: " + name + " was removed while it was written (" + e.what() +
                  "): writing it again");
        }
      }
    } catch (const std::exception& e) {
      // What the run still has, and how to go on from it (a full disk, most often).
      std::error_code ec;
      const bool complete = fs::exists(root(ctx) / name / "DONE", ec);
      std::string what = std::string(e.what()) + "; " + name +
                         (complete ? " is complete on disk but not known to be durable. "
                                   : " was not written (nothing of it is left). ");
      if (periodic_.empty())
        what += "No checkpoint of this run was written yet";
      else
        what += "The newest checkpoint is " + periodic_.back() + ": --resume " + ctx.run().run_dir +
                " goes on from it once the cause is mended (free space, or a " + "lower keep)";
      throw std::runtime_error(what);
    }
    keep_config_yaml(ctx);
    return true;
  }

  // A run directory removed while the run ran is made again by the checkpoint's write; its
  // config.yaml, which a resume and eval read, comes back with it (the graph the run is).
  static void keep_config_yaml(StageContext& ctx) {
    const fs::path cfg = fs::path(ctx.run().run_dir) / "config.yaml";
    std::error_code ec;
    const bool there = fs::exists(cfg, ec);
    if (ec || (there && (fs::file_size(cfg, ec) > 0 || ec))) return;  // an emptied one: again
    try {
      write_file_atomically(cfg.string(), resolved_config_yaml(ctx.graph_plan()));
      ctx.log("warning: " + cfg.string() +
              (there ? " was emptied"
                     : " was gone (the run directory deleted or moved while the run ran?)") +
              ": written again from the run's graph, so --resume " + ctx.run().run_dir +
              " goes on from here");
    } catch (const std::exception& e) {
      ctx.log("warning: " + cfg.string() + " is gone and cannot be written again (" + e.what() +
              ")");
    }
  }

  void write(StageContext& ctx, uint64_t step, const std::string& name) {
    // The last good step stays the newest checkpoint while the loss is not finite.
    if (ctx.run().nonfinite_streak > 0) return;
    for (int attempt = 1;; ++attempt) {
      if (!save(ctx, name)) return;
      last_written_ = step;
      if (periodic_.empty() || periodic_.back() != name) periodic_.push_back(name);
      try {
        // `last` moves to the new checkpoint before the old ones go: it never names a removed one.
        point_last(ctx);
        prune(ctx, /*bests=*/false);  // bests change only when a better one is written
        return;
      } catch (const std::exception& e) {
        // The run directory removed or moved between the write and the link: the checkpoint
        // went with it. Written again into the directory made again.
        std::error_code ec;
        if (attempt == 3 || fs::exists(root(ctx) / name, ec) || ec) throw;
        periodic_.pop_back();  // not there: the write below adds it again, or names the one before
        ctx.log("warning: " + name + " was gone right after its write (" + e.what() +
                "): writing it again");
      }
    }
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

  // Removes the periodic checkpoints past `keep` (oldest first) and, with `bests`, the best past
  // `keep_best` (worst first); returns their names.
  std::vector<std::string> prune(StageContext& ctx, bool bests = true) {
    std::vector<std::string> removed;
    while (periodic_.size() > keep_) {
      remove_checkpoint(ctx, periodic_.front());
      removed.push_back(periodic_.front());
      periodic_.erase(periodic_.begin());
    }
    std::sort(best_.begin(), best_.end());
    while (bests && best_.size() > keep_best_) {
      remove_checkpoint(ctx, best_.back().second);
      removed.push_back(best_.back().second);
      best_.pop_back();
    }
    return removed;
  }

  uint64_t every_ = 1000, last_written_ = 0, next_batch_ = 0;
  size_t keep_ = 3, keep_best_ = 2;
  std::vector<std::string> periodic_;
  std::vector<std::pair<double, std::string>> best_;
};
SLIPSTREAM_REGISTER_STAGE(CheckpointStage);

}  // namespace slipstream
