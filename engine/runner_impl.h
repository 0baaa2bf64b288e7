// Runner::Impl: the state of one run and the pieces of the runner, shared by its files:
//   runner.cpp          construction, the run's steps (execute_steps) and their flow graph
//   runner_section.cpp  the trainable section: a batch's forward, backward and update, a step
//   runner_metrics.cpp  the metrics book: train and validation rows, the console's lines
//   runner_stats.cpp    the stats record slipstream-smi reads, and the stop watchdog
//   runner_run_dir.cpp  the run directory: fresh or resumed, locked, removed when setup fails
//   runner_passes.cpp   forward-only passes: validation, evaluate, stream
// Private to the engine: nothing outside engine/runner*.cpp includes it.
#pragma once

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
#include "engine/atomic_max.h"
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
#include "engine/runner.h"
#include "engine/stats_record.h"
#include "engine/step_graphs.h"
#include "engine/stop_signals.h"
#include "engine/tensorboard/event_writer.h"

namespace slipstream {

namespace runner_detail {

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
inline uint64_t unix_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// "850 ms", "12.5 s", "14 min", "3.2 h": how long something takes, for a person.
inline std::string duration_text(double seconds) {
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
inline std::string clock_text(double seconds) {
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
inline std::string bar_text(double fraction, int width) {
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
  // Bodies running now and the sum of their start times: busy_ns counts an item when it ends, so
  // a stage whose item takes longer than the publish interval would read idle, then busy.
  // The two are updated apart: a reader between them may count a body whose start has left the
  // sum (its figure then exceeds every body's time so far) or the other way round (too low);
  // open_ns takes the first for no figure, the second as it is, for that one reading.
  std::atomic<uint64_t> open_items{0}, open_since_sum{0};
  void enter(uint64_t t0) {
    open_since_sum += t0;
    open_items++;
  }
  void leave(uint64_t t0) {
    open_items--;
    open_since_sum -= t0;
  }
  // Time the running bodies have spent so far, at `now`; 0 when the reading is inconsistent
  // (more than `limit`, the run's time so far, for each body).
  uint64_t open_ns(uint64_t now, uint64_t limit) const {
    const uint64_t n = open_items.load(), sum = open_since_sum.load();
    if (n == 0 || n * now <= sum) return 0;
    const uint64_t open = n * now - sum;
    return open <= n * limit ? open : 0;
  }
  // Publisher's previous sample, for the *_recent rates (prev_busy with the running bodies'
  // time, prev_done without).
  uint64_t prev_items = 0, prev_busy = 0, prev_done = 0, prev_blocked = 0;
  bool prev_rate_set = false;  // items_per_s_recent holds a smoothed rate
};

// A stage body running from t0 until the scope ends (null: not counted).
struct OpenBody {
  LiveCounters* c;
  uint64_t t0;
  OpenBody(LiveCounters* counters, uint64_t start) : c(counters), t0(start) {
    if (c) c->enter(t0);
  }
  ~OpenBody() {
    if (c) c->leave(t0);
  }
  OpenBody(const OpenBody&) = delete;
  OpenBody& operator=(const OpenBody&) = delete;
};

struct Msg {
  uint64_t order = 0;  // 0, 1, 2, ... in source order: what sequencers sort by
  std::shared_ptr<Batch> batch;
  bool resident = false;  // a resident batch again (RunOptions::resident_batches): no data stage
};

inline void copy_name(char* dst, size_t n, const std::string& src) {
  size_t len = std::min(n - 1, src.size());
  std::memcpy(dst, src.data(), len);
  dst[len] = '\0';
}

// The process's resident memory (/proc/self/statm), 0 when unknown.
inline uint64_t resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace runner_detail

struct Runner::Impl {
  using LiveCounters = runner_detail::LiveCounters;
  using Msg = runner_detail::Msg;

  RunOptions opt;
  RunState run;
  std::unique_ptr<Graph> graph;
  std::vector<std::unique_ptr<LiveCounters>> counters;
  std::ostream* log = &std::cout;
  std::ostream quiet{nullptr};  // discards (non-zero ranks)
  std::mutex log_mu;            // log_line's, from any thread
  bool tty = false;
  std::string device_reason;                // printed when the run starts
  std::unique_ptr<StepGraphs> step_graphs;  // run.cuda_graph on
  bool graph_off_reported = false;
  uint64_t stream_frames = 0;  // a stream's batches recorded so far (step_graphs' step numbers)
  std::optional<ConsoleTee> console;      // the run directory's console.log, during run()
  std::optional<DirectoryLock> dir_lock;  // the run directory's one writer, during run()
  // The run directory made again at its place after it moved away mid-run, locked too: the
  // moved one keeps its lock (the run's console.log and events file still write there).
  std::vector<std::unique_ptr<DirectoryLock>> relocks;
  // The stop signals' handlers while the run sets up (a fresh run's directory goes with them).
  std::optional<StartupSignals> startup_signals;
  bool made_run_dir = false;             // this run created run.run_dir (a fresh run)
  std::atomic<bool> steps_began{false};  // setup passed and the steps' graph started
  bool data_ended_before = false;        // a resumed run whose data had ended: nothing done

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
  // For the stats record (the publisher's thread reads them).
  std::atomic<uint64_t> section_wait_total_ns{0};
  std::atomic<double> last_validation_loss{NAN}, best_validation_loss{NAN};
  uint64_t prev_pub_wait_ns = 0;
  double wait_frac = NAN;
  bool early_stopped = false;
  std::string end_reason;  // why the run ended, for the last metrics row
  uint64_t last_validated_step = 0;
  uint64_t stages_gathered_step = UINT64_MAX;  // gather_spread_state's, once a step

  // Stats publishing.
  std::unique_ptr<stats::RecordWriter> record;
  std::thread publisher;
  std::mutex pub_mu;
  std::condition_variable pub_cv;
  bool pub_stop = false;
  // The steps are over and the run's end (its last validation and checkpoint) is under way: the
  // record says `finishing` until done or failed.
  std::atomic<bool> finishing{false};
  uint64_t start_ns = 0, start_unix = 0;
  std::atomic<uint64_t> samples{0};
  std::atomic<double> last_loss{NAN};   // the last completed step's loss (its last batch's)
  std::atomic<double> batch_loss{NAN};  // the latest training batch's, as reported
  double steps_rate = 0, samples_rate = 0;
  bool rates_measured = false;  // steps_rate and samples_rate hold a measurement
  // The step a resume starts from, by its checkpoint's name, known before setup (smi's step
  // while the run starts).
  std::atomic<uint64_t> resume_step{0};
  uint64_t prev_pub_ns = 0, prev_pub_step = 0, prev_pub_samples = 0;
  uint64_t steps_this_process = 0;
  uint64_t steps_ended_ahead = 0;  // RunResult::steps_ended_ahead

  GraphPlan& plan() { return graph->plan(); }
  const GraphPlan& plan() const { return graph->plan(); }
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
    } catch (...) {
      const auto& ps = plan().stages[k];
      throw StageError(ps.name, ps.schema->kind(), batch_index, what_of_current_exception());
    }
  }
  // Stage k starts a batch: its queue's depth (batches handed to it, not yet started) counts
  // toward the deepest seen.
  void note_queue(size_t k) {
    auto& c = *counters[k];
    c.started++;
    c.items_in++;
    const uint64_t enqueued = c.enqueued.load(), started = c.started.load();
    raise_to(c.max_queue, static_cast<uint32_t>(enqueued - std::min(enqueued, started) + 1));
  }
  template <class Fn>
  void timed(size_t k, uint64_t batch_index, Fn&& fn) {
    const uint64_t t0 = runner_detail::now_ns();
    {
      const runner_detail::OpenBody open(counters[k].get(), t0);
      as_stage(k, batch_index, fn);
    }
    counters[k]->busy_ns += runner_detail::now_ns() - t0;
  }

  // Pulls one batch out of head stage k (source or rebatcher), recursively.
  bool pull(std::vector<Stage*>& stages, std::vector<StageContext*>& ctxs,
            std::vector<uint64_t>& next, size_t k, Batch& out, bool count);

  void metric(std::string_view name, double value, MetricKind kind, double weight);

  // Each stage's parameters (stable after setup), for the gradient announcements.
  std::vector<std::vector<Parameter*>> stage_params;

  // Stage k's backward for batch b, then (when a stage listens, e.g. allreduce) the announcement
  // that its parameters' gradients are final.
  void backward_stage(size_t k, Batch& b);

  // ---- the trainable section for one batch ----
  // The section's stages read the batch only after what its fence orders (prefetch's copies).
  void enter_section(Batch& b) const {
    if (b.fence && run.exec) b.fence->wait(*run.exec);
  }

  void section(Batch& b);

  // A training batch's section, as a CUDA graph when run.cuda_graph is on (engine/step_graphs.h):
  // the stages' work recorded, then replayed, captured or issued.
  void training_section(Batch& b);
  // The recorded work of a step (or a stream's frame) replayed, captured or issued.
  void finish_recorded(capture::StepRecorder& rec, uint64_t step, uint64_t batch = 0);

  void section_stages(Batch& b);

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

  void train_batch(std::shared_ptr<Batch> b, uint64_t data_wait_ns);

  // The host runs ahead on a device backend (CUDA, and the emulator, so CI runs this path).
  bool run_ahead() const { return run.exec && run.exec->device_ops(); }

  // Whether the step the pending batch completes may end after the next batch is enqueued.
  bool may_run_past();

  void finish_pending();

  // The host's wait for a batch on a device: what the stages asked to read back (the loss's
  // sums, the optimizer's outcome) arrives, and their reports run — after the batch's whole
  // work is enqueued, so the device never idles while the host issues the rest of a step.
  // `group`: the batch's read-backs (0: everything asked so far).
  void complete_read_backs(const Batch& b, uint64_t group = 0);

  void ensure_eval_copies();

  // A run of several ranks (run.reduce_over_ranks set): every rank's (value × weight, weight) sums
  // and `extra` numbers added up into every rank's copy. The ranks that measured something hold
  // the same metric names; a rank that measured nothing (no validation games of its own) takes
  // them from the others. `what` names the reduction in a timeout.
  void sum_over_ranks(std::map<std::string, std::pair<double, double>>& sums,
                      std::span<double> extra, const std::string& what);

  std::map<std::string, double> validate();

  // A pulled batch through the data transforms of `st` and the section's forward up to the loss
  // (`with_loss`: through it too, never past it). Returns the nanoseconds the section's stages
  // before the loss took: the model's answer, without scoring it. `answer` (Runner::stream_next)
  // runs after those stages, as the last of them.
  uint64_t forward_one(std::vector<Stage*>& st, std::vector<StageContext*>& cx, Batch& b,
                       bool with_loss, const StreamAnswer& answer = {});

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
                    uint64_t first = 0, uint64_t stride = 1);

  void log_line(const std::string& s, bool every_rank = false);

  void write_metrics_row(const char* split, const std::map<std::string, double>& values, double sps,
                         double wait_pct, const nlohmann::json& extra = nlohmann::json::object());

  // Training on without a record of it would lose the run's history silently: stop the way
  // SIGINT does (the step finishes, stages save) and fail at the end.
  void record_failure(const std::string& why);

  // A row's numbers as TensorBoard scalars tagged "<split>/<key>" (train/loss, validation/loss).
  // A value the row holds as null (NaN, Inf) goes as itself: TensorBoard plots those.
  static std::vector<tensorboard::Scalar> row_scalars(const std::string& split,
                                                      const nlohmann::json& row,
                                                      const std::map<std::string, double>& values);

  // The train row for the steps since the last one; `steps_averaged` says how many (a resumed
  // run's first window, the last window and a diverged run's may be shorter than log_every).
  // With several ranks, the figures of the global batch: every rank's sums added up (samples/s
  // too; the data wait is this rank's).
  void write_train_row();

  std::string format_metrics(const std::map<std::string, double>& m, size_t max_items) const;

  // After each step: divergence, metrics row, progress line, validation, early stopping, the
  // stages' step_end (checkpoints) and the step limit. Rows come before the checkpoint of the
  // same step, so a kill in between costs at most rows that the resumed run writes again.
  // On a terminal, between train rows: a bar with the step, rate, elapsed and remaining time (as
  // tqdm shows them) and the latest loss, rewritten in place at most 10 times a second.
  void progress_line();

  // Under gradient accumulation only every micro_batches_per_step-th batch completes a step; the
  // batches before it count their samples and waits, and any non-finite value among them marks
  // the step.
  // `data_wait_ns`: how long the section waited for the batch (from the end of its work on the
  // one before).
  void after_step(const Batch& b, uint64_t data_wait_ns);

  // ZeRO-1 (engine/optimizer_shard.h): the optimizer's state, spread over the ranks, comes
  // whole to rank 0 where a checkpoint may follow. Every rank calls this at the same points:
  // before the step ends of a step some stage reads the device at (the checkpoint steps), in
  // each validation pass, and at the end of a run that was not interrupted.
  // `stages`: the stages' gather_state too (not at a run's end, where what each rank has seen
  // may differ: a failure of one rank's own).
  void gather_spread_state(bool stages = true);

  // A validation pass at run.step: its row, the stages' validation_end (best checkpoints), early
  // stopping.
  void validation_pass(uint64_t batch_index);

  // ---- stats record ----
  void publish(stats::RunState state);

  void start_publisher();

  // A stop signal was not followed by the end of the step within run.stop_timeout_s: the step is
  // stuck (a library spinning on a failed allocation, a hung collective). Its checkpoint would
  // never come; the process ends now, saying which checkpoint stays the newest.
  [[noreturn]] void exit_stuck_after_signal(int64_t seconds);

  void stop_publisher(stats::RunState final_state);

  // The run directory: a resume's is locked, and written only once the checkpoint has loaded
  // into the planned graph (resume_run_dir); a fresh one is made with its config.yaml.
  void make_run_dir();

  // A resume whose checkpoint loaded: config.yaml says what the run now is (the previous one is
  // kept as config.previous.yaml; run.json has every invocation's command line), and what the
  // run wrote past the checkpoint moves aside.
  void resume_run_dir(const std::string& checkpoint);

  // A fresh run that failed before its first step leaves no directory behind.
  void remove_unstarted_run_dir(const std::string& why = "failed");

  // The run directory moved or removed while the run trains is made again at its place (by the
  // next metrics row or checkpoint): the lock is taken there too, so a resume of it is refused
  // while this run writes. Checked after every step (a stat and an fstat).
  void keep_run_dir_locked();

  RunResult execute();
  RunResult execute_steps();
  bool start_steps(RunResult& result);
  bool resume_from(const std::string& checkpoint);
  void warm_start();
  void check_ranks_run_one_graph();
  std::exception_ptr run_flow_graph(std::vector<Stage*>& stages, std::vector<StageContext*>& ctxs);
  std::exception_ptr end_steps(std::exception_ptr failure, int stop_signal,
                               std::vector<Stage*>& stages, std::vector<StageContext*>& ctxs);
  void fill_result(RunResult& result, int stop_signal, uint64_t t_start);
  OperationTimes operation_times();  // RunOptions::time_operations_after_batches
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

}  // namespace slipstream
