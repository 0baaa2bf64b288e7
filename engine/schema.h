// A stage kind's schema: its ports, parameters and traits. The one description validates YAML,
// prints `slipstream stages KIND`, documents the kind and registers it (see registry.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/dtype.h"

namespace slipstream {

enum class ParamType { boolean, integer, number, string, string_list, integer_list, number_list };
std::string_view param_type_name(ParamType t);

using ParamValue = std::variant<bool, int64_t, double, std::string, std::vector<std::string>,
                                std::vector<int64_t>, std::vector<double>>;
std::string param_value_str(const ParamValue& v);  // YAML flow form: 3, 0.5, "a", [a, b]
struct ParamSpec;
class Params;  // engine/params.h: a stage's resolved parameter values
// What is wrong with `v` for parameter `spec` (its range, choices and check), or "": what
// validation reports, and what a schema's own default is held to when it declares them.
std::string param_value_problem(const ParamSpec& spec, const ParamValue& v);

// What `auto` stands for in a StageSchema::batch_size() parameter until the runner resolves it.
inline constexpr int64_t kAutoBatchSize = -1;

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::integer;
  ParamValue default_value;
  bool required = false;  // no default: the graph or preset must set it
  std::string doc;
  std::optional<double> min, max;  // for numbers, and for every element of numeric lists
  std::vector<std::string> choices;
  bool is_path = false;        // names files: see StageSchema::path()
  bool must_exist = false;     // ... that exist at validation (globs excepted)
  bool micro_batches = false;  // batches per optimizer step: see StageSchema::micro_batches()
  bool batch_size = false;     // samples per batch, may be `auto`: see StageSchema::batch_size()
  // A word accepted for an integer parameter, and the value it stands for ("all" = no limit).
  std::optional<std::pair<std::string, int64_t>> keyword;
  // A stage's own check of a value at validation: the problem, or "" (see StageSchema::check).
  std::function<std::string(const ParamValue&)> check;
  // What a resolved configuration (a run's config.yaml, a checkpoint's graph) that lacks the
  // parameter meant: it was written before the parameter existed (StageSchema::in_older_runs).
  std::optional<ParamValue> older_runs_value;
};

struct PortSpec {
  std::string name;
  std::optional<DType> dtype;  // nullopt: any
  int rank = -1;               // -1: any
  std::string doc;
  bool optional = false;
  // An input whose stage reads the tensor's bf16 copy when its producer writes one
  // (StageSchema::reads_bf16_copy).
  bool reads_bf16_copy = false;
};

// How the runner drives a stage:
//   source     produces batches (the head of the graph);
//   rebatch    pulls from the source before it and emits a different number of batches
//              (batching, shuffling); runs inside the head, pulled on demand;
//   transform  one batch in, the same batch out (concurrency > 1 allowed when stateless);
//   loss       a transform that starts the backward pass;
//   update     runs once per batch after the backward pass (allreduce, optimizer, checkpoint).
enum class StageRole { source, rebatch, transform, loss, update };

// How a stage's forward can run on a stream of batches (Runner::stream: a sequence cut into
// batches of a few positions, one after another, e.g. one frame at a time for a bot):
//   none          unknown, or it mixes positions without carrying state: a stream refuses it
//   per_position  each position's output depends on that position alone (embeddings, heads)
//   recurrent     causal over positions; with RunState::streaming its forward continues the
//                 sequence from the state the previous batch left (reset by stream_begin)
enum class Streaming { none, per_position, recurrent };
std::string_view stage_role_name(StageRole r);

class Stage;
using StageFactory = Stage* (*)();

class StageSchema {
 public:
  explicit StageSchema(std::string kind) : kind_(std::move(kind)) {}

  StageSchema& doc(std::string text);
  StageSchema& family(std::string name);
  StageSchema& role(StageRole r);
  // Stages with weights; they also implement backward() and parameters().
  StageSchema& trainable();
  // Stateless stages on the gradient path that implement backward() without weights.
  StageSchema& differentiable();
  // Stages without ports of their own that act on every tensor of the batch (prefetch,
  // batcher): consumers bind through them to the tensors of the stages before.
  StageSchema& passthrough();
  // Worker slots for a transform before the trainable section; 0 = as many as TBB has.
  StageSchema& concurrency(int n);
  // What the stage's forward does on a stream of batches (Streaming above).
  StageSchema& streaming(Streaming s);
  StageSchema& input(std::string name, std::optional<DType> dtype, int rank, std::string doc);
  StageSchema& optional_input(std::string name, std::optional<DType> dtype, int rank,
                              std::string doc);
  StageSchema& output(std::string name, std::optional<DType> dtype, int rank, std::string doc);
  // The input declared last is read through its bf16 copy where the producer writes one
  // (StageContext::input_bf16_copy; under run.precision bf16): the stage's bf16 GEMMs then read
  // it without a cast launch of their own. Its producer learns of it from
  // StageContext::output_bf16_copy_wanted; a producer that writes none leaves the stage to round
  // the tensor itself.
  StageSchema& reads_bf16_copy();
  // The type follows the default's C++ type (int → integer, double → number, ...).
  StageSchema& param(std::string name, ParamValue default_value, std::string doc);
  StageSchema& required_param(std::string name, ParamType type, std::string doc);
  // Constraints on the most recently declared parameter.
  StageSchema& range(std::optional<double> min, std::optional<double> max);
  StageSchema& choices(std::vector<std::string> allowed);
  // The most recently declared parameter is newer than some runs, whose resolved configurations
  // (config.yaml, a checkpoint's graph) lack it: those get `value` (what they did then), not the
  // default, so they resume and load as they were trained.
  StageSchema& in_older_runs(ParamValue value);
  // The most recently declared (string or string list) parameter names files or folders: at
  // validation `~/` expands to $HOME and relative paths resolve against the working directory,
  // so a run directory's config.yaml repeats the run from anywhere. With `must_exist`, a name
  // (not a glob) that does not exist is a validation error.
  StageSchema& path(bool must_exist = false);
  // The most recently declared (integer) parameter is the number of batches that make one
  // optimizer step (gradient accumulation). The runner then counts steps as updates: run.steps,
  // log_every, validate_every and checkpoints are in optimizer steps, and each step trains on
  // that many batches. Stages that declare one must agree on the value.
  StageSchema& micro_batches();
  // The most recently declared (integer) parameter is the number of samples in a batch, and also
  // accepts `auto` (kAutoBatchSize): before the run is built, resolve_auto_batch replaces it by
  // the largest batch that fits the device's memory (engine/auto_batch.h). One per graph.
  StageSchema& batch_size();
  // The most recently declared (integer) parameter also accepts `word`, meaning `value` (e.g.
  // validate_batches: all).
  StageSchema& keyword(std::string word, int64_t value);
  // A check of the most recently declared parameter's value that ranges and choices cannot
  // express (e.g. names resolved against a table): returns the problem ("parameter 'x': ...")
  // or "". Runs at validation, so `slipstream validate` reports it with the value's mark; a
  // path parameter's check sees the resolved (absolute) paths, after must_exist's.
  StageSchema& check(std::function<std::string(const ParamValue&)> fn);
  // A rule between several of the stage's parameters that no one value's check can express
  // (rows: streams needs stride = window): returns the problem and the parameter whose mark it
  // shows, or nullopt. Runs at validation on the resolved values, once every value passed its
  // own checks, so `slipstream validate` refuses what setup would.
  struct RuleProblem {
    std::string param;  // the value to change
    std::string why;
  };
  using Rule = std::function<std::optional<RuleProblem>(const Params&)>;
  StageSchema& rule(Rule fn);
  const std::vector<Rule>& rules() const { return rules_; }
  // How the console's train and validation lines show this stage's metrics (metrics.jsonl holds
  // every one whatever they say). By default a line shows "loss", then the metrics whose names
  // hold no '/' (not one equal to the loss). `console_metric` adds one with a '/' under a short
  // label ("reference/loss" as "ref"); `console_family` shows the metrics named "<prefix>..." as
  // one "<label> mean (min lowest)" ("top1/" as "top1 0.91 (min 0.72)").
  StageSchema& console_metric(std::string name, std::string label);
  StageSchema& console_family(std::string prefix, std::string label);

  const std::string& kind() const { return kind_; }
  const std::string& doc_text() const { return doc_; }
  const std::string& family_name() const { return family_; }
  StageRole stage_role() const { return role_; }
  bool is_trainable() const { return trainable_; }
  bool is_differentiable() const {
    return trainable_ || differentiable_ || role_ == StageRole::loss;
  }
  int default_concurrency() const { return concurrency_; }
  bool is_passthrough() const { return passthrough_; }
  // Passthrough stages act on whole batches and never mix positions.
  Streaming streaming_kind() const { return passthrough_ ? Streaming::per_position : streaming_; }
  const std::vector<PortSpec>& inputs() const { return inputs_; }
  const std::vector<PortSpec>& outputs() const { return outputs_; }
  const std::vector<ParamSpec>& params() const { return params_; }
  struct ConsoleMetric {
    std::string name;  // a metric, or with `family` the prefix of several
    std::string label;
    bool family = false;
  };
  const std::vector<ConsoleMetric>& console_metrics() const { return console_; }
  const ParamSpec* find_param(std::string_view name) const;
  const PortSpec* find_input(std::string_view name) const;
  const PortSpec* find_output(std::string_view name) const;

  // Human-readable documentation (used by `slipstream stages KIND`).
  std::string help() const;

  StageFactory factory = nullptr;  // set by registration

 private:
  std::string kind_, doc_, family_;
  StageRole role_ = StageRole::transform;
  bool trainable_ = false, differentiable_ = false, passthrough_ = false;
  int concurrency_ = 1;
  Streaming streaming_ = Streaming::none;
  std::vector<PortSpec> inputs_, outputs_;
  std::vector<ParamSpec> params_;
  std::vector<Rule> rules_;
  std::vector<ConsoleMetric> console_;
};

}  // namespace slipstream
