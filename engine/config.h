// Graph files and presets: loading, `extends:`, `set:` and `--set` overrides, and the errors
// they produce. Every value remembers the file:line:col it came from.
//
// A graph file:                          A preset:
//   description: ...                       extends: base            # another preset
//   plugins: [build/lib/libmine.so]        graph: configs/train_bc.yaml
//   stages:                                run: {device: auto, seed: 1}
//     - name: core                         set: {core.layers: 2}
//       kind: mamba
//       inputs: [embed]      # or [embed.y] or {x: embed.y}
//       params: {d_model: 128}
//       concurrency: 2       # optional, transforms before the trainable section
//   run: {...}               # optional defaults for the run section
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "engine/params.h"

namespace slipstream {

struct ConfigIssue {
  SourceMark mark;
  std::string message;
  std::string str() const { return mark.str() + ": " + message; }
};

// One or more problems found while loading or validating; what() is one line per problem.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(std::vector<ConfigIssue> issues);
  const std::vector<ConfigIssue>& issues() const { return issues_; }

 private:
  std::vector<ConfigIssue> issues_;
};

struct ConfigValue {
  YAML::Node node;
  SourceMark mark;
};

struct InputRef {
  std::string stage;    // upstream stage name
  std::string port;     // its output port; empty: match by name
  std::string as_port;  // our input port (map form); empty: match by name
  SourceMark mark;
};

struct StageConfig {
  std::string name;
  SourceMark mark;
  std::string kind;
  SourceMark kind_mark;
  std::vector<InputRef> inputs;
  SourceMark inputs_mark;
  std::map<std::string, ConfigValue> params;
  std::optional<ConfigValue> concurrency;
};

struct Config {
  // The preset's name, or the file name when run from a graph file; a resolved file (a run's
  // config.yaml, a checkpoint) keeps the preset its first line names, and its file.
  std::string preset;
  std::string preset_file;  // empty when run from a graph file
  std::string graph_file;
  std::string description;
  // The machine the sizes are meant for ("cpu" or "gpu"; empty when unsaid): a gpu-sized run
  // on a CPU says so at start, and what its steps cost.
  std::string sized_for;
  std::vector<std::pair<std::string, SourceMark>> plugins;  // resolved paths
  // Plugins the graph names that are not there, with why (plan_graph decides: see load_plugins).
  std::vector<std::pair<std::string, SourceMark>> missing_plugins;
  std::vector<StageConfig> stages;
  std::map<std::string, ConfigValue> run;  // run-section values, validated against run_schema()
  // Written by resolved_config_yaml (a run's config.yaml, a checkpoint's graph): a stage
  // parameter it lacks predates it and takes the value older runs had (in_older_runs).
  bool resolved = false;
};

// Where presets are looked for, in order: $SLIPSTREAM_HOME/presets, ./presets, an installed
// slipstream's <prefix>/share/slipstream/presets, the source tree.
std::vector<std::string> preset_search_dirs();

// Loads a preset by name ("cpu_quick") or path (.yaml), or a graph file (a file with `stages:`),
// applies `extends:` chains, `set:` entries and the command-line `overrides` ("a.b=value").
// Throws ConfigError for YAML syntax errors, unknown top-level keys, missing files, bad
// override syntax and overrides naming unknown stages.
Config load_config(const std::string& preset_or_file,
                   const std::vector<std::string>& overrides = {});

// Splits a command-line assignment "key=value" (the value read as YAML, else as a plain string),
// marked "--set key=value" for error messages. `expected` describes the form in the error.
std::pair<std::string, ConfigValue> parse_override(
    const std::string& assignment, const std::string& expected = "stage.param=value");

// Writes a self-contained graph file (stages with every parameter resolved, plus the run
// section) that `slipstream run --config FILE` repeats.
std::string resolved_config_yaml(const Config& c, const std::map<std::string, Params>& stage_params,
                                 const Params& run_params);

}  // namespace slipstream
