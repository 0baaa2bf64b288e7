// The stage contract: what a stage implements and what the runner gives it.
//
//   class MyStage : public slipstream::Stage {
//    public:
//     static slipstream::StageSchema schema();     // ports, params, traits
//     void setup(slipstream::StageContext& ctx) override;
//     void forward(slipstream::Batch& b, slipstream::StageContext& ctx) override;
//   };
//   SLIPSTREAM_REGISTER_STAGE(MyStage);
#pragma once

#include <cxxabi.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/exec_context.h"
#include "engine/optimizer_shard.h"
#include "engine/param_arena.h"
#include "engine/params.h"
#include "engine/schema.h"
#include "engine/tensor.h"

namespace slipstream {

// The error of a stage body that threw something other than a std::exception (an int, a
// string): caught and reported with the stage's name like any error, never std::terminate.
inline constexpr const char* kNotAStdException =
    "threw an exception that is not a std::exception (throw std::runtime_error or another "
    "std::exception, whose message says what went wrong)";
// Inside a catch (...): what the exception being handled says (kNotAStdException when it is no
// std::exception); a cancelled thread's unwinding (abi::__forced_unwind) goes on through.
inline std::string what_of_current_exception() {
  try {
    throw;
  } catch (const abi::__forced_unwind&) {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return kNotAStdException;
  }
}

// What the trainable section must wait for before it reads a batch's tensors: copies a stage
// enqueued on a stream of its own (the prefetch stage's copy stream). The runner calls wait()
// on the section's thread before the section's first stage runs on the batch, in training,
// validation and streaming alike. The fence lives as long as the batch; its destructor is the
// place to mark, on the compute stream, that the section is done with the batch's memory.
class BatchFence {
 public:
  virtual ~BatchFence() = default;
  // Orders the context's compute stream after the batch's copies (on the device, no host wait).
  virtual void wait(const ExecContext& exec) = 0;
};

// One unit flowing through the graph. Tensors live in slots that the graph assigns to each
// (stage, output port) and to the gradient of each; stages reach them through StageContext.
struct Batch {
  // Position in the head's output (the last rebatch stage's, else the source's), consecutive
  // from 0: the resume point.
  uint64_t index = 0;
  uint64_t epoch = 0;
  uint64_t samples = 0;  // examples in the batch, for throughput
  std::vector<Tensor> slots;
  std::shared_ptr<BatchFence> fence;  // set by a stage that copies asynchronously; else null
};

// A trainable weight: FP32 master value and gradient; under bf16 precision the optimizer also
// keeps `low_precision`, the bf16 copy that feeds the GEMMs.
struct Parameter {
  std::string name;  // local to the stage, e.g. "layers.0.mixer.in_proj.weight"
  Tensor value;
  Tensor grad;
  Tensor low_precision;
  bool weight_decay = true;  // false for norms, biases, A_log, D, ...
};

enum class Precision { fp32, bf16 };

// How a metric's values over a logging window become its row: the mean (losses, accuracies),
// weighted by what each value was measured over, or the latest value (a learning rate is the
// value at that step).
enum class MetricKind { mean, last };

// How RunState::reduce_over_ranks combines the ranks' values.
enum class RankReduce { sum, min, max };

// Run-wide state every stage can read; owned by the runner.
struct RunState {
  Device device;
  // Where ops are issued (stream, cuBLASLt) on `device`; set by the runner (a CPU context on
  // the CPU). Null only for a stage run alone (a harness without one).
  std::shared_ptr<ExecContext> exec;
  // The run's model weights in one block (engine/param_arena.h): model stages' stores register
  // in setup; Graph::setup packs it after the last trainable stage. Null: each store keeps its
  // own buffers (a stage run alone).
  std::shared_ptr<ParamArena> param_arena;
  Precision precision = Precision::fp32;
  // run.bf16_copies: under bf16, stages write the bf16 copies the next stages read
  // (StageContext::output_bf16_copy_wanted).
  bool bf16_copies = true;
  uint64_t seed = 1;
  bool training = true;  // false during validation passes
  // Runner::stream: batches are consecutive pieces of one sequence; recurrent stages continue
  // from the state the previous batch left (schema Streaming::recurrent).
  bool streaming = false;
  // Set by a source in setup when row r of a batch may continue row r of the batch before (its
  // `continues` output says which rows do: the Melee loader's `rows: streams`). A sequence stage
  // with that input connected then carries each row's state across batches; stages are set up
  // after the source, so they read it in their setup.
  bool rows_continue = false;
  // Optimizer steps completed; read by the stats thread. A step is `micro_batches_per_step`
  // batches through the trainable section (1 without gradient accumulation).
  std::atomic<uint64_t> step{0};
  std::atomic<uint64_t> total_steps{0};  // optimizer steps the run will take; 0 when unknown
  uint64_t micro_batches_per_step = 1;   // from the plan (StageSchema::micro_batches())
  // Batches the source will produce in all (StageContext::declare_source_batches; 0 when
  // unbounded or unknown). Without run.steps, total_steps follows from it through the rebatch
  // stages.
  uint64_t source_batches = 0;
  int64_t epochs = 1;
  // run.max_in_flight: batches between the source and the last stage at once (0: not set, a
  // stage run alone).
  uint64_t max_in_flight = 0;
  std::string run_dir;  // empty for runs that write nothing (tests, `stage run`)
  int rank = 0;         // this process among world_size (mpirun/srun); see engine/launch.h
  int world_size = 1;
  // Only rank 0 writes checkpoints and metrics, and only into a run directory it still holds.
  bool writes_outputs() const { return rank == 0 && !run_dir.empty() && !run_dir_lost; }
  // The run directory, made again after it was moved away mid-run, was taken by another
  // process first: this run writes nothing more there.
  std::atomic<bool> run_dir_lost{false};
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> interrupted{false};  // a stop signal, or request_stop(true)
  // Consecutive training steps whose loss (or gradient) was not finite, up to the last step;
  // a checkpoint stage does not save such a step.
  std::atomic<uint64_t> nonfinite_streak{0};
  // Early stopping's books (run.early_stop_patience), kept by the runner's validation passes and
  // saved in every checkpoint, so a resume counts on where the run was: the lowest validation
  // loss so far (infinite before the first) and the validations since it last improved.
  double best_validation_loss = INFINITY;
  int64_t validations_without_improvement = 0;
  // The fields below are the runner's; stages reach them through StageContext (metric(), log(),
  // gradients_ready(), and the declare_* calls of their role).
  // Receives StageContext::metric() calls: name, value, kind, weight (set by the runner;
  // thread-safe).
  std::function<void(std::string_view, double, MetricKind, double)> metric_sink;
  // Receives StageContext::log() lines: stage name, line, whether every rank says it (set by
  // the runner: rank 0's console and console.log; the other ranks only what every rank says).
  std::function<void(const std::string&, const std::string&, bool)> log_sink;
  // Hear StageContext::gradients_ready() announcements during a training batch's backward pass,
  // keyed by the listening stage's position (StageContext::on_gradients_ready).
  std::map<int, std::function<void(std::span<Parameter* const>)>> gradient_listeners;
  // Reduces values over every rank of the run in place: installed by Runner::run before any
  // stage's setup when several ranks run and the build can (engine/rank_reduce.h: MPI); empty
  // otherwise, and in evaluate, stream and gradient_step. `what` names the reduction in a timeout.
  std::function<void(std::span<double>, RankReduce, const std::string& what)> reduce_over_ranks;
  // StageContext::declare_gradients_averaged: a stage averages the gradients over the ranks.
  bool gradients_averaged_over_ranks = false;
  // StageContext::declare_validation_per_rank: each rank validates its own first batches.
  bool validation_per_rank = false;
  // StageContext::share_optimizer_state: the optimizer's state split over the ranks
  // (engine/optimizer_shard.h); null otherwise.
  std::shared_ptr<OptimizerShard> optimizer_shard;
};

class StateWriter;
class StateReader;
class StageContext;
struct GraphPlan;

class Stage {
 public:
  virtual ~Stage() = default;

  // After validation; input shapes (ctx.input_shape) and the device are known. Allocate weights
  // and workspaces here, and declare output shapes for the stages downstream.
  virtual void setup(StageContext& ctx) { (void)ctx; }

  // role source: fill `out` with the next batch; false when the stream has ended.
  virtual bool produce(Batch& out, StageContext& ctx);
  // Head stages (source, rebatch): position at output batch `next_index` — on a resume, and at
  // 0 before each validation, eval or stream pass (and per batch in a multi-rank validation).
  // The default accepts 0, and anything for a rebatch stage; a source refuses other values.
  virtual void seek(uint64_t next_index, StageContext& ctx);
  // role rebatch: fill `out`, pulling as many upstream batches as needed with `pull_upstream`.
  virtual bool rebatch(Batch& out, const std::function<bool(Batch&)>& pull_upstream,
                       StageContext& ctx);

  // transform / loss / update: read inputs from the batch, add outputs.
  virtual void forward(Batch& batch, StageContext& ctx) {
    (void)batch;
    (void)ctx;
  }
  // Differentiable stages: read the gradients of the outputs, write those of the inputs and
  // accumulate into parameters' gradients. A loss stage's backward seeds the pass.
  virtual void backward(Batch& batch, StageContext& ctx) {
    (void)batch;
    (void)ctx;
  }
  // Trainable stages: stable pointers to the stage's weights.
  virtual std::vector<Parameter*> parameters() { return {}; }

  // Floating-point operations of one batch at the shapes known at setup (a multiply-add counts
  // 2), for `slipstream summary`: forward and backward per batch through the section, update
  // per optimizer step. Zero where a stage does no arithmetic worth counting (or its batch shape
  // is only known per batch).
  struct Cost {
    double forward_flops = 0, backward_flops = 0, update_flops = 0;
  };
  virtual Cost cost() const { return {}; }

  // Stateful stages: everything needed for a bit-exact resume.
  virtual void save(StateWriter& w) const { (void)w; }
  virtual void load(StateReader& r) { (void)r; }
  // Several ranks, stages of the trainable section: called on every rank at the same points,
  // where rank 0 may save next — before the step ends of a checkpoint step and in each
  // validation pass (the run's last checkpoint, at its end, has what the last of these gathered
  // and rank 0's own since); once a step. A stage whose state is a sum
  // over the ranks (each counting its own share of the data) brings it together here
  // (ctx.run().reduce_over_ranks), so rank 0 saves the run's, not its own.
  virtual void gather_state(StageContext& ctx) { (void)ctx; }

  // In Runner::run only: once, after setup and (when resuming) after every stage's state was
  // loaded, before the first batch; `ctx.run().step` is the step the run starts from. Not
  // called by evaluate, stream or gradient_step, nor on the validation copies of data stages.
  virtual void start(StageContext& ctx) { (void)ctx; }
  // Stages of the trainable section (and the update stages after it), after each training step,
  // once that step's metrics row and validation pass (if any) were written: `ctx.run().step`
  // already counts the step. Checkpoints are written here, so a checkpoint never precedes the
  // rows a resume from it would skip.
  virtual void step_end(const Batch& batch, StageContext& ctx) {
    (void)batch;
    (void)ctx;
  }
  // On a device the host runs one batch ahead: step_end of step S may come after the next
  // batch's work was enqueued (the runner, "a training batch, the host one batch ahead").
  // A stage whose step_end at S reads what the device computed — weights, optimizer state —
  // says so here, and the runner ends step S before it enqueues more (the checkpoint stage, on
  // the steps it writes). Asked before each step ends; the default: step_end reads nothing.
  virtual bool step_end_reads_device(uint64_t step) const {
    (void)step;
    return false;
  }

  // In Runner::run only: once, after the last batch, or after a stop request once the step in
  // progress ended (batches queued behind it are dropped untrained). Not called when the run
  // failed; a finish() that throws skips the later stages'. Not on validation copies.
  virtual void finish(StageContext& ctx) { (void)ctx; }

  // Around each validation pass of a training run (e.g. an optimizer swaps in its EMA weights, a
  // checkpoint stage keeps the best): validation_begin before its first batch, validation_end
  // (below) after its last, with the pass's averages ("loss", ...) in `metrics`; both on the
  // training graph's stages, while the batches come from the data stages' validation copies.
  // evaluate and stream (eval, infer, the policy) call validation_begin once and no
  // validation_end: the process scores the weights as a validation would and ends.
  virtual void validation_begin(StageContext& ctx) { (void)ctx; }
  // Parameters were replaced from outside after setup (run.init_from): copies derived from them
  // (an optimizer's EMA, bf16 shadows) start again from the new values.
  virtual void parameters_replaced(StageContext& ctx) { (void)ctx; }
  // A stream starts (Runner::stream): a recurrent stage sets its carried state to the start of
  // a sequence (what its forward starts every window from).
  virtual void stream_begin(StageContext& ctx) { (void)ctx; }
  // Row `row` of the stream's batches starts a new sequence (one game of many, restarted); the
  // other rows carry on. A recurrent stage sets that row's state as stream_begin sets all.
  virtual void stream_reset_row(int64_t row, StageContext& ctx) {
    (void)row;
    (void)ctx;
  }
  virtual void validation_end(const std::map<std::string, double>& metrics, StageContext& ctx) {
    (void)metrics;
    (void)ctx;
  }
  // role rebatch: the upstream batch index to seek to so that this stage's next output is
  // batch `next_index` (resume). Default: one upstream batch per output batch.
  virtual uint64_t upstream_seek_index(uint64_t next_index) const { return next_index; }
  // role rebatch: how many batches this stage emits from `upstream_batches` (for the run's
  // step count). Default: one per upstream batch.
  virtual uint64_t batches_out(uint64_t upstream_batches) const { return upstream_batches; }
};

// What the runner gives a stage: its identity and parameters, its ports' slots, the run state,
// and the stages upstream of it (for reducers and optimizers).
class StageContext {
 public:
  const std::string& name() const { return name_; }
  const StageSchema& schema() const { return *schema_; }
  const Params& params() const { return params_; }
  RunState& run() const { return *run_; }
  const Device& device() const { return run_->device; }
  // The execution context of the run's device (a CPU one when the run has none).
  const ExecContext& exec() const;
  int concurrency() const { return concurrency_; }

  // ---- setup time ----
  // Shape/dtype the upstream stage declared for the tensor bound to this input port.
  bool input_connected(std::string_view port) const;
  const Shape& input_shape(std::string_view port) const;
  DType input_dtype(std::string_view port) const;
  void declare_output(std::string_view port, const Shape& shape, DType dtype);
  const Shape& output_shape(std::string_view port) const;
  // Whether a stage this output feeds reads its bf16 copy (StageSchema::reads_bf16_copy) and the
  // run is in bf16 with run.bf16_copies: the producer may then write one beside it
  // (set_output_bf16_copy).
  bool output_bf16_copy_wanted(std::string_view port) const;
  // Parameter of another stage in the graph (e.g. the batch size of the batcher upstream).
  const Params* stage_params(std::string_view stage_name) const;

  // ---- per batch ----
  const Tensor& input(const Batch& b, std::string_view port) const;
  bool has_input(const Batch& b, std::string_view port) const;
  void set_output(Batch& b, std::string_view port, Tensor t) const;
  const Tensor& output(const Batch& b, std::string_view port) const;
  // The bf16 copy of output `port` (u16 storage, its shape): every element rounded as
  // kernels::fp32_to_bf16 rounds it (nearest-even, NaN kept and quietened, denormals to zero), so
  // that a reader gets the bits of its own cast. Only where output_bf16_copy_wanted(port).
  void set_output_bf16_copy(Batch& b, std::string_view port, Tensor t) const;
  // The bf16 copy of the tensor bound to input `port` (declared reads_bf16_copy), where its
  // producer wrote one for this batch, checked to match the tensor; null otherwise (the stage
  // rounds the tensor itself).
  const Tensor* input_bf16_copy(const Batch& b, std::string_view port) const;
  // Passthrough stages: every tensor slot they act on (the outputs of the stages before).
  std::vector<Tensor*> passthrough_tensors(Batch& b) const;
  // Gradient of the loss with respect to this stage's output (undefined when nothing
  // downstream produced one).
  const Tensor& output_grad(const Batch& b, std::string_view port) const;
  // Sets (or, when another consumer already set one, adds to) the gradient of an input.
  void add_input_grad(Batch& b, std::string_view port, const Tensor& grad) const;
  // Records a scalar for this step's metrics ("loss", "accuracy/<head>", ...): the runner prefixes
  // nothing; names should be unique across stages. A train row holds the mean over its steps,
  // or with MetricKind::last the value at its last step. `weight` is what the value is a mean
  // over (e.g. the batch's valid positions): rows and validation passes average values weighted
  // by it, so a padded last batch counts for what it holds, and a whole pass's figure equals
  // the figure over all its positions at once.
  void metric(std::string_view name, double value, MetricKind kind = MetricKind::mean,
              double weight = 1) const;
  // A line for the run's console and console.log, "<stage>: <line>": printed once, by rank 0,
  // or with `every_rank` by each rank (what differs between ranks: each one's share of the
  // data). A stage run alone, without a runner, writes it to stderr. What a stage has to say
  // goes here, never to std::cerr, so a multi-rank run says it once and a probe run
  // (batch_size: auto) not at all.
  void log(const std::string& line, bool every_rank = false) const;

  // Backward: these parameters' gradients are final for the batch (nothing later in the pass
  // adds to them). The runner announces each stage's parameters after its backward; a stage with
  // layers may announce each layer's as it finishes, so a reducer can start sending them while
  // the rest of the pass computes.
  void gradients_ready(std::span<Parameter* const> params) const;
  // Setup: `listener` hears every announcement of the training batches' backward passes
  // (replacing this stage's earlier listener).
  void on_gradients_ready(std::function<void(std::span<Parameter* const>)> listener) const;
  // Whether any stage listens: a model need not announce its layers one by one otherwise.
  bool gradients_heard() const;

  // ---- what a stage tells the run in setup, by its role (a call from another role throws) ----
  // role source: the batches it will produce in all (0: unbounded or unknown); without
  // run.steps the run's length follows from it through the rebatch stages.
  void declare_source_batches(uint64_t batches) const;
  // role source: its validation split is this rank's own share of the data, not one set every
  // rank holds; the runner then validates each rank's own first batches.
  void declare_validation_per_rank() const;
  // role update: this stage averages the gradients over the ranks. Without one, a run of
  // several ranks would train as many different models, and the runner refuses it.
  void declare_gradients_averaged() const;
  // role update: the optimizer's state is split over the ranks by `shard` (null: not split).
  void share_optimizer_state(std::shared_ptr<OptimizerShard> shard) const;
  // The split an update stage shared (null when the optimizer holds all of its state): for the
  // optimizer and the checkpoint stage.
  const std::shared_ptr<OptimizerShard>& optimizer_shard() const;

  // Stages upstream of this one in the graph, nearest first; for allreduce/optimizers/checkpoints.
  std::vector<std::pair<std::string, Stage*>> upstream_stages() const;
  // Every trainable parameter upstream, with names prefixed "<stage>.".
  std::vector<std::pair<std::string, Parameter*>> upstream_parameters() const;

  // The whole validated graph (e.g. for a checkpoint stage that saves every stage).
  GraphPlan& graph_plan() const { return *plan_; }

  // Deterministic per-stage seed derived from the run seed and the stage name.
  uint64_t seed() const;
  // Which data a source serves: the runner builds a second copy of the data stages with
  // `validation` for validation passes.
  enum class Split { train, validation };
  Split split() const { return split_; }

 private:
  friend struct GraphPlan;
  friend class Graph;
  friend class Runner;
  friend class StageHarness;
  int slot_of_input(std::string_view port) const;
  int slot_of_output(std::string_view port) const;
  int grad_slot_of_input(std::string_view port) const;
  int grad_slot_of_output(std::string_view port) const;

  std::string name_;
  const StageSchema* schema_ = nullptr;
  Params params_;
  RunState* run_ = nullptr;
  int concurrency_ = 1;
  Split split_ = Split::train;
  int index_ = 0;  // position in the graph's topological order
  GraphPlan* plan_ = nullptr;
  std::vector<int> input_slots_;   // per schema input port; -1 when unconnected
  std::vector<int> output_slots_;  // per schema output port
};

}  // namespace slipstream
