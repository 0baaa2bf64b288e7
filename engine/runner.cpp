#include "engine/runner.h"

#include <tbb/flow_graph.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "engine/atomic_file.h"
#include "engine/auto_batch.h"
#include "engine/checkpoint.h"
#include "engine/console_tee.h"
#include "engine/launch.h"
#include "engine/memory_pool.h"
#include "engine/metrics_log.h"
#include "engine/rank_reduce.h"
#include "engine/registry.h"
#include "engine/resource_limits.h"
#include "engine/run_directory.h"
#include "engine/run_info.h"
#include "engine/stats_record.h"
#include "engine/step_graphs.h"
#include "engine/stop_signals.h"
#include "engine/tensorboard/event_writer.h"

namespace fs = std::filesystem;

namespace slipstream {

namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
uint64_t unix_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// "850 ms", "12.5 s", "14 min", "3.2 h": how long something takes, for a person.
std::string duration_text(double seconds) {
  char b[32];
  if (seconds < 1)
    std::snprintf(b, sizeof b, "%.0f ms", seconds * 1e3);
  else if (seconds < 120)
    std::snprintf(b, sizeof b, "%.1f s", seconds);
  else if (seconds < 7200)
    std::snprintf(b, sizeof b, "%.0f min", seconds / 60);
  else
    std::snprintf(b, sizeof b, "%.1f h", seconds / 3600);
  return b;
}

// "1:02:03" or "02:03" (as progress bars show elapsed and remaining time); "?" when unknown.
std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e8) return "?";
  const auto s = static_cast<uint64_t>(seconds + 0.5);
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60),
                  static_cast<unsigned long long>(s % 60));
  else
    std::snprintf(b, sizeof b, "%02llu:%02llu", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  return b;
}

// A bar of `width` cells for `fraction` in [0, 1], in eighths of a cell.
std::string bar_text(double fraction, int width) {
  static const char* const kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const int eighths = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width * 8);
  std::string s;
  for (int i = 0; i < eighths / 8; ++i) s += "█";
  int cells = eighths / 8;
  if (eighths % 8) s += kEighths[eighths % 8], ++cells;
  s.append(static_cast<size_t>(width - cells), ' ');
  return s;
}

struct LiveCounters {
  std::atomic<uint64_t> items_in{0}, items_out{0}, busy_ns{0}, blocked_ns{0};
  std::atomic<uint64_t> enqueued{0}, started{0};
  std::atomic<uint32_t> max_queue{0};
  // Publisher's previous sample, for the *_recent rates.
  uint64_t prev_items = 0, prev_busy = 0, prev_blocked = 0;
  bool prev_rate_set = false;  // items_per_s_recent holds a smoothed rate
};

struct Msg {
  uint64_t order = 0;  // 0, 1, 2, ... in source order: what sequencers sort by
  std::shared_ptr<Batch> batch;
  bool resident = false;  // a resident batch again (RunOptions::resident_batches): no data stage
};

void copy_name(char* dst, size_t n, const std::string& src) {
  size_t len = std::min(n - 1, src.size());
  std::memcpy(dst, src.data(), len);
  dst[len] = '\0';
}

// The process's resident memory (/proc/self/statm), 0 when unknown.
uint64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace

StageError::StageError(std::string stage, std::string kind, uint64_t batch, const std::string& what)
    : std::runtime_error("stage '" + stage + "' (" + kind + "), batch " + std::to_string(batch) +
                         ": " + what),
      stage_(std::move(stage)),
      batch_(batch) {}

struct Runner::Impl {
  RunOptions opt;
  RunState run;
  std::unique_ptr<Graph> graph;
  std::vector<std::unique_ptr<LiveCounters>> counters;
  std::ostream* log = &std::cout;
  std::ostream quiet{nullptr};  // discards (non-zero ranks)
  bool tty = false;
  std::string device_reason;                // printed when the run starts
  std::unique_ptr<StepGraphs> step_graphs;  // run.cuda_graph on
  bool graph_off_reported = false;
  std::optional<ConsoleTee> console;      // the run directory's console.log, during run()
  std::optional<DirectoryLock> dir_lock;  // the run directory's one writer, during run()
  bool made_run_dir = false;              // this run created run.run_dir (a fresh run)
  bool steps_began = false;               // setup passed and the steps' graph started

  // Flow control.
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> max_in_flight_seen{0};
  std::vector<uint64_t> head_next;  // next batch index per head stage
  uint64_t head_order = 0;
  uint64_t head_last_return_ns = 0;

  // Metrics: the training interval's sums, and a validation pass's sums.
  std::mutex metrics_mu;
  // name -> (Σ weight·value, Σ weight)
  std::map<std::string, std::pair<double, double>> interval, validation;
  bool in_validation = false;
  std::map<std::string, double> last_train, last_validation;
  MetricsLog metrics_file;
  tensorboard::EventFileWriter events_file;  // the rows' numbers for TensorBoard (run.tensorboard)
  bool metrics_file_failed = false;          // metrics.jsonl takes no more rows
  std::string metrics_failure;  // why metrics.jsonl or the events file stopped: the run stops
  // Divergence: whether this step's loss or gradient was not finite, and where the streak began.
  bool step_nonfinite = false;
  uint64_t streak_first_step = 0;
  uint64_t interval_start_ns = 0, interval_samples = 0, interval_steps = 0;
  uint64_t interval_section_wait_ns = 0;
  uint64_t step_section_wait_ns = 0;  // during the step in progress (RunOptions::on_step)
  uint64_t last_section_end_ns = 0;
  uint64_t micro_in_step = 0;      // batches of the optimizer step in progress (accumulation)
  bool cost_note_pending = false;  // a GPU-sized run on the CPU: say what its steps cost
  uint64_t last_progress_ns = 0;   // the terminal progress line's last update

  // Validation copies of the data stages (same kinds and params, split = validation).
  std::vector<std::unique_ptr<Stage>> eval_stages;
  std::vector<std::unique_ptr<StageContext>> eval_contexts;
  double best_validation = INFINITY;
  // For the stats record (the publisher's thread reads them).
  std::atomic<uint64_t> section_wait_total_ns{0};
  std::atomic<double> last_validation_loss{NAN}, best_validation_loss{NAN};
  uint64_t prev_pub_wait_ns = 0;
  double wait_frac = NAN;
  int64_t validations_without_improvement = 0;
  bool early_stopped = false;
  std::string end_reason;  // why the run ended, for the last metrics row
  uint64_t last_validated_step = 0;

  // Stats publishing.
  std::unique_ptr<stats::RecordWriter> record;
  std::thread publisher;
  std::mutex pub_mu;
  std::condition_variable pub_cv;
  bool pub_stop = false;
  uint64_t start_ns = 0, start_unix = 0;
  std::atomic<uint64_t> samples{0};
  std::atomic<double> last_loss{NAN};
  double steps_rate = 0, samples_rate = 0;
  uint64_t prev_pub_ns = 0, prev_pub_step = 0, prev_pub_samples = 0;
  uint64_t steps_this_process = 0;
  uint64_t steps_ended_ahead = 0;  // RunResult::steps_ended_ahead

  GraphPlan& plan() { return graph->plan(); }
  size_t n() const { return graph->size(); }

  // ---- stage calls with timing and error context ----
  template <class Fn>
  void as_stage(size_t k, uint64_t batch_index, Fn&& fn) {
    const ExecContext::ReadBackOwner owner(static_cast<int>(k));
    if (capture::StepRecorder* r = capture::recording_here()) r->set_stage(static_cast<int>(k));
    try {
      fn();
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      const auto& ps = plan().stages[k];
      throw StageError(ps.name, ps.schema->kind(), batch_index, e.what());
    }
  }
  template <class Fn>
  void timed(size_t k, uint64_t batch_index, Fn&& fn) {
    uint64_t t0 = now_ns();
    as_stage(k, batch_index, fn);
    counters[k]->busy_ns += now_ns() - t0;
  }

  // Pulls one batch out of head stage k (source or rebatcher), recursively.
  bool pull(std::vector<Stage*>& stages, std::vector<StageContext*>& ctxs,
            std::vector<uint64_t>& next, size_t k, Batch& out, bool count) {
    if (out.slots.size() != plan().slots.size()) out.slots.resize(plan().slots.size());
    out.index = next[k];
    bool ok = false;
    uint64_t t0 = now_ns(), nested = 0;
    try {
      if (plan().stages[k].schema->stage_role() == StageRole::source) {
        ok = stages[k]->produce(out, *ctxs[k]);
      } else {
        std::function<bool(Batch&)> up = [&](Batch& in) {
          uint64_t u0 = now_ns();
          bool r = pull(stages, ctxs, next, k - 1, in, count);
          nested += now_ns() - u0;
          return r;
        };
        ok = stages[k]->rebatch(out, up, *ctxs[k]);
      }
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      const auto& ps = plan().stages[k];
      throw StageError(ps.name, ps.schema->kind(), out.index, e.what());
    }
    if (ok) next[k]++;
    if (count) {
      counters[k]->busy_ns += now_ns() - t0 - nested;
      counters[k]->items_in++;
      if (ok) counters[k]->items_out++;
    }
    return ok;
  }

  void metric(std::string_view name, double value, MetricKind kind, double weight) {
    std::lock_guard lock(metrics_mu);
    auto& m = in_validation ? validation : interval;
    auto& e = m[std::string(name)];
    if (kind == MetricKind::last) {
      e = {value, 1.0};
    } else if (weight > 0) {  // a value measured over nothing adds nothing
      e.first += value * weight;
      e.second += weight;
    }
    if (in_validation) return;
    if (name == "loss") last_loss.store(value);
    if ((name == "loss" && !std::isfinite(value)) || name == "nonfinite_grad_steps")
      step_nonfinite = true;
  }

  // Each stage's parameters (stable after setup), for the gradient announcements.
  std::vector<std::vector<Parameter*>> stage_params;

  // Stage k's backward for batch b, then (when a stage listens, e.g. allreduce) the announcement
  // that its parameters' gradients are final.
  void backward_stage(size_t k, Batch& b) {
    as_stage(k, b.index, [&] { graph->stage(k).backward(b, graph->context(k)); });
    if (run.gradient_listeners.empty()) return;
    if (stage_params.size() != n()) {
      stage_params.assign(n(), {});
      for (size_t j = 0; j < n(); ++j) stage_params[j] = graph->stage(j).parameters();
    }
    if (!stage_params[k].empty())
      as_stage(k, b.index, [&] { graph->context(k).gradients_ready(stage_params[k]); });
  }

  // ---- the trainable section for one batch ----
  // The section's stages read the batch only after what its fence orders (prefetch's copies).
  void enter_section(Batch& b) const {
    if (b.fence && run.exec) b.fence->wait(*run.exec);
  }

  void section(Batch& b) {
    enter_section(b);
    section_stages(b);
  }

  // A training batch's section, as a CUDA graph when run.cuda_graph is on (engine/step_graphs.h):
  // the stages' work recorded, then replayed, captured or issued.
  void training_section(Batch& b) {
    if (!step_graphs || !step_graphs->enabled()) return section(b);
    enter_section(b);  // the wait for the batch's copies comes before the step's work, as itself
    try {
      capture::StepRecorder rec(run.exec->stream());
      // Isolated: a thread that waits inside a stage takes no other task, whose launches would
      // join this step's.
      tbb::this_task_arena::isolate([&] { section_stages(b); });
      step_graphs->finish(rec, run.step + 1);
    } catch (const capture::IssueError& e) {
      if (e.stage() < 0 || static_cast<size_t>(e.stage()) >= n()) throw;
      const auto& ps = plan().stages[static_cast<size_t>(e.stage())];
      throw StageError(ps.name, ps.schema->kind(), b.index, e.what());
    }
    if (!step_graphs->enabled() && !graph_off_reported) {
      graph_off_reported = true;
      log_line("cuda graph: " + step_graphs->off_reason());
    }
  }

  void section_stages(Batch& b) {
    size_t begin = plan().section_begin;
    bool has_loss = false;
    for (size_t k = begin; k < n(); ++k) {
      const auto& ps = plan().stages[k];
      if (ps.after_loss) continue;
      has_loss = has_loss || ps.schema->stage_role() == StageRole::loss;
      timed(k, b.index, [&] { graph->stage(k).forward(b, graph->context(k)); });
    }
    if (has_loss && run.training) {
      for (size_t k = n(); k-- > begin;) {
        const auto& ps = plan().stages[k];
        if (ps.after_loss || !ps.schema->is_differentiable()) continue;
        timed(k, b.index, [&] { backward_stage(k, b); });
      }
    }
    for (size_t k = begin; k < n(); ++k)
      if (plan().stages[k].after_loss)
        timed(k, b.index, [&] { graph->stage(k).forward(b, graph->context(k)); });
  }

  // ---- a training batch, the host one batch ahead of the device ----
  // On a device the section of batch k is enqueued before the host waits for batch k-1's
  // read-backs (its reports, then after_step), so the device always has the next batch's work
  // queued when it finishes one. A step whose end needs the device quiet — a metrics row (the
  // next batch's host-side metrics must not join it), validation, a stage's step_end that reads
  // the device (checkpoints), the last step, a stop — is finished before the next is enqueued.
  struct Pending {
    std::shared_ptr<Batch> batch;
    uint64_t data_wait_ns = 0;  // the section's wait for this batch
    uint64_t read_backs = 0;    // its group (ExecContext::close_read_backs)
  };
  std::optional<Pending> pending;

  void train_batch(std::shared_ptr<Batch> b, uint64_t data_wait_ns) {
    if (pending && !may_run_past()) finish_pending();
    if (run.stop_requested) return;  // the step just finished was the last
    training_section(*b);
    const uint64_t group = run.exec ? run.exec->close_read_backs() : 0;
    if (pending) {
      if (micro_in_step + 1 == run.micro_batches_per_step) ++steps_ended_ahead;
      finish_pending();
    }
    pending = Pending{std::move(b), data_wait_ns, group};
    if (!run_ahead()) finish_pending();
  }

  // The host runs ahead on a device backend (CUDA, and the emulator, so CI runs this path).
  bool run_ahead() const { return run.exec && run.exec->device_ops(); }

  // Whether the step the pending batch completes may end after the next batch is enqueued.
  bool may_run_past() {
    if (run.stop_requested) return false;
    if (micro_in_step + 1 < run.micro_batches_per_step) return true;  // mid-step: no step end
    const uint64_t s = run.step + 1;
    const auto every = [&](const char* key) {
      const int64_t e = plan().run.integer(key);
      return e > 0 && s % static_cast<uint64_t>(e) == 0;
    };
    const int64_t limit = plan().run.integer("steps");
    if (every("log_every") || every("validate_every") ||
        (limit > 0 && s >= static_cast<uint64_t>(limit)))
      return false;
    for (size_t k = plan().section_begin; k < n(); ++k)
      if (graph->stage(k).step_end_reads_device(s)) return false;
    return true;
  }

  void finish_pending() {
    Pending p = std::move(*pending);
    pending.reset();
    complete_read_backs(*p.batch, p.read_backs);
    for (size_t k = plan().section_begin; k < n(); ++k) counters[k]->items_out++;
    after_step(*p.batch, p.data_wait_ns);
  }

  // The host's wait for a batch on a device: what the stages asked to read back (the loss's
  // sums, the optimizer's outcome) arrives, and their reports run — after the batch's whole
  // work is enqueued, so the device never idles while the host issues the rest of a step.
  // `group`: the batch's read-backs (0: everything asked so far).
  void complete_read_backs(const Batch& b, uint64_t group = 0) {
    if (!run.exec) return;
    try {
      const auto each = [&](int k, const std::function<void()>& report) {
        if (k < 0 || static_cast<size_t>(k) >= n()) return report();
        as_stage(static_cast<size_t>(k), b.index, report);
      };
      if (group)
        run.exec->complete_read_backs_through(group, each);
      else
        run.exec->complete_read_backs(each);
    } catch (const StageError&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error("batch " + std::to_string(b.index) +
                               ": the device's work on it failed: " + e.what());
    }
  }

  void ensure_eval_copies() {
    if (!eval_stages.empty()) return;
    for (int k = 0; k < plan().section_begin; ++k) {
      eval_stages.push_back(StageRegistry::create(plan().stages[k].schema->kind()));
      auto ctx = std::make_unique<StageContext>(graph->context(k));
      ctx->split_ = StageContext::Split::validation;
      eval_contexts.push_back(std::move(ctx));
    }
    for (size_t k = 0; k < eval_stages.size(); ++k) eval_stages[k]->setup(*eval_contexts[k]);
  }

  // A run of several ranks (run.reduce_over_ranks set): every rank's (value × weight, weight) sums
  // and `extra` numbers added up into every rank's copy. The ranks that measured something hold
  // the same metric names; a rank that measured nothing (no validation games of its own) takes
  // them from the others. `what` names the reduction in a timeout.
  void sum_over_ranks(std::map<std::string, std::pair<double, double>>& sums,
                      std::span<double> extra, const std::string& what) {
    if (run.world_size <= 1 || !run.reduce_over_ranks) return;
    const auto& reduce = run.reduce_over_ranks;
    std::string names;
    for (auto& [name, sw] : sums) names += name + '\n';
    uint32_t h = 2166136261u;
    for (char c : names) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
    // [longest names, largest hash, -smallest hash over the ranks that measured something,
    // whether a rank measured nothing]
    const bool measured = !sums.empty();
    double head[4] = {static_cast<double>(names.size()), measured ? double(h) : -1.0,
                      measured ? -double(h) : -1e18, measured ? 0.0 : 1.0};
    reduce(head, RankReduce::max, what);
    if (head[0] > 0 && head[1] != -head[2])
      throw std::runtime_error(what + ": the ranks recorded different metrics");
    if (head[0] > 0 && head[3] > 0) {  // the names, from the ranks that have them
      std::vector<double> bytes(static_cast<size_t>(head[0]), 0.0);
      for (size_t b = 0; b < names.size(); ++b) bytes[b] = static_cast<unsigned char>(names[b]);
      reduce(bytes, RankReduce::max, what);
      std::string all;
      for (double b : bytes) all += static_cast<char>(static_cast<int>(b));
      if (!measured)
        for (size_t a = 0, e; (e = all.find('\n', a)) != std::string::npos; a = e + 1)
          sums[all.substr(a, e - a)] = {0.0, 0.0};
    }
    // [extra..., (sum, weight) per name]
    std::vector<double> v(extra.begin(), extra.end());
    for (auto& [name, sw] : sums) {
      v.push_back(sw.first);
      v.push_back(sw.second);
    }
    reduce(v, RankReduce::sum, what);
    std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(extra.size()), extra.begin());
    size_t i = extra.size();
    for (auto& [name, sw] : sums) {
      sw = {v[i], v[i + 1]};
      i += 2;
    }
  }

  std::map<std::string, double> validate() {
    ensure_eval_copies();
    std::vector<Stage*> st;
    std::vector<StageContext*> cx;
    for (size_t k = 0; k < eval_stages.size(); ++k)
      st.push_back(eval_stages[k].get()), cx.push_back(eval_contexts[k].get());
    for (size_t k = 0; k < n(); ++k) graph->stage(k).validation_begin(graph->context(k));
    const std::string label = "validation @ step " + std::to_string(run.step);
    const int64_t batches = plan().run.integer("validate_batches");
    if (run.world_size <= 1 || !run.reduce_over_ranks)
      return forward_pass(st, cx, batches, label).metrics;

    // Several ranks: rank r evaluates batches r, r + world, ... of the one validation set (or,
    // when each rank's source holds its own share, its own first batches/world), and the sums
    // are added up: the figures of one process evaluating them all, in a world-th of the time.
    const auto world = static_cast<uint64_t>(run.world_size);
    Pass pass =
        run.validation_per_rank
            ? forward_pass(st, cx, batches / run.world_size + (batches % run.world_size != 0),
                           label)
            : forward_pass(st, cx, batches, label, nullptr, static_cast<uint64_t>(run.rank), world);
    sum_over_ranks(pass.sums, {}, label);
    std::map<std::string, double> metrics;
    for (auto& [name, sw] : pass.sums)
      if (sw.second > 0) metrics[name] = sw.first / sw.second;
    return metrics;
  }

  // A pulled batch through the data transforms of `st` and the section's forward up to the loss
  // (`with_loss`: through it too, never past it). Returns the nanoseconds the section's stages
  // before the loss took: the model's answer, without scoring it.
  uint64_t forward_one(std::vector<Stage*>& st, std::vector<StageContext*>& cx, Batch& b,
                       bool with_loss) {
    for (size_t k = static_cast<size_t>(plan().head_end); k < st.size(); ++k)
      as_stage(k, b.index, [&] { st[k]->forward(b, *cx[k]); });
    enter_section(b);
    const uint64_t t0 = now_ns();
    uint64_t answer_ns = 0;
    for (size_t k = plan().section_begin; k < n(); ++k) {
      if (plan().stages[k].after_loss) continue;
      if (!answer_ns && plan().stages[k].schema->stage_role() == StageRole::loss) {
        answer_ns = now_ns() - t0;
        if (!with_loss) break;
      }
      as_stage(k, b.index, [&] { graph->stage(k).forward(b, graph->context(k)); });
    }
    complete_read_backs(b);
    return answer_ns ? answer_ns : now_ns() - t0;
  }

  // What a forward pass measured: its weighted means, the batches and examples it covered.
  struct Pass {
    std::map<std::string, double> metrics;
    std::map<std::string, std::pair<double, double>> sums;  // (value × weight, weight) per metric
    uint64_t batches = 0, samples = 0;
  };

  // Up to `batches` batches from the start of the data stages `st` (head and data transforms,
  // split validation) through the section's forward with training off. `label` heads the
  // terminal's progress line.
  // With `on_batch`, each batch is handed to it after the forward with the seconds the section's
  // stages before the loss took (the model's answer, without scoring it).
  // With `stride` > 1, only batches first, first + stride, ... below `batches`.
  Pass forward_pass(std::vector<Stage*>& st, std::vector<StageContext*>& cx, int64_t batches,
                    const std::string& label, const StreamCallback* on_batch = nullptr,
                    uint64_t first = 0, uint64_t stride = 1) {
    Pass pass;
    size_t head_end = static_cast<size_t>(plan().head_end);
    std::vector<uint64_t> next(head_end, 0);
    for (size_t k = 0; k < head_end; ++k) st[k]->seek(0, *cx[k]);
    {
      std::lock_guard lock(metrics_mu);
      validation.clear();
      in_validation = true;
    }
    run.training = false;
    try {
      for (auto i = static_cast<int64_t>(first); i < batches; i += static_cast<int64_t>(stride)) {
        if (stride != 1) {  // each head stage to batch i
          uint64_t idx = static_cast<uint64_t>(i);
          for (size_t k = head_end; k-- > 0;) {
            next[k] = idx;
            st[k]->seek(idx, *cx[k]);
            idx = st[k]->upstream_seek_index(idx);
          }
        }
        if (tty) {
          *log << "\r\033[K" << label << ": batch " << i + 1;
          if (batches != std::numeric_limits<int64_t>::max()) *log << "/" << batches;  // not "all"
          *log << std::flush;
        }
        Batch b = graph->new_batch();
        if (!pull(st, cx, next, head_end - 1, b, false)) break;
        const uint64_t answer_ns = forward_one(st, cx, b, true);
        if (on_batch) (*on_batch)(b, static_cast<double>(answer_ns) * 1e-9);
        ++pass.batches;
        pass.samples += b.samples;
      }
    } catch (...) {
      run.training = true;
      in_validation = false;
      throw;
    }
    run.training = true;
    {
      std::lock_guard lock(metrics_mu);
      in_validation = false;
      for (auto& [k, v] : validation)
        if (v.second > 0) pass.metrics[k] = v.first / v.second;
      pass.sums.insert(validation.begin(), validation.end());
    }
    return pass;
  }

  void log_line(const std::string& s) {
    if (tty) *log << "\r\033[K";
    *log << s << "\n" << std::flush;
  }

  void write_metrics_row(const char* split, const std::map<std::string, double>& values, double sps,
                         double wait_pct, const nlohmann::json& extra = nlohmann::json::object()) {
    if (!metrics_file.is_open() || metrics_file_failed) return;
    nlohmann::json row;
    row["step"] = run.step.load();
    row["split"] = split;
    row["time"] = static_cast<double>(unix_ns()) * 1e-9;
    for (const auto& [k, v] : values)
      row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
    if (sps >= 0) row["samples_per_s"] = sps;
    if (wait_pct >= 0) row["data_wait_pct"] = wait_pct;
    for (const auto& [k, v] : extra.items()) row[k] = v;
    if (!metrics_file.append(row.dump())) {
      metrics_file_failed = true;
      record_failure(metrics_file.error());
      return;
    }
    // After the events file failed, metrics.jsonl still takes the rows (the end row says why).
    if (!events_file.is_open() || !metrics_failure.empty()) return;
    auto scalars = row_scalars(split, row, values);
    if (scalars.empty()) return;  // an end row: nothing to plot
    if (!events_file.write_scalars(static_cast<int64_t>(run.step.load()), row["time"].get<double>(),
                                   scalars))
      record_failure(events_file.error());
  }

  // Training on without a record of it would lose the run's history silently: stop the way
  // SIGINT does (the step finishes, stages save) and fail at the end.
  void record_failure(const std::string& why) {
    if (!metrics_failure.empty()) return;
    metrics_failure = why;
    log_line("error: " + metrics_failure + "; stopping the run");
    run.stop_requested = true;
  }

  // A row's numbers as TensorBoard scalars tagged "<split>/<key>" (train/loss, validation/loss).
  // A value the row holds as null (NaN, Inf) goes as itself: TensorBoard plots those.
  static std::vector<tensorboard::Scalar> row_scalars(const std::string& split,
                                                      const nlohmann::json& row,
                                                      const std::map<std::string, double>& values) {
    std::vector<tensorboard::Scalar> out;
    for (const auto& [k, v] : row.items()) {
      if (k == "step" || k == "time") continue;
      if (v.is_number()) {
        out.push_back({split + "/" + k, v.get<double>()});
      } else if (v.is_null()) {
        if (auto it = values.find(k); it != values.end())
          out.push_back({split + "/" + k, it->second});
      }
    }
    return out;
  }

  // The train row for the steps since the last one; `steps_averaged` says how many (a resumed
  // run's first window, the last window and a diverged run's may be shorter than log_every).
  // With several ranks, the figures of the global batch: every rank's sums added up (samples/s
  // too; the data wait is this rank's).
  void write_train_row() {
    std::map<std::string, std::pair<double, double>> sums;
    {
      std::lock_guard lock(metrics_mu);
      sums.swap(interval);
    }
    double samples_all = static_cast<double>(interval_samples);
    sum_over_ranks(sums, std::span<double>(&samples_all, 1),
                   "the train metrics of step " + std::to_string(run.step));
    std::map<std::string, double> avg;
    for (auto& [k, v] : sums)
      if (v.second > 0) avg[k] = v.first / v.second;
    double secs = static_cast<double>(now_ns() - interval_start_ns) * 1e-9;
    double sps = secs > 0 ? samples_all / secs : 0;
    double wait =
        secs > 0 ? 100.0 * static_cast<double>(interval_section_wait_ns) * 1e-9 / secs : 0;
    last_train = avg;
    write_metrics_row("train", avg, sps, wait, {{"steps_averaged", interval_steps}});
    char head[128];
    std::snprintf(head, sizeof head, "step %llu", static_cast<unsigned long long>(run.step));
    std::string line = head;
    if (run.total_steps) line += "/" + std::to_string(run.total_steps);
    char tail[96];
    std::snprintf(tail, sizeof tail, " | %.1f samples/s | data wait %.0f%%", sps, wait);
    log_line(line + " |" + format_metrics(avg, 6) + tail);
    if (cost_note_pending && interval_steps > 0 && secs > 0) {
      cost_note_pending = false;
      const double per_step = secs / static_cast<double>(interval_steps);
      std::string note = "note: on this CPU a step of this run takes " + duration_text(per_step);
      if (run.total_steps > run.step)
        note += "; the remaining " + std::to_string(run.total_steps - run.step) +
                " steps take about " +
                duration_text(per_step * static_cast<double>(run.total_steps - run.step));
      log_line(note);
    }
    interval_start_ns = now_ns();
    interval_samples = interval_steps = interval_section_wait_ns = 0;
  }

  static std::string format_metrics(const std::map<std::string, double>& m, size_t max_items) {
    std::string s;
    size_t shown = 0;
    auto add = [&](const std::string& k, double v) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s %.4g", k.c_str(), v);
      s += buf;
      ++shown;
    };
    if (m.count("loss")) add("loss", m.at("loss"));
    for (const auto& [k, v] : m) {
      // A metric equal to the loss (nll when nothing else is added) would only repeat it.
      const bool repeats_loss = m.count("loss") && k == "nll" && v == m.at("loss");
      if (k != "loss" && !repeats_loss && shown < max_items && k.find('/') == std::string::npos)
        add(k, v);
    }
    // Per-head accuracies ("acc/<head>") shown as their mean and minimum.
    double sum = 0, lo = INFINITY;
    int heads = 0;
    for (const auto& [k, v] : m)
      if (k.starts_with("acc/")) sum += v, lo = std::min(lo, v), ++heads;
    if (heads) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " acc %.3f (min %.3f)", sum / heads, lo);
      s += buf;
    }
    if (m.count("baseline/loss")) add("baseline", m.at("baseline/loss"));
    return s;
  }

  // After each step: divergence, metrics row, progress line, validation, early stopping, the
  // stages' step_end (checkpoints) and the step limit. Rows come before the checkpoint of the
  // same step, so a kill in between costs at most rows that the resumed run writes again.
  // On a terminal, between train rows: a bar with the step, rate, elapsed and remaining time (as
  // tqdm shows them) and the latest loss, rewritten in place at most 10 times a second.
  void progress_line() {
    const uint64_t t = now_ns();
    if (t - last_progress_ns < 100'000'000) return;
    last_progress_ns = t;
    const double elapsed = static_cast<double>(t - start_ns) * 1e-9;
    const double rate = elapsed > 0 ? static_cast<double>(steps_this_process) / elapsed : 0;
    std::string s = "\r\033[Kstep " + std::to_string(run.step);
    if (run.total_steps) {
      const double f = static_cast<double>(run.step) / static_cast<double>(run.total_steps);
      char pct[16];
      std::snprintf(pct, sizeof pct, " %3.0f%%", 100 * std::min(1.0, f));
      s += "/" + std::to_string(run.total_steps) + pct + " |" + bar_text(f, 20) + "|";
    }
    if (run.micro_batches_per_step > 1)
      s += " batch " + std::to_string(micro_in_step) + "/" +
           std::to_string(run.micro_batches_per_step);
    char r[48];
    std::snprintf(r, sizeof r, " %.2f steps/s", rate);
    s += r;
    s += " " + clock_text(elapsed);
    if (run.total_steps > run.step && rate > 0)
      s += "<" + clock_text(static_cast<double>(run.total_steps - run.step) / rate);
    const double l = last_loss.load();
    if (std::isfinite(l)) {
      char b[32];
      std::snprintf(b, sizeof b, " loss %.4g", l);
      s += b;
    }
    *log << s << std::flush;
  }

  // Under gradient accumulation only every micro_batches_per_step-th batch completes a step; the
  // batches before it count their samples and waits, and any non-finite value among them marks
  // the step.
  // `data_wait_ns`: how long the section waited for the batch (from the end of its work on the
  // one before).
  void after_step(const Batch& b, uint64_t data_wait_ns) {
    samples += b.samples;
    interval_samples += b.samples;
    interval_section_wait_ns += data_wait_ns;
    step_section_wait_ns += data_wait_ns;
    section_wait_total_ns += data_wait_ns;
    if (++micro_in_step < run.micro_batches_per_step) {
      if (tty) progress_line();
      return;
    }
    micro_in_step = 0;
    run.step++;
    steps_this_process++;
    interval_steps++;
    if (opt.on_step) opt.on_step(run.step, step_section_wait_ns);
    step_section_wait_ns = 0;
    if (step_nonfinite) {
      if (run.nonfinite_streak++ == 0) streak_first_step = run.step;
    } else {
      run.nonfinite_streak = 0;
    }
    step_nonfinite = false;
    const auto max_bad = static_cast<uint64_t>(plan().run.integer("max_nonfinite_steps"));
    if (max_bad > 0 && run.nonfinite_streak >= max_bad) {
      std::string why = "training diverged: the loss (or gradient) was not finite for " +
                        std::to_string(run.nonfinite_streak.load()) + " consecutive steps (" +
                        std::to_string(streak_first_step) + " to " + std::to_string(run.step) +
                        "); no checkpoint was written since step " +
                        std::to_string(streak_first_step - 1) +
                        ". Lower the learning rate, or set run.max_nonfinite_steps=0 to go on";
      write_train_row();
      end_reason = "diverged";
      throw std::runtime_error(why);
    }
    int64_t log_every = plan().run.integer("log_every");
    int64_t steps_limit = plan().run.integer("steps");
    bool last = steps_limit > 0 && run.step >= static_cast<uint64_t>(steps_limit);
    if (run.step % static_cast<uint64_t>(log_every) == 0 || last) {
      write_train_row();
    } else if (tty) {
      progress_line();
    }
    int64_t every = plan().run.integer("validate_every");
    if (every > 0 && run.step % static_cast<uint64_t>(every) == 0) validation_pass(b.index);
    for (size_t k = plan().section_begin; k < n(); ++k)
      if (graph->stage(k).step_end_reads_device(run.step)) {
        gather_spread_state();
        break;
      }
    for (size_t k = plan().section_begin; k < n(); ++k)
      timed(k, b.index, [&] { graph->stage(k).step_end(b, graph->context(k)); });
    if (last) {
      run.stop_requested = true;
      if (end_reason.empty()) end_reason = "steps";
    }
  }

  // ZeRO-1 (engine/optimizer_shard.h): the optimizer's state, spread over the ranks, comes
  // whole to rank 0 where a checkpoint may follow. Every rank calls this at the same points:
  // before the step ends of a step some stage reads the device at (the checkpoint steps), in
  // each validation pass, and at the end of a run that was not interrupted.
  void gather_spread_state() {
    OptimizerShard* shard = run.optimizer_shard.get();
    if (!shard || !shard->gather_state || shard->gathered_step == run.step) return;
    shard->gather_state();
    shard->gathered_step = run.step;
  }

  // A validation pass at run.step: its row, the stages' validation_end (best checkpoints), early
  // stopping.
  void validation_pass(uint64_t batch_index) {
    auto v = validate();
    last_validation = v;
    last_validated_step = run.step;
    write_metrics_row("validation", v, -1, -1);
    log_line("validation @ step " + std::to_string(run.step) + ":" + format_metrics(v, 6));
    gather_spread_state();
    for (size_t k = 0; k < n(); ++k)
      timed(k, batch_index, [&] { graph->stage(k).validation_end(v, graph->context(k)); });
    int64_t patience = plan().run.integer("early_stop_patience");
    auto it = v.find("loss");
    if (it == v.end()) return;
    last_validation_loss = it->second;
    if (it->second < best_validation) {
      best_validation = it->second;
      best_validation_loss = it->second;
      validations_without_improvement = 0;
    } else if (patience > 0 && ++validations_without_improvement >= patience) {
      log_line("early stop: validation loss has not improved for " + std::to_string(patience) +
               " validations");
      early_stopped = true;
      run.stop_requested = true;
    }
  }

  // ---- stats record ----
  void publish(stats::RunState state) {
    if (!record) return;
    uint64_t t = now_ns();
    double dt = prev_pub_ns ? static_cast<double>(t - prev_pub_ns) * 1e-9 : 0;
    if (dt > 0) {
      double sr = static_cast<double>(run.step - prev_pub_step) / dt;
      double xr = static_cast<double>(samples.load() - prev_pub_samples) / dt;
      steps_rate = steps_rate == 0 ? sr : 0.7 * steps_rate + 0.3 * sr;
      samples_rate = samples_rate == 0 ? xr : 0.7 * samples_rate + 0.3 * xr;
    }
    prev_pub_step = run.step;
    prev_pub_samples = samples.load();
    const uint64_t waited = section_wait_total_ns.load();
    if (dt > 0 && run.step > 0) {
      const double w = std::min(1.0, static_cast<double>(waited - prev_pub_wait_ns) * 1e-9 / dt);
      wait_frac = std::isnan(wait_frac) ? w : 0.7 * wait_frac + 0.3 * w;
    }
    prev_pub_wait_ns = waited;
    const uint64_t rss = resident_bytes();
    double elapsed = static_cast<double>(t - start_ns);
    int hw = static_cast<int>(std::thread::hardware_concurrency());
    record->update([&](stats::RunRecord& r) {
      r.state = state;
      r.update_unix_ns = unix_ns();
      r.step = run.step;
      r.total_steps = run.total_steps;
      r.samples = samples.load();
      r.loss = last_loss.load();
      r.steps_per_s = steps_rate;
      r.samples_per_s = samples_rate;
      if (step_graphs) {
        const StepGraphs::Counts g = step_graphs->counts();
        r.graph_batches = g.replayed + g.captured + g.issued + g.uncaptured;
        r.graph_replayed = g.replayed;
      }
      r.eta_s = (run.total_steps && steps_rate > 0)
                    ? static_cast<double>(run.total_steps - std::min(run.total_steps, run.step)) /
                          steps_rate
                    : -1;
      r.num_stages = static_cast<uint32_t>(std::min<size_t>(n(), stats::kMaxStages));
      for (size_t k = 0; k < r.num_stages; ++k) {
        auto& c = *counters[k];
        auto& s = r.stages[k];
        const auto& ps = plan().stages[k];
        int slots = ps.concurrency == 0 ? hw : ps.concurrency;
        uint64_t busy = c.busy_ns.load(), blocked = c.blocked_ns.load(), items = c.items_out.load();
        s.items_in = c.items_in.load();
        s.items_out = items;
        s.busy_ns = busy;
        s.blocked_output_ns = blocked;
        double capacity = elapsed * slots;
        s.wait_input_ns =
            static_cast<uint64_t>(std::max(0.0, capacity - static_cast<double>(busy + blocked)));
        uint64_t q = c.enqueued.load() - std::min(c.enqueued.load(), c.started.load());
        s.queue_depth = static_cast<uint32_t>(q);
        s.queue_capacity = static_cast<uint32_t>(plan().run.integer("max_in_flight"));
        s.concurrency = static_cast<uint32_t>(slots);
        s.flags = (ps.schema->stage_role() == StageRole::source ? stats::kStageSource : 0) |
                  (ps.schema->is_trainable() ? stats::kStageTrainable : 0) |
                  (ps.schema->stage_role() == StageRole::loss ? stats::kStageLoss : 0) |
                  (run.device.is_cuda() && ps.in_section ? stats::kStageDevice : 0);
        if (dt > 0) {
          double window = dt * 1e9 * slots;
          double db = static_cast<double>(busy - c.prev_busy),
                 dbl = static_cast<double>(blocked - c.prev_blocked);
          uint64_t di = items - c.prev_items;
          // Smoothed like the run's rates: over one publish interval a stage's count is a whole
          // number of batches, which would make its rate jump between multiples of 1/dt.
          const double rate = static_cast<double>(di) / dt;
          s.items_per_s_recent = c.prev_rate_set ? 0.7 * s.items_per_s_recent + 0.3 * rate : rate;
          c.prev_rate_set = true;
          s.busy_frac_recent = std::min(1.0, db / window);
          s.blocked_output_frac_recent = std::min(1.0, dbl / window);
          s.wait_input_frac_recent =
              std::max(0.0, 1.0 - s.busy_frac_recent - s.blocked_output_frac_recent);
          s.mean_latency_ms_recent =
              di ? db * 1e-6 / static_cast<double>(di) : s.mean_latency_ms_recent;
        }
        c.prev_busy = busy;
        c.prev_blocked = blocked;
        c.prev_items = items;
      }
      r.data_wait_frac_recent = wait_frac;
      r.host_rss_bytes = rss;
      r.validation_loss = last_validation_loss.load();
      r.best_validation_loss = best_validation_loss.load();
      auto pools = Pools::all();
      r.device_reserved_bytes = 0;
      for (auto* pool : pools)
        if (!pool->name().starts_with("host"))
          r.device_reserved_bytes += pool->stats().reserved_bytes;
      r.num_pools = static_cast<uint32_t>(std::min<size_t>(pools.size(), stats::kMaxPools));
      for (size_t i = 0; i < r.num_pools; ++i) {
        PoolStats ps = pools[i]->stats();
        auto& p = r.pools[i];
        copy_name(p.name, sizeof p.name, pools[i]->name());
        p.in_use_bytes = ps.in_use_bytes;
        p.reserved_bytes = ps.reserved_bytes;
        p.peak_bytes = ps.peak_bytes;
        p.allocations = ps.allocations;
        p.failures = ps.failures;
      }
    });
    prev_pub_ns = t;
  }

  void start_publisher() {
    if (opt.publish_stats) {
      try {
        record = std::make_unique<stats::RecordWriter>();
      } catch (const std::exception& e) {
        log_line(std::string("warning: no stats record for slipstream-smi: ") + e.what());
      }
    }
    if (record) {
      record->update([&](stats::RunRecord& r) {
        copy_name(r.run_name, sizeof r.run_name, plan().run.string("name"));
        copy_name(r.preset, sizeof r.preset, plan().config.preset);
        copy_name(r.device, sizeof r.device, run.device.str());
        copy_name(r.run_dir, sizeof r.run_dir, run.run_dir);
        r.start_unix_ns = start_unix;
        r.loss = NAN;
        r.eta_s = -1;
        for (size_t k = 0; k < std::min<size_t>(n(), stats::kMaxStages); ++k) {
          copy_name(r.stages[k].name, sizeof r.stages[k].name, plan().stages[k].name);
          copy_name(r.stages[k].kind, sizeof r.stages[k].kind, plan().stages[k].schema->kind());
        }
      });
    }
    auto interval = std::chrono::milliseconds(plan().run.integer("stats_interval_ms"));
    const int64_t stop_timeout_s = plan().run.integer("stop_timeout_s");
    publisher = std::thread([this, interval, stop_timeout_s] {
      std::unique_lock lock(pub_mu);
      std::optional<std::chrono::steady_clock::time_point> signalled;
      while (!pub_cv.wait_for(lock, interval, [this] { return pub_stop; })) {
        if (opt.handle_sigint && StopSignals::received() != 0) {
          run.interrupted = true;
          run.stop_requested = true;
          if (!signalled) signalled = std::chrono::steady_clock::now();
          if (stop_timeout_s > 0 &&
              std::chrono::steady_clock::now() - *signalled > std::chrono::seconds(stop_timeout_s))
            exit_stuck_after_signal(stop_timeout_s);
        }
        publish(stats::RunState::running);
      }
    });
  }

  // A stop signal was not followed by the end of the step within run.stop_timeout_s: the step is
  // stuck (a library spinning on a failed allocation, a hung collective). Its checkpoint would
  // never come; the process ends now, saying which checkpoint stays the newest.
  [[noreturn]] void exit_stuck_after_signal(int64_t seconds) {
    const int sig = StopSignals::received();
    std::string newest;
    if (!run.run_dir.empty())
      if (auto c = latest_checkpoint(run.run_dir)) newest = *c;
    const std::string line =
        "error: " + signal_name(sig) + " was received " + std::to_string(seconds) +
        " s ago and step " + std::to_string(run.step.load() + 1) +
        " has not finished (stuck; run.stop_timeout_s): exiting without a checkpoint of it; " +
        (newest.empty() ? std::string("the run has no checkpoint")
                        : "the newest checkpoint is " + newest) +
        "\n";
    if (console) console->note(line.substr(0, line.size() - 1));
    (void)!::write(STDERR_FILENO, line.data(), line.size());
    std::_Exit(128 + sig);
  }

  void stop_publisher(stats::RunState final_state) {
    {
      std::lock_guard lock(pub_mu);
      pub_stop = true;
    }
    pub_cv.notify_all();
    if (publisher.joinable()) publisher.join();
    publish(final_state);
  }

  // The run directory: a resume's is locked, and written only once the checkpoint has loaded
  // into the planned graph (resume_run_dir); a fresh one is made with its config.yaml.
  void make_run_dir() {
    std::string name = plan().run.string("name");
    if (name.empty()) {
      name = plan().config.preset;
      plan().run.set("name", name, {"<preset>"});
    }
    if (!opt.resume_dir.empty()) {
      run.run_dir = opt.resume_dir;
      if (run.writes_outputs()) dir_lock.emplace(run.run_dir, "resume it");
    } else if (opt.create_run_dir && run.rank == 0) {  // one run directory, written by rank 0
      const fs::path base =
          fs::path(plan().run.string("runs_dir")) / (name + "-" + run_time_stamp());
      run.run_dir = create_fresh_directory(base.string());
      made_run_dir = true;
      dir_lock.emplace(run.run_dir, "start it");
      write_file_atomically((fs::path(run.run_dir) / "config.yaml").string(),
                            resolved_config_yaml(plan()));
    }
  }

  // A resume whose checkpoint loaded: config.yaml says what the run now is (the previous one is
  // kept as config.previous.yaml; run.json has every invocation's command line), and what the
  // run wrote past the checkpoint moves aside.
  void resume_run_dir(const std::string& checkpoint) {
    if (!run.writes_outputs()) return;
    if (update_config_yaml(run.run_dir, resolved_config_yaml(plan())))
      log_line("config.yaml: updated with this resume's settings (was: config.previous.yaml)");
    const SetAside aside = set_aside_past(run.run_dir, run.step);
    if (!aside.dir.empty()) log_line(aside.summary());
    append_run_info(run.run_dir, {opt.command_line, run.device.str(), checkpoint});
  }

  // A fresh run that failed before its first step leaves no directory behind.
  void remove_unstarted_run_dir() {
    if (!made_run_dir || steps_began || run.run_dir.empty()) return;
    console.reset();
    dir_lock.reset();
    std::error_code ec;
    fs::remove_all(run.run_dir, ec);
    if (!ec) *log << "removed " << run.run_dir << ": the run failed before its first step\n";
  }

  RunResult execute();
  RunResult execute_steps();
  EvalResult evaluate(const std::string& checkpoint, const StreamCallback* on_batch,
                      bool streaming);
  // Setup, the checkpoint's section state, validation_begin (and stream_begin); training off.
  CheckpointInfo open_checkpoint(const std::string& checkpoint, bool streaming);
  void begin_stream();
  // The caller-fed stream (stream_open/stream_next): the data stages and their next indexes.
  bool fed = false;
  std::vector<Stage*> fed_stages;
  std::vector<StageContext*> fed_contexts;
  std::vector<uint64_t> fed_next;
};

Runner::Runner(GraphPlan plan, RunOptions options) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.opt = std::move(options);
  LaunchInfo launch = launch_info();
  I.run.rank = I.opt.single_process ? 0 : launch.rank;
  I.run.world_size = I.opt.single_process ? 1 : launch.world_size;
  if (I.opt.log) I.log = I.opt.log;
  // In a multi-process run only rank 0 reports progress; the others would repeat it.
  if (!I.opt.log && launch.rank != 0) I.log = &I.quiet;
  I.tty = I.opt.live_progress.value_or(I.log == &std::cout && isatty(STDOUT_FILENO));
  const Params& rp = plan.run;
  DeviceChoice dc = choose_device(rp.string("device"), launch.local_rank);
  I.run.device = dc.device;
  I.run.precision = rp.string("precision") == "bf16" ? Precision::bf16 : Precision::fp32;
  I.run.seed = static_cast<uint64_t>(rp.integer("seed"));
  I.run.epochs = rp.integer("epochs");
  I.run.max_in_flight = static_cast<uint64_t>(rp.integer("max_in_flight"));
  I.run.total_steps = static_cast<uint64_t>(rp.integer("steps"));
  I.run.metric_sink = [this](std::string_view name, double v, MetricKind kind, double weight) {
    impl_->metric(name, v, kind, weight);
  };
  if (dc.device.is_cuda()) Pools::enable_pinned_host(true);
  I.device_reason = dc.reason;
  // batch_size: auto -> the largest batch that fits (probes of this graph: engine/auto_batch.h).
  if (auto chosen = resolve_auto_batch(plan, dc, I.run.world_size))
    I.device_reason += "\n" + chosen->summary();
  // An allocation that fails names the knob: the graph's batch size.
  for (const auto& [k, p] : batch_size_params(plan)) {
    const PlannedStage& s = plan.stages[k];
    Pools::set_oom_hint("lower " + s.name + "." + p->name + " (now " +
                        std::to_string(s.params.integer(p->name)) + ")" +
                        (dc.device.is_cuda() ? ", or set it to auto" : ""));
  }
  I.run.exec = std::make_shared<ExecContext>(dc.device, dc.emulate_cuda);
  const std::string cuda_graph = rp.string("cuda_graph");
  if (cuda_graph == "on" && !I.run.exec->device_ops())
    throw std::runtime_error(
        "run.cuda_graph: on needs a CUDA device (or device: emulated); this run is on the CPU");
  if (cuda_graph == "on" || (cuda_graph == "auto" && dc.device.is_cuda())) {
    I.step_graphs = std::make_unique<StepGraphs>(*I.run.exec, [&I](int k) {
      const bool known = I.graph && k >= 0 && static_cast<size_t>(k) < I.graph->size();
      return known ? "stage " + I.graph->plan().stages[static_cast<size_t>(k)].name
                   : "stage " + std::to_string(k);
    });
    I.device_reason +=
        "\ncuda graph: on (a training step's work is captured once it recurs, then replayed; "
        "run.cuda_graph=off turns it off)";
  }
  I.graph = std::make_unique<Graph>(std::move(plan), I.run);
  for (size_t k = 0; k < I.graph->size(); ++k)
    I.counters.push_back(std::make_unique<LiveCounters>());
}

Runner::~Runner() = default;
Graph& Runner::graph() {
  return *impl_->graph;
}
RunState& Runner::state() {
  return impl_->run;
}
uint64_t Runner::max_in_flight_seen() const {
  return impl_->max_in_flight_seen.load();
}
void Runner::request_stop(bool as_interrupt) {
  if (as_interrupt) impl_->run.interrupted = true;
  impl_->run.stop_requested = true;
}

Runner::Counters Runner::counters(size_t stage) const {
  const auto& c = *impl_->counters.at(stage);
  Counters out;
  out.items_in = c.items_in.load();
  out.items_out = c.items_out.load();
  out.busy_ns = c.busy_ns.load();
  out.blocked_output_ns = c.blocked_ns.load();
  uint64_t e = c.enqueued.load(), s = c.started.load();
  out.queue_depth = static_cast<uint32_t>(e - std::min(e, s));
  out.max_queue_depth = c.max_queue.load();
  return out;
}

RunResult Runner::run() {
  return impl_->execute();
}

EvalResult Runner::evaluate(const std::string& checkpoint, const StreamCallback& on_batch) {
  return impl_->evaluate(checkpoint, on_batch ? &on_batch : nullptr, false);
}

EvalResult Runner::stream(const std::string& checkpoint, const StreamCallback& on_batch) {
  return impl_->evaluate(checkpoint, &on_batch, true);
}

EvalResult Runner::Impl::evaluate(const std::string& checkpoint, const StreamCallback* on_batch,
                                  bool streaming) {
  std::optional<tbb::global_control> threads;
  if (int64_t t = plan().run.integer("threads"); t > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(t));
  *log << "device: " << device_reason << "\n";
  const CheckpointInfo info = open_checkpoint(checkpoint, streaming);
  const size_t sb = static_cast<size_t>(plan().section_begin);
  std::vector<Stage*> st;
  std::vector<StageContext*> cx;
  for (size_t k = 0; k < sb; ++k) st.push_back(&graph->stage(k)), cx.push_back(&graph->context(k));
  const uint64_t t0 = now_ns();
  Pass pass = forward_pass(st, cx, std::numeric_limits<int64_t>::max(),
                           streaming ? "stream" : "eval", on_batch);
  if (tty) *log << "\r\033[K" << std::flush;
  EvalResult r;
  r.metrics = std::move(pass.metrics);
  r.seconds = static_cast<double>(now_ns() - t0) * 1e-9;
  r.step = info.step;
  r.batches = pass.batches;
  r.samples = pass.samples;
  return r;
}

CheckpointInfo Runner::Impl::open_checkpoint(const std::string& checkpoint, bool streaming) {
  run.run_dir.clear();  // writes nothing: no split lists, no checkpoints, no best copies
  // The data stages serve their validation split: every window, in the validation order.
  const size_t sb = static_cast<size_t>(plan().section_begin);
  for (size_t k = 0; k < sb; ++k) graph->context(k).split_ = StageContext::Split::validation;
  if (streaming) {
    // Every stage the batches go through must say what it does with positions.
    for (size_t k = static_cast<size_t>(plan().head_end); k < n(); ++k) {
      const auto& ps = plan().stages[k];
      if (ps.after_loss || ps.schema->streaming_kind() != Streaming::none) continue;
      throw std::runtime_error("stage '" + ps.name + "' (" + ps.schema->kind() +
                               ") cannot run on a stream of frames: its schema does not say "
                               "whether it mixes positions (StageSchema::streaming)");
    }
    run.streaming = true;
  }
  graph->setup();
  // The data stages' state is a position in the training data; the section's (weights, an
  // optimizer's EMA, a loss's statistics) is the model being scored.
  const CheckpointInfo info = load_checkpoint(graph->plan(), checkpoint, sb);
  run.step = info.step;
  for (size_t k = 0; k < n(); ++k)
    as_stage(k, 0, [&] { graph->stage(k).validation_begin(graph->context(k)); });
  if (streaming) begin_stream();
  run.training = false;
  return info;
}

void Runner::Impl::begin_stream() {
  for (size_t k = 0; k < n(); ++k)
    as_stage(k, 0, [&] { graph->stage(k).stream_begin(graph->context(k)); });
}

Graph& Runner::setup_only() {
  impl_->run.run_dir.clear();
  impl_->graph->setup();
  return *impl_->graph;
}

std::map<std::string, double> Runner::gradient_step(const std::string& checkpoint, Batch& out) {
  auto& I = *impl_;
  I.run.run_dir.clear();
  I.graph->setup();
  if (!checkpoint.empty()) {
    load_weights(I.graph->plan(), checkpoint);
    for (size_t k = 0; k < I.n(); ++k)
      I.as_stage(k, 0, [&] { I.graph->stage(k).parameters_replaced(I.graph->context(k)); });
  }
  const size_t sb = static_cast<size_t>(I.plan().section_begin);
  std::vector<Stage*> st;
  std::vector<StageContext*> cx;
  for (size_t k = 0; k < sb; ++k)
    st.push_back(&I.graph->stage(k)), cx.push_back(&I.graph->context(k));
  std::vector<uint64_t> next(static_cast<size_t>(I.plan().head_end), 0);
  out = I.graph->new_batch();
  if (!I.pull(st, cx, next, next.size() - 1, out, false))
    throw std::runtime_error("the graph's data has no batch");
  {
    std::lock_guard lock(I.metrics_mu);
    I.interval.clear();
  }
  // The section as a training step runs it, minus the update stages after the loss.
  I.forward_one(st, cx, out, true);
  for (size_t k = I.n(); k-- > sb;) {
    const auto& ps = I.plan().stages[k];
    if (ps.after_loss || !ps.schema->is_differentiable()) continue;
    I.backward_stage(k, out);
  }
  std::map<std::string, double> metrics;
  std::lock_guard lock(I.metrics_mu);
  for (auto& [name, v] : I.interval)
    if (v.second > 0) metrics[name] = v.first / v.second;
  return metrics;
}

uint64_t Runner::stream_open(const std::string& checkpoint) {
  auto& I = *impl_;
  if (I.fed) throw std::logic_error("Runner::stream_open: the stream is already open");
  const uint64_t step = I.open_checkpoint(checkpoint, true).step;
  const size_t sb = static_cast<size_t>(I.plan().section_begin);
  for (size_t k = 0; k < sb; ++k) {
    I.fed_stages.push_back(&I.graph->stage(k));
    I.fed_contexts.push_back(&I.graph->context(k));
  }
  I.fed_next.assign(static_cast<size_t>(I.plan().head_end), 0);
  for (size_t k = 0; k < I.fed_next.size(); ++k)
    I.as_stage(k, 0, [&] { I.fed_stages[k]->seek(0, *I.fed_contexts[k]); });
  I.fed = true;
  return step;
}

bool Runner::stream_next(Batch& out) {
  auto& I = *impl_;
  if (!I.fed) throw std::logic_error("Runner::stream_next before stream_open");
  out = I.graph->new_batch();
  if (!I.pull(I.fed_stages, I.fed_contexts, I.fed_next, I.fed_next.size() - 1, out, false))
    return false;
  I.forward_one(I.fed_stages, I.fed_contexts, out, false);
  return true;
}

void Runner::stream_restart() {
  auto& I = *impl_;
  if (!I.fed) throw std::logic_error("Runner::stream_restart before stream_open");
  I.begin_stream();
}

RunResult Runner::Impl::execute() {
  try {
    RunResult r = execute_steps();
    console.reset();
    dir_lock.reset();
    return r;
  } catch (const std::exception& e) {
    // The caller reports the error on the terminal; the run's console.log keeps it too.
    if (console) console->note(std::string("error: ") + e.what());
    remove_unstarted_run_dir();
    console.reset();
    dir_lock.reset();
    throw;
  }
}

RunResult Runner::Impl::execute_steps() {
  RunResult result;
  // Before anything is written: a limit that would hang the run instead of failing it.
  const AddressSpaceCheck address_space = check_address_space_limit();
  if (!address_space.refusal.empty()) throw std::runtime_error(address_space.refusal);
  std::optional<tbb::global_control> threads;
  if (int64_t t = plan().run.integer("threads"); t > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(t));
  make_run_dir();
  result.run_dir = run.run_dir;
  if (run.writes_outputs() && !console)
    console.emplace((fs::path(run.run_dir) / "console.log").string());
  *log << "device: " << device_reason << "\n";
  if (!address_space.note.empty()) log_line(address_space.note);
  if (plan().config.sized_for == "gpu" && !run.device.is_cuda()) {
    log_line("note: '" + plan().config.preset +
             "' is sized for a GPU and runs on the CPU here; the first train row says what its "
             "steps cost (cpu_quick is sized for a CPU)");
    cost_note_pending = true;
  }
  if (run.precision == Precision::bf16 && !run.exec->device_ops()) {
    const std::string what = cpu_bf16_description();
    log_line("note: precision bf16 on the CPU: " +
             (what.empty() ? std::string("the GEMMs' operands are rounded to bf16") : what));
  }
  // Said before setup, which may load a whole dataset.
  std::optional<std::string> ckpt;
  if (!opt.resume_dir.empty()) {
    ckpt = opt.resume_checkpoint.empty() ? latest_checkpoint(opt.resume_dir)
                                         : std::optional(opt.resume_checkpoint);
    if (!ckpt) throw std::runtime_error(opt.resume_dir + ": no complete checkpoint to resume from");
  }
  // Several ranks: how they add up numbers, before the stages' setup (the loader's may need it).
  if (run.world_size > 1) run.reduce_over_ranks = make_rank_reduce();
  graph->setup();
  if (run.world_size > 1 && !run.gradients_averaged_over_ranks) {
    bool trainable = false;
    for (size_t k = 0; k < n() && !trainable; ++k)
      trainable = !graph->stage(k).parameters().empty();
    if (trainable)
      throw std::runtime_error(
          std::to_string(run.world_size) + " ranks, and nothing averages their gradients: each " +
          "rank would train a model of its own. Put an allreduce stage between the loss and the " +
          "optimizer (backend auto, mpi or nccl), or run one process");
  }
  if (run.micro_batches_per_step > 1)
    log_line("gradient accumulation: a step is one optimizer update of " +
             std::to_string(run.micro_batches_per_step) +
             " batches; run.steps, log_every, validate_every and checkpoints count updates" +
             (run.total_steps
                  ? " (" + std::to_string(run.total_steps) + " steps, " +
                        std::to_string(run.total_steps * run.micro_batches_per_step) + " batches)"
                  : std::string()));

  size_t head_end = static_cast<size_t>(plan().head_end);
  head_next.assign(head_end, 0);
  // A warm start: weights only. A resume has its own weights (and the first run's were these).
  if (const std::string from = plan().run.string("init_from"); !from.empty() && !ckpt) {
    const CheckpointPath where = find_checkpoint(from);
    if (!where.error.empty()) throw std::runtime_error("run.init_from: " + where.error);
    const std::string& dir = where.checkpoint;
    uint64_t from_step = 0;
    try {
      from_step = load_weights(graph->plan(), dir);
    } catch (const std::exception& e) {
      throw std::runtime_error("run.init_from: " + std::string(e.what()));
    }
    for (size_t k = 0; k < n(); ++k)
      as_stage(k, 0, [&] { graph->stage(k).parameters_replaced(graph->context(k)); });
    log_line("initialised the weights from " + dir + " (its step " + std::to_string(from_step) +
             "); optimizer state, schedule and step count start fresh");
  }
  if (ckpt) {
    CheckpointInfo info = load_checkpoint(graph->plan(), *ckpt);
    // Each rank's windows and the global batch follow from the number of ranks: another number
    // would continue the run on other data than it was trained on.
    if (info.world_size != run.world_size) {
      auto ranks = [](int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
      throw std::runtime_error(
          *ckpt + ": trained by " + ranks(info.world_size) + ", and this resume has " +
          ranks(run.world_size) +
          "; a resume needs the same number (the global batch and each rank's share of the data "
          "follow from it): resume with " +
          ranks(info.world_size) +
          ", or start a new run from these weights with --set run.init_from=" + *ckpt);
    }
    run.step = info.step;
    // Batches of a step already trained (a stop between an accumulated step's batches).
    const uint64_t k = run.micro_batches_per_step;
    if (info.next_batch < info.step * k || info.next_batch - info.step * k >= k)
      throw std::runtime_error(
          *ckpt + ": step " + std::to_string(info.step) + " at batch " +
          std::to_string(info.next_batch) + " does not fit " + std::to_string(k) +
          " batch(es) per optimizer step: the run was trained with another gradient "
          "accumulation; resume it with the value it had");
    micro_in_step = info.next_batch - info.step * k;
    uint64_t idx = info.next_batch;
    for (size_t k = head_end; k-- > 0;) {
      head_next[k] = idx;
      graph->stage(k).seek(idx, graph->context(k));
      idx = graph->stage(k).upstream_seek_index(idx);
    }
    log_line("resumed from " + *ckpt + " at step " + std::to_string(run.step));
    const auto steps_limit = static_cast<uint64_t>(plan().run.integer("steps"));
    if (steps_limit > 0 && run.step >= steps_limit) {
      log_line("nothing to do: the run already reached run.steps = " + std::to_string(steps_limit) +
               " (raise it with --set run.steps=N to go on)");
      result.final_step = run.step;
      result.already_complete = true;
      return result;
    }
    // Events files are not rewritten: the resumed run starts a new one (below) whose session
    // start has TensorBoard drop the older files' steps past the checkpoint.
    resume_run_dir(*ckpt);
  }
  if (run.writes_outputs()) {
    if (!ckpt) append_run_info(run.run_dir, {opt.command_line, run.device.str(), ""});
    metrics_file.open((fs::path(run.run_dir) / "metrics.jsonl").string());
    if (plan().run.boolean("tensorboard")) {
      events_file.open_in(run.run_dir);
      // Every process's file starts a session, a fresh run's too: TensorBoard's multiplexer
      // takes only a START after the first for a restart.
      if (!events_file.write_session_start(static_cast<int64_t>(run.step.load()) + 1,
                                           static_cast<double>(unix_ns()) * 1e-9))
        throw std::runtime_error(events_file.error());
    }
  }
  for (size_t k = 0; k < n(); ++k) {
    const auto& ps = plan().stages[k];
    try {
      graph->stage(k).start(graph->context(k));
    } catch (const std::exception& e) {
      throw StageError(ps.name, ps.schema->kind(), run.step, e.what());
    }
  }

  steps_began = true;

  // SIGTERM and the others too (engine/stop_signals.h): schedulers send them before killing a
  // job, and the step deserves its checkpoint.
  std::optional<StopSignals> stop_signals;
  if (opt.handle_sigint) stop_signals.emplace();
  start_ns = now_ns();
  start_unix = unix_ns();
  interval_start_ns = start_ns;
  start_publisher();

  std::vector<Stage*> stages;
  std::vector<StageContext*> ctxs;
  for (size_t k = 0; k < n(); ++k)
    stages.push_back(&graph->stage(k)), ctxs.push_back(&graph->context(k));

  tbb::flow::graph g;
  const size_t max_in_flight = static_cast<size_t>(plan().run.integer("max_in_flight"));
  // RunOptions::resident_batches: the batches as they reached the section, kept by its thread.
  std::vector<std::shared_ptr<const Batch>> resident;
  std::atomic<bool> resident_full{false};
  size_t first_after_head = head_end < n() ? head_end : n();
  tbb::flow::input_node<Msg> source(g, [&](tbb::flow_control& fc) -> Msg {
    uint64_t t = now_ns();
    if (head_last_return_ns) counters[head_end - 1]->blocked_ns += t - head_last_return_ns;
    if (run.stop_requested || (opt.handle_sigint && StopSignals::received() != 0)) {
      fc.stop();
      return {};
    }
    if (resident_full.load()) {  // the step alone: a resident batch again, nothing loaded
      auto b = std::make_shared<Batch>(*resident[head_order % resident.size()]);
      if (first_after_head < n()) counters[first_after_head]->enqueued++;
      head_last_return_ns = now_ns();
      return Msg{head_order++, std::move(b), true};
    }
    auto b = std::make_shared<Batch>();
    if (!pull(stages, ctxs, head_next, head_end - 1, *b, true)) {
      fc.stop();
      return {};
    }
    if (first_after_head < n()) counters[first_after_head]->enqueued++;
    head_last_return_ns = now_ns();
    return Msg{head_order++, std::move(b)};
  });
  tbb::flow::limiter_node<Msg> limiter(g, max_in_flight);
  tbb::flow::make_edge(source, limiter);
  // Counts batches the limiter admitted (the source may hold one more, produced and waiting).
  tbb::flow::function_node<Msg, Msg> admit(g, tbb::flow::unlimited, [&](Msg m) -> Msg {
    uint64_t now_in_flight = static_cast<uint64_t>(++in_flight);
    uint64_t seen = max_in_flight_seen.load();
    while (now_in_flight > seen && !max_in_flight_seen.compare_exchange_weak(seen, now_in_flight)) {
    }
    return m;
  });
  tbb::flow::make_edge(limiter, admit);

  // Keep nodes alive for the graph's lifetime.
  std::vector<std::unique_ptr<tbb::flow::graph_node>> nodes;
  tbb::flow::sender<Msg>* prev = &admit;
  auto note_queue = [&](size_t k) {
    auto& c = *counters[k];
    c.started++;
    c.items_in++;
    uint32_t q = static_cast<uint32_t>(c.enqueued.load() -
                                       std::min(c.enqueued.load(), c.started.load()) + 1);
    uint32_t m = c.max_queue.load();
    while (q > m && !c.max_queue.compare_exchange_weak(m, q)) {
    }
  };
  for (size_t k = head_end; k < static_cast<size_t>(plan().section_begin); ++k) {
    int conc = plan().stages[k].concurrency;
    size_t limit =
        conc == 0 ? static_cast<size_t>(tbb::flow::unlimited) : static_cast<size_t>(conc);
    auto node =
        std::make_unique<tbb::flow::function_node<Msg, Msg>>(g, limit, [&, k](Msg m) -> Msg {
          note_queue(k);
          if (!m.resident)
            timed(k, m.batch->index, [&] { stages[k]->forward(*m.batch, *ctxs[k]); });
          counters[k]->items_out++;
          if (k + 1 < n()) counters[k + 1]->enqueued++;
          return m;
        });
    tbb::flow::make_edge(*prev, *node);
    prev = node.get();
    nodes.push_back(std::move(node));
    if (conc != 1) {
      auto seq =
          std::make_unique<tbb::flow::sequencer_node<Msg>>(g, [](const Msg& m) { return m.order; });
      tbb::flow::make_edge(*prev, *seq);
      prev = seq.get();
      nodes.push_back(std::move(seq));
    }
  }
  // The section: serial, in source order.
  auto order_guard =
      std::make_unique<tbb::flow::sequencer_node<Msg>>(g, [](const Msg& m) { return m.order; });
  tbb::flow::make_edge(*prev, *order_guard);
  size_t sb = static_cast<size_t>(plan().section_begin);
  tbb::flow::function_node<Msg, tbb::flow::continue_msg> section_node(
      g, tbb::flow::serial, [&](Msg m) -> tbb::flow::continue_msg {
        if (sb < n()) note_queue(sb);
        for (size_t k = sb + 1; k < n(); ++k) counters[k]->items_in++;  // one batch through all
        const uint64_t t0 = now_ns();
        const uint64_t waited = last_section_end_ns ? t0 - last_section_end_ns : 0;
        if (opt.resident_batches > 0 && !m.resident && resident.size() < opt.resident_batches) {
          resident.push_back(std::make_shared<const Batch>(*m.batch));  // before outputs land
          if (resident.size() == opt.resident_batches) resident_full = true;
        }
        // A stop lets the step in progress finish; batches still queued behind it do not train.
        if (!run.stop_requested) train_batch(m.batch, waited);
        // Waiting for data starts now: validation and checkpoints above are not waits.
        last_section_end_ns = now_ns();
        --in_flight;
        m.batch.reset();  // release tensors before the limiter admits another batch
        return {};
      });
  tbb::flow::make_edge(*order_guard, section_node);
  tbb::flow::make_edge(section_node, limiter.decrementer());

  uint64_t t_start = now_ns();
  std::exception_ptr failure;
  try {
    source.activate();
    g.wait_for_all();
    if (pending) finish_pending();  // the batch the host ran ahead with (a stop, the data's end)
  } catch (...) {
    failure = std::current_exception();
    g.cancel();
    try {
      g.wait_for_all();
    } catch (...) {
    }
  }
  int stop_signal = opt.handle_sigint ? StopSignals::take() : 0;
  if (stop_signal != 0) run.interrupted = true;
  if (tty) *log << "\n";

  // A run that ends between validations (the step limit, the data) still reports where it
  // ended, before finish() writes the last checkpoint. Not after SIGINT/SIGTERM: that is a
  // request to stop now.
  if (!failure && !run.interrupted && metrics_failure.empty() && steps_this_process > 0 &&
      plan().run.integer("validate_every") > 0 && last_validated_step != run.step) {
    try {
      validation_pass(run.step);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!failure && !run.interrupted) {
    try {
      gather_spread_state();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!failure) {
    for (size_t k = 0; k < n(); ++k) {
      try {
        stages[k]->finish(*ctxs[k]);
      } catch (const std::exception& e) {
        const auto& ps = plan().stages[k];
        failure =
            std::make_exception_ptr(StageError(ps.name, ps.schema->kind(), run.step, e.what()));
        break;
      }
    }
  }
  if (!metrics_failure.empty() && !failure)
    failure = std::make_exception_ptr(std::runtime_error(
        metrics_failure + "; the run stopped at step " + std::to_string(run.step)));
  // The last row says why the run ended.
  if (end_reason.empty()) {
    if (failure)
      end_reason = "error";
    else if (run.interrupted)
      end_reason = stop_signal ? "interrupted (" + signal_name(stop_signal) + ")" : "interrupted";
    else if (early_stopped)
      end_reason = "early stop";
    else
      end_reason = "data end";
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      write_metrics_row("end", {}, -1, -1, {{"reason", end_reason}, {"error", e.what()}});
    }
  } else {
    write_metrics_row("end", {}, -1, -1, {{"reason", end_reason}});
  }
  stop_publisher(failure ? stats::RunState::failed : stats::RunState::done);
  record.reset();  // the run is over: its record goes away (slipstream-smi shows live runs)
  stop_signals.reset();
  if (failure) std::rethrow_exception(failure);

  result.steps = steps_this_process;
  result.steps_ended_ahead = steps_ended_ahead;
  if (step_graphs) {
    const StepGraphs::Counts c = step_graphs->counts();
    result.cuda_graph = true;
    result.graph_steps = {c.replayed, c.captured, c.issued, c.uncaptured};
    result.graph_off_reason = step_graphs->off_reason();
    result.graph_difference = step_graphs->difference();
  }
  result.final_step = run.step;
  result.samples = samples.load();
  result.interrupted = run.interrupted.load();
  result.stop_signal = stop_signal;
  result.end_reason = end_reason;
  result.early_stopped = early_stopped;
  result.seconds = static_cast<double>(now_ns() - t_start) * 1e-9;
  result.last_train_metrics = last_train;
  result.last_validation_metrics = last_validation;
  char summary[160];
  std::snprintf(summary, sizeof summary, ": %llu steps, %llu samples in %.3g s",
                static_cast<unsigned long long>(result.final_step),
                static_cast<unsigned long long>(result.samples), result.seconds);
  if (result.cuda_graph) log_line(graph_steps_summary(result));
  // Every rank says how it ended (the progress lines are rank 0's alone).
  std::ostream& out = log == &quiet ? std::cout : *log;
  out << ((result.interrupted ? "interrupted" + (stop_signal && stop_signal != SIGINT
                                                     ? " (" + signal_name(stop_signal) + ")"
                                                     : std::string())
           : early_stopped    ? std::string("stopped early")
                              : std::string("done")) +
          summary + (run.run_dir.empty() ? std::string() : " -> " + run.run_dir))
      << "\n"
      << std::flush;
  return result;
}

std::string graph_steps_summary(const RunResult& r) {
  if (!r.cuda_graph) return "";
  const auto& g = r.graph_steps;
  const uint64_t all = g.replayed + g.captured + g.issued + g.uncaptured;
  std::string s = "cuda graph: " + std::to_string(g.replayed) + " of " + std::to_string(all) +
                  " training batches replayed (" + std::to_string(g.captured) + " captured, " +
                  std::to_string(g.issued) + " issued op by op, " + std::to_string(g.uncaptured) +
                  " uncaptured)";
  if (!r.graph_off_reason.empty())
    s += "; " + r.graph_off_reason;
  else if (2 * g.replayed < all && !r.graph_difference.empty())
    s += "; steps seen for the first time differ first at " + r.graph_difference;
  return s;
}

}  // namespace slipstream
