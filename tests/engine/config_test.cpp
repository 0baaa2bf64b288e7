// Every class of configuration error is reported as FILE:LINE:COL before anything runs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "engine/graph.h"
#include "engine/safetensors.h"
#include "tests/support/temp_dir.h"

using namespace slipstream;
namespace fs = std::filesystem;
using slipstream::testing::TempDir;

namespace {

const char* kGood = R"(stages:
  - name: src
    kind: test_counter
    params: {count: 6, batch: 4}
  - name: work
    kind: test_sleep
    inputs: [src]
  - name: rec
    kind: test_recorder
    inputs: [work]
)";

// Plans `text` (written as g.yaml) with overrides; returns the error text, or "" when valid.
std::string plan_error(const TempDir& d, const std::string& text,
                       std::vector<std::string> sets = {}) {
  std::string path = d.write("g.yaml", text);
  try {
    plan_graph(load_config(path, sets));
    return "";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    if (msg.starts_with(d.path() + "/")) msg.erase(0, d.path().size() + 1);  // readable asserts
    return msg;
  }
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return s.replace(p, from.size(), to);
}

}  // namespace

TEST(Config, ValidGraphPlans) {
  TempDir d;
  EXPECT_EQ(plan_error(d, kGood), "");
  GraphPlan plan = plan_graph(load_config(d.write("g.yaml", kGood)));
  ASSERT_EQ(plan.stages.size(), 3u);
  EXPECT_EQ(plan.stages[0].name, "src");
  EXPECT_EQ(plan.stages[2].inputs[0].producer, 1);
  EXPECT_EQ(plan.head_end, 1);
  EXPECT_EQ(plan.section_begin, 2);
  EXPECT_EQ(plan.stages[0].params.integer("count"), 6);
  EXPECT_EQ(plan.stages[1].params.integer("sleep_us"), 0);  // default filled in
}

TEST(Config, UnknownKindSuggestsClosest) {
  TempDir d;
  std::string e = plan_error(d, replace(kGood, "kind: test_sleep", "kind: test_sleeep"));
  EXPECT_EQ(e.substr(0, e.find(" (see")),
            "g.yaml:6:11: stage 'work': unknown kind 'test_sleeep'; did you mean 'test_sleep'?");
}

TEST(Config, UnknownParameterSuggestsClosest) {
  TempDir d;
  EXPECT_EQ(
      plan_error(d, replace(kGood, "{count: 6, batch: 4}", "{count: 6, bacth: 4}")),
      "g.yaml:4:24: stage 'src' (test_counter): unknown parameter 'bacth'; did you mean 'batch'?");
}

TEST(Config, MistypedParameter) {
  TempDir d;
  EXPECT_EQ(plan_error(d, replace(kGood, "count: 6", "count: six")),
            "g.yaml:4:14: stage 'src' (test_counter): parameter 'count' expects int, got 'six'");
  EXPECT_EQ(plan_error(d, replace(kGood, "count: 6", "count: 6.5")),
            "g.yaml:4:14: stage 'src' (test_counter): parameter 'count' expects int, got '6.5'");
}

TEST(Config, ValueOutOfRange) {
  TempDir d;
  EXPECT_EQ(plan_error(d, replace(kGood, "batch: 4", "batch: 0")),
            "g.yaml:4:24: stage 'src' (test_counter): parameter 'batch' = 0 is out of range [1, "
            "1000000]");
}

TEST(Config, MissingInputStage) {
  TempDir d;
  EXPECT_EQ(plan_error(d, replace(kGood, "inputs: [work]", "inputs: [wrok]")),
            "g.yaml:10:14: stage 'rec' (test_recorder): input 'wrok' is not a stage of this graph; "
            "did you "
            "mean 'work'?");
}

TEST(Config, CyclicInputs) {
  TempDir d;
  std::string g = replace(kGood, "    inputs: [src]", "    inputs: [src, rec]");
  std::string e = plan_error(d, g);
  EXPECT_NE(e.find("inputs form a cycle"), std::string::npos) << e;
  EXPECT_NE(e.find("rec -> work -> rec"), std::string::npos) << e;
  EXPECT_EQ(e.substr(0, 11), "g.yaml:7:13") << e;
}

TEST(Config, PortDtypeMismatch) {
  TempDir d;
  EXPECT_EQ(plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - {name: sink, kind: test_f32_sink, inputs: [src.x], params: {level: 1}}
)"),
            "g.yaml:3:48: stage 'sink' (test_f32_sink): input 'y' expects f32, rank 1 but src.x is "
            "i32, rank 1");
}

// An input of another name than the output meant for it: the error names the one output whose
// type fits, written as the binding that fixes it.
TEST(Config, AnUnboundInputNamesTheOutputThatFits) {
  TempDir d;
  const std::string e = plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - {name: f, kind: test_to_f32, inputs: [src]}
  - {name: tr, kind: test_trainable, inputs: [src]}
  - {name: g, kind: test_to_f32, inputs: [tr, f]}
)");
  EXPECT_NE(e.find("g.yaml:5:42: stage 'g' (test_to_f32): input 'x' (i32, rank 1) has no "
                   "producer among its inputs (available: tr.z, f.y); inputs bind by name: write "
                   "inputs: {x: tr.z, ...}"),
            std::string::npos)
      << e;
}

// A plugin named relative to a graph given by a relative path is kept by its absolute path: the
// run's config.yaml names it so, and eval, infer and the policy library load it from any folder.
TEST(Config, APluginPathIsKeptAbsolute) {
  TempDir d;
  d.write("sub/libmine.so", "");
  d.write("sub/g.yaml", "plugins: [libmine.so]\n" + std::string(kGood));
  const fs::path before = fs::current_path();
  fs::current_path(d.path());
  Config c;
  try {
    c = load_config("sub/g.yaml");
  } catch (...) {
    fs::current_path(before);
    throw;
  }
  fs::current_path(before);
  ASSERT_EQ(c.plugins.size(), 1u);
  EXPECT_EQ(c.plugins[0].first, d.path() + "/sub/libmine.so");
}

// An empty value (`kind:`) is named at its key: yaml-cpp places an empty value at the next token,
// lines below past any comment.
TEST(Config, AnEmptyValueIsNamedAtItsKey) {
  TempDir d;
  EXPECT_EQ(plan_error(d, R"(stages:
  - name: src
    kind:
    # the counter
    params: {count: 2}
)"),
            "g.yaml:3:5: kind must be a string");
  EXPECT_EQ(plan_error(d, R"(stages:
  - name: src
    kind: test_counter
    params:

  - {name: rec, kind: test_recorder, inputs: [src]}
)"),
            "g.yaml:4:5: params must be a mapping");
  EXPECT_EQ(plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - name: rec
    kind: test_recorder
    inputs:
run: {seed: 1}
)"),
            "g.yaml:5:5: inputs must be a list of stage names or a map port: stage.port");
  EXPECT_EQ(plan_error(d, R"(run:
stages:
  - {name: src, kind: test_counter}
)"),
            "g.yaml:1:1: run must be a mapping");
}

// One mistake, one line: a reference to an output that is not there names the closest output,
// not also its input's lack of a producer; a quote left open, which takes the lines after it as
// the value, is said to be that, not quoted whole.
TEST(Config, AMistakeIsOneLineThatNamesIt) {
  TempDir d;
  EXPECT_EQ(plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - {name: sink, kind: test_f32_sink, inputs: {y: src.xx}, params: {level: 1}}
)"),
            "g.yaml:3:51: stage 'sink' (test_f32_sink): stage 'src' has no output 'xx'; did you "
            "mean 'x'?");
  EXPECT_EQ(plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - name: rec
    kind: "test_recorder
    inputs: [src]
)"),
            "g.yaml:4:11: stage 'rec': its kind 'test_recorder ...' runs over several words or "
            "lines: a quote left open?");
}

TEST(Config, MissingRequiredParameterAndProducer) {
  TempDir d;
  EXPECT_EQ(plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - {name: sink, kind: test_f32_sink, inputs: [src, src], params: {level: 1}}
)"),
            "g.yaml:3:47: stage 'sink' (test_f32_sink): input 'y' (f32, rank 1) has no producer "
            "among its inputs (available: src.x, src.x); inputs bind by name: write inputs: {y: "
            "stage.port, ...}");
  std::string e = plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - {name: sink, kind: test_f32_sink, inputs: {y: src.x}}
)");
  EXPECT_NE(e.find("g.yaml:3:5: stage 'sink' (test_f32_sink): missing required parameter 'level' "
                   "(int: any int)"),
            std::string::npos)
      << e;
}

TEST(Config, YamlSyntaxError) {
  TempDir d;
  std::string e = plan_error(d, "stages:\n  - {name: src, kind: [unclosed\n");
  EXPECT_EQ(e.substr(0, 14), "g.yaml:3:1: YA") << e;
}

TEST(Config, UnknownTopLevelAndStageKeys) {
  TempDir d;
  EXPECT_EQ(plan_error(d, std::string("stagse: []\n")),
            "g.yaml:1:1: top level: unknown key 'stagse'; did you mean 'stages'?");
  EXPECT_EQ(plan_error(d, replace(kGood, "    params:", "    parmas:")),
            "g.yaml:4:5: stage: unknown key 'parmas'; did you mean 'params'?");
}

TEST(Config, DuplicateStageName) {
  TempDir d;
  EXPECT_EQ(plan_error(d, replace(kGood, "name: rec", "name: work")),
            "g.yaml:8:11: duplicate stage name 'work'");
}

TEST(Config, RunSectionValidated) {
  TempDir d;
  EXPECT_EQ(plan_error(d, std::string(kGood) + "run: {precison: bf16}\n"),
            "g.yaml:11:7: run: unknown parameter 'precison'; did you mean 'precision'?");
  EXPECT_EQ(
      plan_error(d, std::string(kGood) + "run: {precision: fp16}\n"),
      "g.yaml:11:7: run: parameter 'precision' = 'fp16' is not one of {fp32, bf16}; did you mean "
      "'fp32'?");
  // A run's name is a folder name: a path would put its directory outside runs_dir.
  for (const char* name : {"../escape", "/tmp/elsewhere", ".."})
    EXPECT_NE(plan_error(d, kGood, {std::string("run.name=") + name})
                  .find("parameter 'name' = '" + std::string(name) + "' is not a folder name"),
              std::string::npos)
        << name;
  EXPECT_EQ(plan_error(d, kGood, {"run.name=my-run_2"}), "");
}

TEST(Config, CommandLineOverrides) {
  TempDir d;
  EXPECT_EQ(plan_error(d, kGood, {"src.count=7"}), "");
  GraphPlan p = plan_graph(load_config(d.write("g.yaml", kGood), {"src.count=7", "run.seed=9"}));
  EXPECT_EQ(p.stages[0].params.integer("count"), 7);
  EXPECT_EQ(p.stages[0].params.mark("count").file, "--set src.count=7");
  EXPECT_EQ(p.run.integer("seed"), 9);
  EXPECT_EQ(
      plan_error(d, kGood, {"srcc.count=7"}),
      "--set srcc.count=7: override 'srcc.count': no stage named 'srcc'; did you mean 'src'?");
  EXPECT_EQ(plan_error(d, kGood, {"src.cuont=7"}),
            "--set src.cuont=7: stage 'src' (test_counter): unknown parameter 'cuont'; did you "
            "mean 'count'?");
  // A parameter of another stage (or of run:) is named where it is.
  EXPECT_EQ(plan_error(d, kGood, {"run.count=5"}),
            "--set run.count=5: run: unknown parameter 'count'; the graph has src.count (--set "
            "src.count=..., in a preset under `set:`)");
  // An empty value (an unset shell variable) is refused, never read as an empty list.
  EXPECT_EQ(plan_error(d, kGood, {"src.count="}),
            "--set src.count=: no value after '=' (an unset shell variable?): give one ([] is an "
            "empty list, \"\" an empty string)");
  EXPECT_EQ(plan_error(d, kGood, {"src.count"}),
            "--set src.count: expected --set stage.param=value");
}

TEST(Config, PresetExtendsAndSet) {
  TempDir d;
  d.write("configs/g.yaml", kGood);
  d.write("presets/base.yaml",
          "graph: ../configs/g.yaml\nrun: {seed: 3, epochs: 2}\nset: {src.batch: 8}\n");
  std::string child =
      d.write("presets/child.yaml", "extends: base\nrun: {seed: 5}\nset: {src.count: 9}\n");
  GraphPlan p = plan_graph(load_config(child, {"src.count=11"}));
  EXPECT_EQ(p.run.integer("seed"), 5);
  EXPECT_EQ(p.run.integer("epochs"), 2);
  EXPECT_EQ(p.stages[0].params.integer("batch"), 8);
  EXPECT_EQ(p.stages[0].params.integer("count"), 11);
  EXPECT_EQ(p.config.preset, "child");
  // A typo in a preset's set: points into the preset file.
  std::string bad = d.write("presets/bad.yaml", "extends: base\nset: {src.cout: 9}\n");
  try {
    plan_graph(load_config(bad));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              bad +
                  ":2:7: stage 'src' (test_counter): unknown parameter 'cout'; did you "
                  "mean 'count'?");
  }
  std::string loop = d.write("presets/loop.yaml", "extends: loop\n");
  EXPECT_THROW(load_config(loop), ConfigError);
}

TEST(Config, RoleOrderingChecked) {
  TempDir d;
  std::string e = plan_error(d, R"(stages:
  - {name: src, kind: test_counter}
  - {name: w, kind: test_sleep, inputs: [src]}
  - {name: b, kind: batcher, inputs: [w]}
  - {name: rec, kind: test_recorder, inputs: [b]}
)");
  EXPECT_NE(
      e.find("g.yaml:4:38: stage 'b' (batcher): a rebatch stage must take exactly the source"),
      std::string::npos)
      << e;
}

TEST(Config, ResolvedConfigRoundTrips) {
  TempDir d;
  GraphPlan p = plan_graph(load_config(d.write("g.yaml", kGood), {"src.count=5"}));
  std::map<std::string, Params> sp;
  for (const auto& s : p.stages) sp[s.name] = s.params;
  std::string text = resolved_config_yaml(p.config, sp, p.run);
  GraphPlan again = plan_graph(load_config(d.write("resolved.yaml", text)));
  EXPECT_EQ(again.stages[0].params.integer("count"), 5);
  EXPECT_EQ(again.stages.size(), 3u);
  EXPECT_EQ(again.run.integer("seed"), p.run.integer("seed"));
}

// A run's resolved file (config.yaml, a checkpoint's graph) is still its preset's run: a resume
// shows the preset's name (slipstream-smi, the GPU-sized note) and writes it again.
TEST(Config, ResolvedConfigKeepsThePresetItsRunStartedFrom) {
  TempDir d;
  d.write("configs/g.yaml", kGood);
  const std::string preset = d.write("presets/quick.yaml", "graph: ../configs/g.yaml\n");
  GraphPlan p = plan_graph(load_config(preset));
  ASSERT_EQ(p.config.preset, "quick");
  const std::string text = resolved_config_yaml(p);
  GraphPlan again = plan_graph(load_config(d.write("run/config.yaml", text)));
  EXPECT_EQ(again.config.preset, "quick");
  EXPECT_EQ(again.config.preset_file, preset);
  // Written again, it names the same preset (and the file it now comes from as its graph).
  EXPECT_TRUE(resolved_config_yaml(again).starts_with(text.substr(0, text.find(", graph "))))
      << resolved_config_yaml(again);
  write_safetensors(d.path() + "/model.safetensors", {}, {{"slipstream.config", text}});
  EXPECT_EQ(load_config(d.path() + "/model.safetensors").preset, "quick");
  // A graph file, resolved: its own name, as before; a file people write: the file's name.
  GraphPlan graph_run = plan_graph(load_config(d.path() + "/configs/g.yaml"));
  EXPECT_EQ(load_config(d.write("g2/config.yaml", resolved_config_yaml(graph_run))).preset, "g");
  EXPECT_EQ(load_config(d.write("mine.yaml", text.substr(text.find('\n') + 1))).preset, "mine");
}

// A parameter newer than a run: the run's resolved configuration (config.yaml, a checkpoint's
// graph) lacks it and gets what older runs had; a graph a person writes gets the default.
TEST(Config, ResolvedConfigsLackingANewerParameterGetTheOlderRunsValue) {
  TempDir d;
  GraphPlan p = plan_graph(load_config(d.write("g.yaml", kGood)));
  EXPECT_EQ(p.stages[1].params.string("generation"), "new");
  const std::string text = resolved_config_yaml(p);
  ASSERT_NE(text.find("generation: new"), std::string::npos) << text;
  std::string older = text;  // the line removed, as a run's file written before it existed
  const size_t at = older.find("generation: new");
  older.erase(older.rfind('\n', at) + 1, older.find('\n', at) - older.rfind('\n', at));
  GraphPlan run = plan_graph(load_config(d.write("config.yaml", older)));
  EXPECT_EQ(run.stages[1].params.string("generation"), "old");
  write_safetensors(d.path() + "/model.safetensors", {}, {{"slipstream.config", older}});
  EXPECT_EQ(plan_graph(load_config(d.path() + "/model.safetensors"))
                .stages[1]
                .params.string("generation"),
            "old");
  // Without the resolved header it is a graph like any other.
  const std::string written = older.substr(older.find('\n') + 1);
  EXPECT_EQ(
      plan_graph(load_config(d.write("mine.yaml", written))).stages[1].params.string("generation"),
      "new");
}

// A checkpoint's weights file (or its directory) loads as the graph its metadata carries; one
// without that metadata, or a file that is no safetensors, is an error naming the file.
TEST(Config, CheckpointWeightsCarryTheirGraph) {
  TempDir d;
  GraphPlan p = plan_graph(load_config(d.write("g.yaml", kGood), {"src.count=5"}));
  const std::string text = resolved_config_yaml(p);
  fs::create_directories(d.path() + "/step-1");
  const std::string weights = d.path() + "/step-1/model.safetensors";
  write_safetensors(weights, {}, {{"slipstream.config", text}});
  for (const std::string& path : {weights, d.path() + "/step-1"}) {
    GraphPlan again = plan_graph(load_config(path));
    EXPECT_EQ(again.stages[0].params.integer("count"), 5) << path;
    EXPECT_EQ(again.config.graph_file, weights);
  }
  // Errors inside the carried graph name the weights file, at the line in that text.
  const std::string bad = replace(text, "kind: test_sleep", "kind: test_sleeep");
  write_safetensors(weights, {}, {{"slipstream.config", bad}});
  try {
    plan_graph(load_config(weights));
    ADD_FAILURE() << "an unknown kind must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(weights + " (the graph it carries, line "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("test_sleep"), std::string::npos) << e.what();
  }
  write_safetensors(weights, {}, {{"format", "pt"}});
  try {
    load_config(weights);
    ADD_FAILURE() << "weights without a graph must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("carries no graph"), std::string::npos) << e.what();
  }
  const std::string junk = d.write("junk.safetensors", "not a safetensors file");
  EXPECT_THROW(load_config(junk), ConfigError);
}

// Path parameters resolve at validation: a run directory's config.yaml repeats the run from any
// working directory, and says what was typed.
TEST(Config, PathParametersBecomeAbsolute) {
  TempDir d;
  const std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  GraphPlan rel = plan_graph(load_config(d.write("g.yaml", kGood), {"run.runs_dir=out/../runs"}));
  EXPECT_EQ(rel.run.string("runs_dir"), (std::filesystem::current_path() / "runs").string());
  if (!home.empty()) {
    GraphPlan tilde = plan_graph(load_config(d.write("g.yaml", kGood), {"run.runs_dir=~/r"}));
    EXPECT_EQ(tilde.run.string("runs_dir"), (std::filesystem::path(home) / "r").string());
  }
  GraphPlan abs = plan_graph(load_config(d.write("g.yaml", kGood), {"run.runs_dir=/tmp/x"}));
  EXPECT_EQ(abs.run.string("runs_dir"), "/tmp/x");
  std::string text = resolved_config_yaml(rel.config, {}, rel.run);
  EXPECT_NE(text.find("runs_dir: " + (std::filesystem::current_path() / "runs").string() +
                      "  # as given: out/../runs"),
            std::string::npos)
      << text;
}

// yaml-cpp keeps only the first of two equal keys; the second must not vanish silently.
TEST(Config, DuplicateKeysAreErrors) {
  TempDir d;
  EXPECT_EQ(plan_error(d, replace(kGood, "    kind: test_sleep\n",
                                  "    kind: test_sleep\n    kind: test_recorder\n")),
            "g.yaml:7:5: duplicate key 'kind' (first at line 6); remove one of them");
  EXPECT_EQ(plan_error(d, replace(kGood, "{count: 6, batch: 4}", "{count: 6, batch: 4, count: 7}")),
            "g.yaml:4:34: duplicate key 'count' (first at line 4); remove one of them");
  EXPECT_NE(plan_error(d, std::string(kGood) + "run: {steps: 1}\nrun: {steps: 2}\n")
                .find("duplicate key 'run'"),
            std::string::npos);
}

TEST(Config, SecondYamlDocumentIsAnError) {
  TempDir d;
  std::string e = plan_error(d, std::string(kGood) + "---\nrun: {steps: 3}\n");
  EXPECT_NE(e.find("g.yaml:12:1: a second YAML document ('---') is not read"), std::string::npos)
      << e;
}

// An integer parameter may accept a word: run.validate_batches: all validates every window.
TEST(Config, ValidateBatchesAll) {
  TempDir d;
  GraphPlan p = plan_graph(load_config(d.write("g.yaml", kGood), {"run.validate_batches=all"}));
  EXPECT_EQ(p.run.integer("validate_batches"), std::numeric_limits<int64_t>::max());
  const std::string e = plan_error(d, kGood, {"run.validate_batches=most"});
  EXPECT_NE(e.find("parameter 'validate_batches'"), std::string::npos) << e;
  EXPECT_NE(e.find("(or 'all')"), std::string::npos) << e;
}

// yaml-cpp 0.7's LoadAll loops forever on a ',' outside a flow collection (found by the
// graph_config fuzzer); each of these is a syntax error at the comma, not a hang.
TEST(Config, StrayCommaIsASyntaxErrorNotAHang) {
  TempDir d;
  EXPECT_EQ(plan_error(d, ","), "g.yaml:1:1: YAML syntax error: unexpected ','");
  EXPECT_EQ(plan_error(d, " ,"), "g.yaml:1:2: YAML syntax error: unexpected ','");
  EXPECT_EQ(plan_error(d, "#x\n,"), "g.yaml:2:1: YAML syntax error: unexpected ','");
  // A NUL byte: binary data, refused before the parser sees it.
  EXPECT_EQ(plan_error(d, std::string("\0,", 2)),
            "g.yaml: is not a YAML file (it holds binary data); give a preset, a graph file, a "
            "run directory or a checkpoint");
  EXPECT_TRUE(plan_error(d, std::string(kGood) + "   ,  x\n")
                  .starts_with("g.yaml:11:4: YAML syntax error: "));
  // The fuzzer's own findings.
  for (const char* name : {"graph_config_yamlcpp_hang.yaml", "graph_config_yamlcpp_hang2.yaml",
                           "graph_config_yamlcpp_hang3.yaml"}) {
    std::ifstream in(std::string(SLIPSTREAM_SOURCE_DIR) + "/fuzz/crashers/" + name,
                     std::ios::binary);
    ASSERT_TRUE(in) << name;
    const std::string text{std::istreambuf_iterator<char>(in), {}};
    const std::string e = plan_error(d, text);
    EXPECT_TRUE(
        e.find("YAML syntax error") != std::string::npos ||
        (text.find('\0') != std::string::npos && e.find("holds binary data") != std::string::npos))
        << name << ": " << e;
  }
}

// Keys are names; a list or mapping as a key is a located error, not a conversion exception.
TEST(Config, KeysThatAreNotNamesAreErrors) {
  TempDir d;
  EXPECT_EQ(plan_error(d, std::string(kGood) + "run: {[a]: 1}\n"),
            "g.yaml:11:7: a key must be a name, not a list");
  EXPECT_EQ(plan_error(d, std::string(kGood) + "run: {{a: 1}: 1}\n"),
            "g.yaml:11:7: a key must be a name, not a mapping");
}

// A name longer than the system allows is "not found", not a filesystem exception.
TEST(Config, OverlongPresetNameIsNotFound) {
  TempDir d;
  const std::string name(5000, 'a');
  std::string e = plan_error(d, "extends: " + name + ".yaml\n");
  EXPECT_NE(e.find("no such preset or graph file"), std::string::npos) << e.substr(0, 200);
  e = plan_error(d, "extends: " + name + "\n");
  EXPECT_NE(e.find("unknown preset"), std::string::npos) << e.substr(0, 200);
}

TEST(Config, ConcurrencyInTheTrainableSectionIsAnError) {
  TempDir d;
  std::string e = plan_error(d, replace(kGood, "    kind: test_recorder\n",
                                        "    kind: test_recorder\n    concurrency: 4\n"));
  EXPECT_NE(e.find("g.yaml:10:18: stage 'rec' (test_recorder): concurrency applies to the data "
                   "stages before the trainable section"),
            std::string::npos)
      << e;
  // Before the section it is what parallel decoding uses.
  EXPECT_EQ(plan_error(d, replace(kGood, "    kind: test_sleep\n",
                                  "    kind: test_sleep\n    concurrency: 4\n")),
            "");
}

TEST(Config, TrainableStagesNeedALoss) {
  TempDir d;
  std::string g = R"(stages:
  - {name: src, kind: test_counter}
  - {name: model, kind: test_trainable, inputs: [src]}
)";
  std::string e = plan_error(d, g);
  EXPECT_NE(e.find("g.yaml:3:5: stage 'model' is trainable but the graph has no loss stage"),
            std::string::npos)
      << e;
  EXPECT_EQ(plan_error(d, g + "  - {name: loss, kind: test_loss, inputs: [model]}\n"), "");
}

TEST(Config, RunDeviceIsCheckedAtValidation) {
  TempDir d;
  EXPECT_EQ(plan_error(d, kGood, {"run.device=tpu"}),
            "--set run.device=tpu: run: device 'tpu' is not one of auto, cpu, cuda, cuda:N, "
            "emulated; did you mean 'cpu'?");
  EXPECT_NE(plan_error(d, kGood, {"run.device=cud"}).find("did you mean 'cuda'?"),
            std::string::npos);
  EXPECT_NE(plan_error(d, kGood, {"run.device=gpu"}).find("did you mean 'cuda'?"),
            std::string::npos);
  for (const char* ok : {"auto", "cpu", "cuda", "cuda:1", "emulated"})
    EXPECT_EQ(plan_error(d, kGood, {std::string("run.device=") + ok}), "") << ok;
}

// A "billion laughs" of aliases: each level names the one before nine times. Checked node by
// node it is 9^12 nodes; each anchored node is checked once, so it takes its size, and a
// repeated key inside an aliased mapping is still found.
TEST(Config, AliasesOfAliasesAreCheckedOnce) {
  TempDir d;
  std::string bomb = "x0: &a0 {k: v}\n";
  for (int i = 1; i <= 12; ++i) {
    bomb += "x" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int j = 0; j < 9; ++j) bomb += (j ? ", *a" : "*a") + std::to_string(i - 1);
    bomb += "]\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(plan_error(d, std::string(kGood) + bomb).find("unknown"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(plan_error(d, std::string(kGood) + "x: &m {k: 1, k: 2}\ny: [*m, *m]\n"),
            "g.yaml:11:14: duplicate key 'k' (first at line 11); remove one of them");
}

// A graph file far larger than any graph is refused before yaml-cpp holds it; a FIFO in its
// place is refused without waiting for a writer.
TEST(Config, HugeOrNonRegularGraphFilesAreRefused) {
  TempDir d;
  std::string big = kGood;
  big += "description: \"";
  big.append(size_t{5} << 20, 'x');
  big += "\"\n";
  const std::string path = d.write("big.yaml", big);
  try {
    load_config(path, {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a graph file holds at most 4 MiB"), std::string::npos)
        << e.what();
  }
  const std::string fifo = d.path() + "/fifo.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  try {
    load_config(fifo, {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

// A mark in the graph a checkpoint's weights carry names that graph's line, not the binary
// file's (an eval --set error pointed at "model.safetensors:50:7").
TEST(Config, AMarkInACheckpointsGraphSaysItIsThatGraphsLine) {
  EXPECT_EQ((SourceMark{"run/checkpoints/step-6/model.safetensors", 50, 7}.str()),
            "run/checkpoints/step-6/model.safetensors (the graph it carries, line 50 col 7)");
  EXPECT_EQ((SourceMark{"run/config.yaml", 50, 7}.str()), "run/config.yaml:50:7");
}

// A schema that contradicts itself is refused when it is declared (a plugin's load names it):
// a range on a string, choices on a number, a default outside its own range or choices, a
// parameter or port declared twice. Each was accepted, and printed as if it meant something.
TEST(Config, ASchemaThatContradictsItselfIsRefused) {
  auto error_of = [](auto&& declare) {
    try {
      declare();
    } catch (const std::logic_error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  using S = StageSchema;
  EXPECT_NE(error_of([] {
              S("k").param("mode", std::string("a"), "").range(0, 1);
            }).find("range on parameter 'mode', which is not a number"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              S("k").param("scale", 1.0, "").choices({"x", "y"});
            }).find("choices on parameter 'scale', which is not a string"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              S("k").param("scale", std::vector<double>{5.0}, "").range(0, 1);
            }).find("the default of parameter 'scale' = [5.0] is out of range [0.0, 1.0]"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              S("k").param("mode", std::string("z"), "").choices({"x", "y"});
            }).find("the default of parameter 'mode' = 'z' is not one of {x, y}"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              S("k").param("a", 1.0, "").param("a", 2.0, "");
            }).find("stage kind 'k' declares parameter 'a' twice"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              S("k").input("x", DType::f32, -1, "").input("x", DType::f32, -1, "");
            }).find("declares input 'x' twice"),
            std::string::npos);
  EXPECT_EQ(error_of([] { S("k").param("n", int64_t{3}, "").range(1, 8); }), "(accepted)");
}
