// Runs a validated graph on a oneTBB flow graph:
//
//   input_node(source + rebatchers, pulled) -> limiter_node(max_in_flight)
//     -> function_node per data transform (concurrency N, + sequencer_node when N != 1)
//     -> sequencer -> function_node(trainable section, serial) -> end -> limiter decrement
//
// The limiter is the backpressure: it admits at most max_in_flight batches between the source
// and the end (two more may be alive: one produced and waiting for admission, one held while the
// host runs a step ahead), so a slow consumer makes the source wait instead of memory growing.
// Sequencers restore source order after parallel stages, so the same seed gives the same batches in
// the same order. The trainable section runs forward (stage order), backward (reverse order, up
// from the loss), then the update stages, for one batch at a time: the forward pass of batch
// k+1 starts only after the update of batch k was issued.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "engine/graph.h"
#include "engine/operation_times.h"

namespace slipstream {

struct RunOptions {
  std::string resume_dir;         // continue this run directory from its latest checkpoint
  std::string resume_checkpoint;  // ... or from this checkpoint of it (later ones set aside)
  bool create_run_dir = true;     // runs/<name>-<time>/ with config.yaml and metrics.jsonl
  bool handle_sigint = true;      // stop signals: finish the step, let stages save, exit 130
  bool publish_stats = true;      // the /dev/shm record read by slipstream-smi
  std::ostream* log = nullptr;    // progress lines (default std::cout)
  // The live progress bar and validation line, rewritten in place: by default only when `log`
  // is a terminal's std::cout.
  std::optional<bool> live_progress;
  std::string command_line;  // recorded in run.json (the CLI passes what was typed)
  // Lines the run prints under its device line: what was decided for it before it was built
  // (resolve_auto_batch's choice).
  std::vector<std::string> notes;
  // Called on the trainable section's thread (the last step's on the thread that called run())
  // after every optimizer step, with the step number
  // and the nanoseconds the section waited for the step's batches (slipstream bench).
  std::function<void(uint64_t step, uint64_t data_wait_ns)> on_step;
  // Benchmarks of the data path (slipstream bench --overlap): once the first N batches have
  // reached the trainable section, the source stops loading and the section trains on those N
  // in turn, as they arrived (on a device: already copied), skipping the data stages. The step
  // without loading or copies; 0 (the default) trains on the data.
  uint32_t resident_batches = 0;
  // Times each operation of the trainable section's CUDA graphs on the device, in the training
  // batches (or a stream's frames) after this process's first N (StepGraphs::time_operations;
  // run.cuda_graph on a CUDA device or the emulator): RunResult::operation_times,
  // EvalResult::operation_times. The host then waits for each batch's graph.
  std::optional<uint64_t> time_operations_after_batches;
  // One process whatever the launcher started (rank 0 of 1, on this rank's device): a probe
  // inside a multi-rank run (engine/auto_batch.h) that must not meet the other ranks.
  bool single_process = false;

  // A runner inside a command or program that writes nothing: no run directory, no stats
  // record, no signal handlers; its lines go to `log` (default std::cout).
  static RunOptions embedded(std::ostream* log = nullptr) {
    RunOptions o;
    o.create_run_dir = false;
    o.publish_stats = false;
    o.handle_sigint = false;
    o.log = log;
    return o;
  }
};

struct RunResult {
  uint64_t steps = 0;       // optimizer steps this process completed (batches / accumulate)
  uint64_t final_step = 0;  // including resumed steps
  uint64_t samples = 0;
  // Steps that ended (read-backs, metrics, step_end) after the next batch's work was enqueued:
  // on a device the host runs one batch ahead between metrics rows, validations and checkpoints.
  uint64_t steps_ended_ahead = 0;
  // run.cuda_graph (engine/step_graphs.h): training batches whose work was a graph replayed, a
  // graph captured (and launched), issued op by op, issued before a synchronous point; and why
  // graph mode turned itself off ("" when it did not, or was never on).
  struct GraphSteps {
    uint64_t replayed = 0, captured = 0, issued = 0, uncaptured = 0;
    uint64_t ops = 0;  // operations in the last batch recorded whole: its graph's size
  } graph_steps;
  bool cuda_graph = false;  // graph mode was on at the start
  std::string graph_off_reason;
  std::string graph_difference;    // StepGraphs::difference()
  OperationTimes operation_times;  // RunOptions::time_operations_after_batches
  bool interrupted =
      false;            // stopped by a stop signal (engine/stop_signals.h) or request_stop(true)
  int stop_signal = 0;  // the signal that stopped the run (SIGINT, SIGTERM, SIGHUP, ...)
  bool early_stopped = false;
  bool already_complete =
      false;               // a resumed run that had already reached run.steps or its data's end
  std::string end_reason;  // "steps", "data end", "early stop", "interrupted (SIGINT)", ...
  double seconds = 0;
  std::string run_dir;
  std::map<std::string, double> last_train_metrics;
  std::map<std::string, double> last_validation_metrics;
};

// "cuda graph: 290 of 300 training batches replayed (...)" for a run whose graph mode was on,
// with why it turned itself off if it did; "" otherwise.
std::string graph_steps_summary(const RunResult& r);

// What Runner::evaluate measured.
struct EvalResult {
  std::map<std::string, double> metrics;  // the pass's means, as a validation row has them
  uint64_t step = 0;                      // the checkpoint's step
  uint64_t batches = 0;
  uint64_t samples = 0;  // examples scored (Batch::samples: padding excluded)
  double seconds = 0;    // the pass alone, without setup
  // A stream with run.cuda_graph on: its batches' work replayed, captured, issued, uncaptured
  // (RunResult::graph_steps), and why graph mode turned itself off.
  RunResult::GraphSteps graph_steps;
  std::string graph_off_reason;
  OperationTimes operation_times;  // a stream's frames: RunOptions::time_operations_after_batches
};

// Runner::evaluate's and Runner::stream's view of each batch after its forward: the batch (every
// stage's outputs) and the seconds the trainable section's stages before the loss took on it.
using StreamCallback = std::function<void(const Batch&, double)>;
// Work on a caller-fed stream's answer (Runner::stream_next): run right after the stages that
// answer, as the last of them.
using StreamAnswer = std::function<void(const Batch&)>;

// Thrown for a failure inside a stage; names the stage, its kind and the batch.
class StageError : public std::runtime_error {
 public:
  StageError(std::string stage, std::string kind, uint64_t batch, const std::string& what);
  const std::string& stage() const { return stage_; }
  uint64_t batch() const { return batch_; }

 private:
  std::string stage_;
  uint64_t batch_;
};

class Runner {
 public:
  Runner(GraphPlan plan, RunOptions options = {});
  ~Runner();
  // Sets up every stage, runs until the source ends, run.steps is reached, early stopping or
  // SIGINT/SIGTERM, then calls finish() on every stage. Throws StageError on the first stage
  // failure on a batch or in start/finish (std::runtime_error for a setup that failed, or a
  // device failure); throws std::runtime_error when the loss stays non-finite for
  // run.max_nonfinite_steps steps (finish() is skipped: no checkpoint of a diverged model) or
  // when metrics.jsonl cannot be written (after finish(): the checkpoint keeps the steps).
  RunResult run();
  // Scores a checkpoint instead of training: every data stage serves its validation split, the
  // checkpoint's section state is loaded (weights, an optimizer's EMA, a loss's statistics; the
  // data stages keep their own), and one validation pass runs over all of the data, as a run's
  // validation would with run.validate_batches: all. Writes nothing: no run directory, no
  // checkpoint, no best copies. Call instead of run(), once; throws StageError as run() does.
  // `on_batch`, when given, sees each batch after its forward.
  EvalResult evaluate(const std::string& checkpoint, const StreamCallback& on_batch = {});
  // evaluate() as a stream: RunState::streaming is set and every stage gets stream_begin, so
  // recurrent stages carry their state from one batch to the next (a data split of windows of
  // one position, in order, is a game played frame by frame). Refuses a graph with a data
  // transform or section stage up to the loss whose schema does not declare Streaming. `on_batch`
  // sees each batch after its forward.
  EvalResult stream(const std::string& checkpoint, const StreamCallback& on_batch);
  // stream() driven by the caller, one batch per call (a policy inside a program, its source
  // fed by that program): stream_open() sets up and loads the checkpoint as stream() does and
  // returns its step; each stream_next() pulls the source's next batch into `out` and runs it
  // through the data transforms and the section's stages before the loss (no loss, no
  // metrics), false when the source has none; stream_restart() starts a new stream
  // (stream_begin on every stage: recurrent state cleared); stream_restart_row(r) restarts the
  // sequence of batch row r alone (Stage::stream_reset_row). Call instead of run()/evaluate().
  // `answer`, when given, runs after the stages before the loss, as the last of them and inside
  // the frame's recorded work: what it enqueues on the run's stream joins the frame's CUDA graph
  // (run.cuda_graph on), and what it asks to read back (ExecContext::read_back_later) has
  // arrived, its reports run, when stream_next returns.
  uint64_t stream_open(const std::string& checkpoint);
  bool stream_next(Batch& out, const StreamAnswer& answer = {});
  void stream_restart();
  void stream_restart_row(int64_t row);

  // One training step's forward and backward on the first training batch, without the stages
  // after the loss (no update): the figures another implementation of the same graph must
  // reproduce (bench/peers). Loads `checkpoint`'s weights first when it is not empty. Returns the
  // step's metrics (as a train row has them); `out` holds every tensor of the batch and each
  // trainable Parameter its gradient. Call instead of run(), once.
  std::map<std::string, double> gradient_step(const std::string& checkpoint, Batch& out);

  // Sets up every stage and does nothing else: no run directory, no batch (`slipstream
  // summary` reads the stages' parameters and costs). Call instead of run(), once.
  Graph& setup_only();

  Graph& graph();
  RunState& state();
  // Live counters of one stage (tests and the stats record).
  struct Counters {
    uint64_t items_in = 0, items_out = 0, busy_ns = 0, wait_input_ns = 0, blocked_output_ns = 0;
    uint32_t queue_depth = 0, max_queue_depth = 0;
  };
  Counters counters(size_t stage) const;
  // Largest number of batches that were between the source and the end at once.
  uint64_t max_in_flight_seen() const;

  // Asks the run to stop as SIGINT would (finish the step in progress, then finish()).
  void request_stop(bool as_interrupt);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slipstream
