#include "engine/graph.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "engine/device.h"
#include "engine/registry.h"
#include "engine/text_match.h"

namespace slipstream {

const StageSchema& run_schema() {
  static const StageSchema schema = [] {
    StageSchema s("run");
    s.doc("Run-wide settings: the `run:` section of a preset or graph file, or --set run.KEY=V.")
        .param("name", std::string(),
               "run name (the run directory is runs_dir/NAME-<time>); default: the preset name")
        .check([](const ParamValue& v) -> std::string {
          // A name is one folder name under runs_dir: a path would put the run elsewhere.
          const auto* name = std::get_if<std::string>(&v);
          if (!name || (name->find('/') == std::string::npos && *name != "." && *name != ".."))
            return "";
          return "parameter 'name' = '" + *name +
                 "' is not a folder name (no '/'): the run directory goes in runs_dir; set "
                 "run.runs_dir to put it elsewhere";
        })
        .param("device", std::string("auto"),
               "auto | cpu | cuda | cuda:N | emulated (the CUDA code path on the CPU emulator)")
        .param("precision", std::string("fp32"), "fp32, or bf16 (FP32 master weights, bf16 GEMMs)")
        .choices({"fp32", "bf16"})
        .param("bf16_copies", true,
               "under bf16: a stage writes the bf16 copy of an output that the next stage's GEMMs "
               "read, beside it (no cast launch there); false: each stage rounds its inputs itself "
               "(the same bits)")
        .param("seed", int64_t{1}, "seed of every random choice (same seed, same run)")
        .range(0, std::nullopt)
        .param("epochs", int64_t{1},
               "passes over the training data (with run.steps set, epochs repeat until it)")
        .range(1, std::nullopt)
        .param("steps", int64_t{0}, "stop after this many steps (0: when the data ends)")
        .range(0, std::nullopt)
        .param("max_in_flight", int64_t{4}, "batches between the source and the last stage")
        .range(1, 1024)
        .param("threads", int64_t{0}, "TBB worker threads (0: one per core)")
        .range(0, 4096)
        .param("log_every", int64_t{50}, "steps between progress lines and metrics.jsonl rows")
        .range(1, std::nullopt)
        .param("tensorboard", true,
               "also write each metrics row's numbers to a TensorBoard events file in the run "
               "directory (tensorboard --logdir runs)")
        .param("validate_every", int64_t{0}, "steps between validation passes (0: never)")
        .range(0, std::nullopt)
        .param("validate_batches", int64_t{20},
               "batches per validation pass; all: every validation window")
        .range(1, std::nullopt)
        .keyword("all", std::numeric_limits<int64_t>::max())
        .param("early_stop_patience", int64_t{0},
               "stop after this many validations without improvement (0: never)")
        .range(0, std::nullopt)
        .param("max_nonfinite_steps", int64_t{10},
               "stop with an error after this many consecutive steps whose loss or gradient is "
               "not finite (0: never)")
        .range(0, std::nullopt)
        .param("stop_timeout_s", int64_t{300},
               "after a stop signal, seconds the step in progress and its checkpoint may take; "
               "then the process exits without them, naming the newest checkpoint (0: wait "
               "forever). A run hung in a library still ends on SIGTERM")
        .range(0, std::nullopt)
        .param("runs_dir", std::string("runs"), "where run directories are created")
        .path()
        .param("init_from", std::string(),
               "start from these weights (a run directory: its newest checkpoint, or "
               "RUN/checkpoints/step-N), with fresh optimizer state and step 0: fine-tuning")
        .path(/*must_exist=*/true)
        .param("stats_interval_ms", int64_t{250},
               "how often the stats record is refreshed (slipstream-smi calls a record silent for "
               "15 s stale)")
        .range(10, 10000)
        .param("cuda_graph", std::string("auto"),
               "run each training step (and each frame of a stream: infer, the policy library) "
               "as a CUDA graph once its work recurs (one launch instead of hundreds): auto (on "
               "for CUDA devices), on (also under device: emulated), off")
        .choices({"auto", "on", "off"})
        .param("device_memory", 0.0,
               "GiB of device memory a batch_size of auto is sized for (within 90% of it; not a "
               "limit on what the run allocates) "
               "(0: what the device has free when the run starts; device emulated needs a "
               "number)")
        .range(0, std::nullopt);
    return s;
  }();
  return schema;
}

namespace {

std::string who(const StageConfig& s) {
  return "stage '" + s.name + "' (" + s.kind + "): ";
}

bool parse_int(const std::string& text, int64_t& out) {
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  auto r = std::from_chars(b, e, out);
  return r.ec == std::errc() && r.ptr == e;
}
bool parse_double(const std::string& text, double& out) {
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  auto r = std::from_chars(b, e, out);
  return r.ec == std::errc() && r.ptr == e;
}

// Converts a YAML value to the parameter's type, or explains why not.
std::optional<ParamValue> convert(const YAML::Node& n, ParamType t, std::string& why) {
  auto scalar_text = [&](const YAML::Node& x) { return x.IsScalar() ? x.Scalar() : std::string(); };
  auto one = [&](const YAML::Node& x, ParamType et, ParamValue& out) -> bool {
    if (!x.IsScalar()) {
      why = "expects " + std::string(param_type_name(et)) + ", got a " +
            (x.IsSequence() ? "list"
             : x.IsMap()    ? "mapping"
                            : "null");
      return false;
    }
    std::string s = x.Scalar();
    switch (et) {
      case ParamType::boolean:
        if (s == "true" || s == "false") {
          out = (s == "true");
          return true;
        }
        break;
      case ParamType::integer: {
        int64_t v;
        if (parse_int(s, v)) {
          out = v;
          return true;
        }
        break;
      }
      case ParamType::number: {
        double v;
        if (parse_double(s, v)) {
          out = v;
          return true;
        }
        break;
      }
      default:
        out = s;
        return true;
    }
    why = "expects " + std::string(param_type_name(et)) + ", got '" + s + "'";
    return false;
  };
  switch (t) {
    case ParamType::boolean:
    case ParamType::integer:
    case ParamType::number:
    case ParamType::string: {
      ParamValue v;
      if (one(n, t, v)) return v;
      return std::nullopt;
    }
    default: {
      ParamType et = t == ParamType::string_list    ? ParamType::string
                     : t == ParamType::integer_list ? ParamType::integer
                                                    : ParamType::number;
      std::vector<YAML::Node> elems;
      if (n.IsMap()) {  // never an empty list in its place: `{a: 1}` is a mistake, not "none"
        why = "expects a list of " + std::string(param_type_name(et)) + ", got a mapping";
        return std::nullopt;
      }
      if (n.IsSequence())
        for (const auto& e : n) elems.push_back(e);
      else if (n.IsScalar() && !scalar_text(n).empty())
        elems.push_back(n);  // a single value stands for a one-element list
      std::vector<std::string> ss;
      std::vector<int64_t> is;
      std::vector<double> ds;
      for (const auto& e : elems) {
        ParamValue v;
        if (!one(e, et, v)) return std::nullopt;
        if (et == ParamType::string) ss.push_back(std::get<std::string>(v));
        if (et == ParamType::integer) is.push_back(std::get<int64_t>(v));
        if (et == ParamType::number) ds.push_back(std::get<double>(v));
      }
      if (t == ParamType::string_list) return ss;
      if (t == ParamType::integer_list) return is;
      return ds;
    }
  }
}

}  // namespace

// Range and choice checks (schema.h); returns the problem or "".
std::string param_value_problem(const ParamSpec& spec, const ParamValue& v) {
  std::vector<double> nums;
  if (auto* i = std::get_if<int64_t>(&v)) nums.push_back(static_cast<double>(*i));
  if (auto* d = std::get_if<double>(&v)) nums.push_back(*d);
  if (auto* il = std::get_if<std::vector<int64_t>>(&v)) nums.assign(il->begin(), il->end());
  if (auto* dl = std::get_if<std::vector<double>>(&v)) nums = *dl;
  for (double x : nums) {
    // No parameter means infinity: lr: inf passed validation and diverged in ten steps.
    if (std::isinf(x))
      return "parameter '" + spec.name + "' = " + param_value_str(v) + " is not a finite number";
    if (std::isnan(x) || (spec.min && x < *spec.min) || (spec.max && x > *spec.max)) {
      // Integer parameters show integer bounds ([1, 1048576], not [1.0, 1.04858e+06]).
      const bool integral =
          std::holds_alternative<int64_t>(v) || std::holds_alternative<std::vector<int64_t>>(v);
      auto bound = [&](double b) {
        return integral ? std::to_string(static_cast<int64_t>(b)) : param_value_str(ParamValue(b));
      };
      std::string lo = spec.min ? bound(*spec.min) : "-inf";
      std::string hi = spec.max ? bound(*spec.max) : "inf";
      return "parameter '" + spec.name + "' = " + param_value_str(v) + " is out of range [" + lo +
             ", " + hi + "]";
    }
  }
  if (!spec.choices.empty()) {
    std::vector<std::string> vals;
    if (auto* s = std::get_if<std::string>(&v)) vals.push_back(*s);
    if (auto* sl = std::get_if<std::vector<std::string>>(&v)) vals = *sl;
    for (const auto& s : vals) {
      bool ok = false;
      for (const auto& c : spec.choices) ok = ok || c == s;
      if (!ok) {
        std::string list;
        for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
        return "parameter '" + spec.name + "' = '" + s + "' is not one of {" + list + "}" +
               did_you_mean(s, spec.choices);
      }
    }
  }
  if (spec.check && !spec.is_path) return spec.check(v);  // a path's: once resolved
  return {};
}

// Validates and resolves a set of raw values against a schema's params.
namespace {

// `~/x` -> $HOME/x; relative -> absolute against the working directory; "" stays "".
std::string absolute_path(const std::string& p) {
  if (p.empty()) return p;
  std::string s = p;
  if (s == "~" || s.starts_with("~/")) {
    const char* home = std::getenv("HOME");
    if (home && *home) s = std::string(home) + s.substr(1);
  }
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(s, ec);
  return ec ? s : abs.lexically_normal().string();
}

// Sets a parameter; a path parameter is made absolute and keeps the text it was given.
void set_param(Params& out, const ParamSpec& spec, ParamValue v, SourceMark mark) {
  if (!spec.is_path) return out.set(spec.name, std::move(v), std::move(mark));
  ParamValue abs = v;
  if (auto* s = std::get_if<std::string>(&abs)) *s = absolute_path(*s);
  if (auto* l = std::get_if<std::vector<std::string>>(&abs))
    for (auto& s : *l) s = absolute_path(s);
  std::string given = abs == v ? std::string() : param_value_str(v);
  out.set(spec.name, std::move(abs), std::move(mark), std::move(given));
}

}  // namespace

Params resolve_params(const StageSchema& schema, const std::map<std::string, ConfigValue>& raw,
                      const std::string& prefix, const SourceMark& owner_mark,
                      std::vector<ConfigIssue>& issues, bool resolved_config = false) {
  const size_t issues_before = issues.size();
  Params out;
  std::vector<std::string> names;
  for (const auto& p : schema.params()) names.push_back(p.name);
  for (const auto& [key, cv] : raw) {
    const ParamSpec* spec = schema.find_param(key);
    if (!spec) {
      issues.push_back(
          {cv.mark, prefix + "unknown parameter '" + key + "'" + did_you_mean(key, names)});
      continue;
    }
    std::string why;
    // A keyword stands for a value its schema chose: no range applies to it.
    const bool word =
        spec->keyword && cv.node.IsScalar() && cv.node.Scalar() == spec->keyword->first;
    auto v =
        word ? std::optional<ParamValue>(spec->keyword->second) : convert(cv.node, spec->type, why);
    if (!v) {
      if (spec->keyword) why += " (or '" + spec->keyword->first + "')";
      issues.push_back({cv.mark, prefix + "parameter '" + key + "' " + why});
      continue;
    }
    std::string bad = word ? std::string() : param_value_problem(*spec, *v);
    if (!bad.empty()) {
      issues.push_back({cv.mark, prefix + bad});
      continue;
    }
    set_param(out, *spec, *v, cv.mark);
    if (spec->must_exist) {
      const ParamValue& pv = out.value(key);
      std::vector<std::string> names;
      if (auto* s = std::get_if<std::string>(&pv)) names.push_back(*s);
      if (auto* l = std::get_if<std::vector<std::string>>(&pv)) names = *l;
      for (const auto& p : names) {
        std::error_code ec;
        if (!p.empty() && p.find_first_of("*?[") == std::string::npos &&
            !std::filesystem::exists(p, ec))
          issues.push_back({cv.mark, prefix + "parameter '" + key + "': " + p + " not found"});
      }
    }
    if (spec->is_path && spec->check)
      if (std::string why = spec->check(out.value(key)); !why.empty())
        issues.push_back({cv.mark, prefix + why});
  }
  for (const auto& spec : schema.params()) {
    if (out.has(spec.name)) continue;
    if (spec.required) {
      issues.push_back({owner_mark, prefix + "missing required parameter '" + spec.name + "' (" +
                                        std::string(param_type_name(spec.type)) + ": " + spec.doc +
                                        ")"});
      continue;
    }
    if (resolved_config && spec.older_runs_value)
      set_param(out, spec, *spec.older_runs_value, {"<an older run's value>"});
    else
      set_param(out, spec, spec.default_value, {"<default>"});
  }
  // The rules between values, once each value passed its own checks.
  if (issues.size() == issues_before)
    for (const auto& rule : schema.rules())
      if (std::optional<StageSchema::RuleProblem> bad = rule(out)) {
        // At the value to change where the graph or a --set gave it; else the stage's own line.
        const SourceMark& at = out.mark(bad->param);
        const bool given =
            !at.file.empty() && at.file != "<default>" && at.file != "<an older run's value>";
        issues.push_back({given ? at : owner_mark, prefix + bad->why});
      }
  return out;
}

namespace {

std::string port_desc(const PortSpec& p) {
  return std::string(p.dtype ? dtype_name(*p.dtype) : "any") + ", " +
         (p.rank < 0 ? "any rank" : "rank " + std::to_string(p.rank));
}

}  // namespace

namespace {

// plan_graph's passes over one graph file, in order; each adds what it finds wrong to `issues`
// (a pass whose result the next ones cannot do without throws them at once).
class GraphPlanner {
 public:
  explicit GraphPlanner(const Config& config) : config(config), cs(config.stages) {}

  // Plugins first: their stage kinds are the graph's too. A plugin the graph names that is not
  // there is an error, unless every kind of the graph is registered and some came from a plugin
  // loaded otherwise (`slipstream --plugin NEW.so eval RUN`: the run's plugin moved).
  // True when a given plugin stood in for the graph's own (which the resolved graph then drops).
  bool load_plugins() {
    // Every kind of the graph registered already, some by a plugin the user gave for this
    // command and the graph does not name (`slipstream --plugin NEW.so eval RUN`, the run's old
    // one still there): that one stands in for the graph's plugins, which would register the
    // same kinds again and be refused.
    {
      std::set<std::string> named;
      for (const auto& [path, mark] : config.plugins) {
        std::error_code ec;
        named.insert(std::filesystem::weakly_canonical(path, ec).string());
      }
      bool all_known = !cs.empty(), given_instead = false;
      for (const auto& s : cs) {
        all_known = all_known && StageRegistry::find(s.kind);
        given_instead = given_instead || (StageRegistry::kind_from_given_plugin(s.kind) &&
                                          !named.count(StageRegistry::plugin_of(s.kind)));
      }
      if (all_known && given_instead) return true;
    }
    std::set<std::string> loaded;
    for (const auto& [path, mark] : config.plugins) {
      try {
        StageRegistry::load_plugin(path);
        std::error_code ec;
        loaded.insert(std::filesystem::weakly_canonical(path, ec).string());
      } catch (const std::exception& e) {
        issues.push_back({mark, e.what()});
      }
    }
    if (config.missing_plugins.empty()) return false;
    bool all_known = true, from_elsewhere = false;
    for (const auto& s : cs) {
      all_known = all_known && StageRegistry::find(s.kind);
      const std::string from = StageRegistry::plugin_of(s.kind);
      from_elsewhere = from_elsewhere || (!from.empty() && !loaded.count(from));
    }
    if (all_known && from_elsewhere) return false;
    for (const auto& [why, mark] : config.missing_plugins) issues.push_back({mark, why});
    return false;
  }

  // The run: section, and a device name checked here rather than when the run starts.
  void resolve_run() {
    plan.run = resolve_params(run_schema(), config.run, "run: ", {config.graph_file}, issues);
    if (plan.run.has("device")) {
      // Said at validation, not when the run reaches device selection.
      const std::string dev = plan.run.string("device");
      bool ok = dev == "auto" || dev == "emulated";
      try {
        if (!ok) parse_device(dev);
        ok = true;
      } catch (const std::exception&) {
      }
      if (!ok)
        issues.push_back({plan.run.mark("device"),
                          "run: device '" + dev +
                              "' is not one of auto, cpu, cuda, cuda:N, emulated" +
                              // A GPU by its common name, which spells like cpu.
                              (dev == "gpu" || dev.starts_with("gpu:")
                                   ? "; did you mean 'cuda'?"
                                   : did_you_mean(dev, {"auto", "cpu", "cuda", "emulated"}))});
    }
  }

  // Each stage's kind, parameters and concurrency.
  void resolve_stages() {
    // Kinds and parameters, in file order.
    schemas.assign(cs.size(), nullptr);
    params.assign(cs.size(), Params());
    concurrency.assign(cs.size(), 1);
    std::vector<std::string> kinds;
    for (const auto* s : StageRegistry::all()) kinds.push_back(s->kind());
    for (size_t i = 0; i < cs.size(); ++i) {
      schemas[i] = StageRegistry::find(cs[i].kind);
      if (!schemas[i]) {
        // Kinds are single words: one with spaces is a quote left open, which took the lines
        // after it (folded into spaces) as its value.
        const std::string& k = cs[i].kind;
        const size_t cut = k.find_first_of(" \t\n");
        issues.push_back({cs[i].kind_mark,
                          cut == std::string::npos
                              ? "stage '" + cs[i].name + "': unknown kind '" + k + "'" +
                                    did_you_mean(k, kinds) + " (see `slipstream stages`)"
                              : "stage '" + cs[i].name + "': its kind '" + k.substr(0, cut) +
                                    " ...' runs over several words or lines: a quote left open?"});
        continue;
      }
      params[i] = resolve_params(*schemas[i], cs[i].params, who(cs[i]), cs[i].mark, issues,
                                 config.resolved);
      concurrency[i] = schemas[i]->default_concurrency();
      if (cs[i].concurrency) {
        int64_t n = -1;
        const auto& node = cs[i].concurrency->node;
        if (!node.IsScalar() || !parse_int(node.Scalar(), n) || n < 0 || n > 1024)
          issues.push_back(
              {cs[i].concurrency->mark, who(cs[i]) + "concurrency must be an int in [0, 1024]"});
        else
          concurrency[i] = static_cast<int>(n);
      }
    }
  }

  // "unknown parameter 'batch_size'" with no near name of its own: the parameter of that name
  // elsewhere in the graph (`--set run.batch_size=`, `--set core.window=`; a preset's `run:
  // {core.layers: 5}`, which belongs under `set:`).
  void name_owners_of_unknown_parameters() {
    const std::string lead = "unknown parameter '";
    for (auto& issue : issues) {
      const size_t at = issue.message.find(lead);
      if (at == std::string::npos || issue.message.find("did you mean") != std::string::npos)
        continue;
      const size_t from = at + lead.size();
      const size_t end = issue.message.find('\'', from);
      if (end == std::string::npos) continue;
      const std::string key = issue.message.substr(from, end - from);
      std::vector<std::string> owners;
      if (const size_t dot = key.find('.'); dot != std::string::npos) {
        for (size_t i = 0; i < cs.size(); ++i)
          if (schemas[i] && cs[i].name == key.substr(0, dot) &&
              schemas[i]->find_param(key.substr(dot + 1)))
            owners.push_back(key);
      } else {
        if (run_schema().find_param(key)) owners.push_back("run." + key);
        for (size_t i = 0; i < cs.size(); ++i)
          if (schemas[i] && schemas[i]->find_param(key)) owners.push_back(cs[i].name + "." + key);
      }
      if (owners.empty()) continue;
      std::string list;
      for (const auto& o : owners) list += (list.empty() ? "" : " or ") + o;
      issue.message += "; the graph has " + list + " (--set " + owners.front() +
                       "=..., in a preset under `set:`)";
    }
  }

  // Which stages feed which; a name that is no stage is an error at once.
  void find_edges() {
    // Edges: inputs must name existing stages; then a topological order that keeps file order
    // among independent stages.
    std::vector<std::string> names;
    for (size_t i = 0; i < cs.size(); ++i) by_name[cs[i].name] = i, names.push_back(cs[i].name);
    preds.assign(cs.size(), {});
    for (size_t i = 0; i < cs.size(); ++i) {
      for (const auto& r : cs[i].inputs) {
        auto it = by_name.find(r.stage);
        if (it == by_name.end()) {
          issues.push_back({r.mark, who(cs[i]) + "input '" + r.stage +
                                        "' is not a stage of this graph" +
                                        did_you_mean(r.stage, names)});
          continue;
        }
        if (it->second == i) {
          issues.push_back({r.mark, who(cs[i]) + "takes its own output as input (cycle)"});
          continue;
        }
        preds[i].push_back(it->second);
      }
    }
    if (!issues.empty()) throw ConfigError(issues);
  }

  // A topological order that keeps file order among independent stages; a cycle is named.
  void order_stages() {
    std::vector<int> indegree(cs.size(), 0);
    std::vector<std::vector<size_t>> succs(cs.size());
    for (size_t i = 0; i < cs.size(); ++i)
      for (size_t p : std::set<size_t>(preds[i].begin(), preds[i].end()))
        indegree[i]++, succs[p].push_back(i);
    std::set<size_t> ready;
    for (size_t i = 0; i < cs.size(); ++i)
      if (indegree[i] == 0) ready.insert(i);
    while (!ready.empty()) {
      size_t i = *ready.begin();
      ready.erase(ready.begin());
      order.push_back(i);
      for (size_t s : succs[i])
        if (--indegree[s] == 0) ready.insert(s);
    }
    if (order.size() != cs.size()) {
      // Name one cycle: walk predecessors among the stages left over.
      std::set<size_t> left;
      for (size_t i = 0; i < cs.size(); ++i)
        if (indegree[i] > 0) left.insert(i);
      size_t start = *left.begin(), cur = start;
      std::vector<size_t> path;
      std::set<size_t> seen;
      while (!seen.count(cur)) {
        seen.insert(cur);
        path.push_back(cur);
        for (size_t p : preds[cur])
          if (left.count(p)) {
            cur = p;
            break;
          }
      }
      // path walks against the data flow (each entry feeds the one before); the cycle starts
      // where the walk came back, and is printed in data-flow order.
      std::vector<size_t> loop(std::find(path.begin(), path.end(), cur), path.end());
      std::string cycle;
      for (auto it = loop.rbegin(); it != loop.rend(); ++it) cycle += cs[*it].name + " -> ";
      cycle += cs[loop.back()].name;
      throw ConfigError({{cs[cur].inputs_mark, who(cs[cur]) + "inputs form a cycle: " + cycle}});
    }
  }

  // The plan's stages in that order, each output a value slot and a gradient slot.
  void lay_out_slots() {
    pos.assign(cs.size(), 0);
    for (size_t k = 0; k < order.size(); ++k) pos[order[k]] = static_cast<int>(k);
    plan.stages.resize(cs.size());
    for (size_t k = 0; k < order.size(); ++k) {
      size_t i = order[k];
      auto& ps = plan.stages[k];
      ps.name = cs[i].name;
      ps.schema = schemas[i];
      ps.params = std::move(params[i]);
      ps.mark = cs[i].mark;
      ps.concurrency = concurrency[i];
      for (size_t p : preds[i]) {
        int pp = pos[p];
        if (std::find(ps.upstream.begin(), ps.upstream.end(), pp) == ps.upstream.end())
          ps.upstream.push_back(pp);
      }
      for (size_t o = 0; o < ps.schema->outputs().size(); ++o) {
        ps.output_slots.push_back(static_cast<int>(plan.slots.size()));
        plan.slots.emplace_back(ps.name + "." + ps.schema->outputs()[o].name);
        ps.output_grad_slots.push_back(static_cast<int>(plan.slots.size()));
        plan.slots.emplace_back("grad:" + ps.name + "." + ps.schema->outputs()[o].name);
      }
    }

    // Which (stage, output port) produces each slot: passthrough bindings look it up.
    slot_owner.assign(plan.slots.size(), {-1, -1});
    for (size_t k = 0; k < plan.stages.size(); ++k)
      for (size_t o = 0; o < plan.stages[k].output_slots.size(); ++o)
        slot_owner[static_cast<size_t>(plan.stages[k].output_slots[o])] = {static_cast<int>(k),
                                                                           static_cast<int>(o)};
  }

  // The producer of the tensor named `port` that passthrough stage `st` carries; st itself
  // when it carries none of that name (the caller then reports the missing output).
  int carried_by(int st, const std::string& port) const {
    for (int slot : plan.stages[st].passthrough_slots) {
      auto [owner, o] = slot_owner[static_cast<size_t>(slot)];
      if (owner >= 0 && plan.stages[owner].schema->outputs()[o].name == port) return owner;
    }
    return st;
  }

  // Each input port to the output that feeds it.
  void bind_ports() {
    // Port bindings: explicit `port: stage.out`, else by name, else the single output of a single
    // upstream feeding a single-input stage.
    for (size_t k = 0; k < order.size(); ++k) {
      const StageConfig& c = cs[order[k]];
      auto& ps = plan.stages[k];
      const auto& ins = ps.schema->inputs();
      ps.inputs.assign(ins.size(), {});
      struct Candidate {
        int stage;
        int port;
        SourceMark mark;
      };
      std::vector<Candidate> cands;
      bool wrong_reference = false;  // an input names an output or port that is not there
      auto bind = [&](size_t port_idx, int st, int op, const SourceMark& mark) {
        const PortSpec& want = ins[port_idx];
        const PortSpec& have = plan.stages[st].schema->outputs()[op];
        if ((want.dtype && have.dtype && *want.dtype != *have.dtype) ||
            (want.rank >= 0 && have.rank >= 0 && want.rank != have.rank)) {
          issues.push_back({mark, who(c) + "input '" + want.name + "' expects " + port_desc(want) +
                                      " but " + plan.stages[st].name + "." + have.name + " is " +
                                      port_desc(have)});
        }
        ps.inputs[port_idx] = {st, op, plan.stages[st].output_slots[op],
                               plan.stages[st].output_grad_slots[op]};
      };
      for (const auto& r : c.inputs) {
        int st = pos[by_name[r.stage]];
        if (!r.port.empty() && plan.stages[st].schema->is_passthrough())
          st = carried_by(st, r.port);  // `h2d.target_buttons`: the tensor h2d carries
        const auto& outs = plan.stages[st].schema->outputs();
        std::vector<std::string> out_names;
        for (const auto& o : outs) out_names.push_back(o.name);
        if (!r.port.empty()) {
          auto* op = plan.stages[st].schema->find_output(r.port);
          if (!op) {
            wrong_reference = true;
            issues.push_back({r.mark, who(c) + "stage '" + r.stage + "' has no output '" + r.port +
                                          "'" + did_you_mean(r.port, out_names)});
            continue;
          }
          int opi = static_cast<int>(op - outs.data());
          if (!r.as_port.empty()) {
            auto* ip = ps.schema->find_input(r.as_port);
            if (!ip) {
              std::vector<std::string> in_names;
              for (const auto& x : ins) in_names.push_back(x.name);
              wrong_reference = true;
              issues.push_back({r.mark, who(c) + "has no input port '" + r.as_port + "'" +
                                            did_you_mean(r.as_port, in_names)});
              continue;
            }
            bind(static_cast<size_t>(ip - ins.data()), st, opi, r.mark);
          } else {
            cands.push_back({st, opi, r.mark});
          }
        } else if (plan.stages[st].schema->is_passthrough()) {
          // Bind through: the candidates are the tensors the passthrough stage carries.
          for (int slot : plan.stages[st].passthrough_slots) {
            auto [s2, o] = slot_owner[static_cast<size_t>(slot)];
            if (s2 >= 0) cands.push_back({s2, o, r.mark});
          }
        } else {
          for (size_t o = 0; o < outs.size(); ++o)
            cands.push_back({st, static_cast<int>(o), r.mark});
        }
      }
      if (ps.schema->is_passthrough()) {
        for (const auto& cd : cands)
          ps.passthrough_slots.push_back(plan.stages[cd.stage].output_slots[cd.port]);
        continue;
      }
      const auto required_inputs =
          std::count_if(ins.begin(), ins.end(), [](const PortSpec& p) { return !p.optional; });
      for (size_t i = 0; i < ins.size(); ++i) {
        if (ps.inputs[i].producer >= 0) continue;
        std::vector<const Candidate*> match;
        for (const auto& cd : cands)
          if (plan.stages[cd.stage].schema->outputs()[cd.port].name == ins[i].name)
            match.push_back(&cd);
        if (match.size() > 1) {
          issues.push_back({c.inputs_mark, who(c) + "input '" + ins[i].name + "' is ambiguous: " +
                                               plan.stages[match[0]->stage].name + " and " +
                                               plan.stages[match[1]->stage].name +
                                               " both output it; write inputs: {" + ins[i].name +
                                               ": stage.port}"});
          continue;
        }
        // One tensor given for the stage's one required input binds to it whatever its name
        // (optional inputs, added to a stage later, leave its older graphs as they were).
        if (match.size() == 1)
          bind(i, match[0]->stage, match[0]->port, match[0]->mark);
        else if (required_inputs == 1 && !ins[i].optional && cands.size() == 1)
          bind(i, cands[0].stage, cands[0].port, cands[0].mark);
      }
      for (size_t i = 0; i < ins.size(); ++i) {
        // After a wrong reference (no such output or port) its input's lack of a producer is
        // that same mistake again: one line for it; the stage's inputs are checked again once
        // the reference is mended.
        if (wrong_reference) break;
        if (ps.inputs[i].producer >= 0 || ins[i].optional) continue;
        // Inputs bind by name; an output of another name is bound by writing it. Name the one
        // whose type fits, when one does (a new stage's `y` before a model's `x`).
        std::string avail;
        std::vector<std::string> fitting;
        for (const auto& cd : cands) {
          const PortSpec& out = plan.stages[cd.stage].schema->outputs()[cd.port];
          const std::string ref = plan.stages[cd.stage].name + "." + out.name;
          avail += (avail.empty() ? "" : ", ") + ref;
          const bool dtype_fits = !ins[i].dtype || !out.dtype || *ins[i].dtype == *out.dtype;
          const bool rank_fits = ins[i].rank < 0 || out.rank < 0 || ins[i].rank == out.rank;
          if (dtype_fits && rank_fits) fitting.push_back(ref);
        }
        std::string msg =
            who(c) + "input '" + ins[i].name + "' (" + port_desc(ins[i]) + ") has no producer";
        if (avail.empty()) {
          msg += ": the stage has no inputs";
        } else {
          msg += " among its inputs (available: " + avail + "); inputs bind by name: ";
          msg += fitting.size() == 1
                     ? "write inputs: {" + ins[i].name + ": " + fitting[0] + ", ...}"
                     : "write inputs: {" + ins[i].name + ": stage.port, ...}";
        }
        issues.push_back({c.inputs_mark, msg});
      }
    }
  }

  // A slot for the bf16 copy of each output that an input reading one is bound to.
  void lay_out_bf16_copies() {
    for (auto& ps : plan.stages) {
      const auto& ins = ps.schema->inputs();
      for (size_t i = 0; i < ps.inputs.size(); ++i) {
        const int s = ps.inputs[i].slot;
        if (s < 0 || !ins[i].reads_bf16_copy || plan.slots[static_cast<size_t>(s)].bf16_copy >= 0)
          continue;
        const int copy = static_cast<int>(plan.slots.size());
        plan.slots.emplace_back("bf16:" + plan.slots[static_cast<size_t>(s)].name);
        plan.slots[static_cast<size_t>(s)].bf16_copy = copy;
      }
    }
  }

  // Where the source, rebatchers, trainable section and update stages may be.
  void check_roles() {
    // Roles: one source first; rebatchers right after it; the trainable section from the first
    // differentiable/loss/update stage on; update stages after a loss.
    int n = static_cast<int>(plan.stages.size());
    int sources = 0;
    for (int k = 0; k < n; ++k) {
      auto& ps = plan.stages[k];
      StageRole role = ps.schema->stage_role();
      const StageConfig& c = cs[order[k]];
      if (role == StageRole::source) {
        if (++sources > 1)
          issues.push_back({c.mark, who(c) + "a graph has one source; this is the second"});
        else if (k != 0 || !ps.upstream.empty())
          issues.push_back({c.mark, who(c) + "a source takes no inputs"});
      } else if (role == StageRole::rebatch) {
        bool ok = ps.upstream.size() == 1 && ps.upstream[0] == k - 1 && k - 1 < plan.head_end;
        if (!ok)
          issues.push_back(
              {c.inputs_mark, who(c) + "a rebatch stage must take exactly the source (or the "
                                       "rebatch stage right after it) as input"});
      } else if (ps.upstream.empty()) {
        issues.push_back({c.mark, who(c) + "has no inputs; only a source may"});
      }
      if (role == StageRole::source || role == StageRole::rebatch) plan.head_end = k + 1;
    }
    if (sources == 0) issues.push_back({{config.graph_file}, "graph has no source stage"});
    plan.section_begin = n;
    for (int k = plan.head_end; k < n; ++k) {
      const auto* s = plan.stages[k].schema;
      if (s->is_differentiable() || s->stage_role() == StageRole::update) {
        plan.section_begin = k;
        break;
      }
    }
    bool has_loss = false;
    std::string trainable;
    for (const auto& s : plan.stages) {
      has_loss = has_loss || s.schema->stage_role() == StageRole::loss;
      if (s.schema->is_trainable() && trainable.empty()) trainable = s.name;
    }
    if (!trainable.empty() && !has_loss) {
      std::string kinds;  // the registered loss kinds, as examples
      for (const StageSchema* k : StageRegistry::all())
        if (k->stage_role() == StageRole::loss) kinds += (kinds.empty() ? "" : ", ") + k->kind();
      issues.push_back({cs[by_name[trainable]].mark,
                        "stage '" + trainable +
                            "' is trainable but the graph has no loss stage: nothing would train "
                            "it (add one after the model" +
                            (kinds.empty() ? std::string() : ", e.g. " + kinds) + ")"});
    }
    for (int k = 0; k < n; ++k) {
      auto& ps = plan.stages[k];
      const StageConfig& c = cs[order[k]];
      ps.in_section = k >= plan.section_begin;
      for (int u : ps.upstream)
        if (plan.stages[u].schema->stage_role() == StageRole::loss || plan.stages[u].after_loss)
          ps.after_loss = true;
      if (ps.schema->stage_role() == StageRole::update && !ps.after_loss && has_loss)
        issues.push_back(
            {c.inputs_mark, who(c) + "an update stage must come after the loss stage"});
      if (ps.after_loss && ps.schema->is_trainable())
        issues.push_back({c.mark, who(c) + "a trainable stage cannot follow the loss"});
      // The section runs one batch at a time, in order: a concurrency there would be ignored.
      if (ps.in_section && c.concurrency && ps.concurrency != 1)
        issues.push_back({c.concurrency->mark,
                          who(c) + "concurrency applies to the data stages before the trainable "
                                   "section; this stage runs in it, one batch at a time"});
    }
  }

  // One gradient accumulation value for the whole graph.
  void check_accumulation() {
    const int n = static_cast<int>(plan.stages.size());
    // Gradient accumulation: one value for the whole graph, since the runner counts its steps.
    std::string micro_from;
    for (int k = 0; k < n; ++k) {
      const auto& ps = plan.stages[k];
      for (const ParamSpec& spec : ps.schema->params()) {
        if (!spec.micro_batches || !ps.params.has(spec.name)) continue;
        const int64_t v = ps.params.integer(spec.name);
        const std::string here = "'" + ps.name + "." + spec.name + "' (" + std::to_string(v) + ")";
        if (micro_from.empty()) {
          plan.micro_batches = v;
          micro_from = here;
        } else if (v != plan.micro_batches) {
          issues.push_back(
              {ps.params.mark(spec.name), who(cs[order[k]]) + "batches per optimizer step " + here +
                                              " differ from " + micro_from + "; set them alike"});
        }
      }
    }
  }

  const Config& config;
  const std::vector<StageConfig>& cs;
  std::vector<ConfigIssue> issues;
  GraphPlan plan;

 private:
  std::vector<const StageSchema*> schemas;
  std::vector<Params> params;
  std::vector<int> concurrency;
  std::map<std::string, size_t> by_name;
  std::vector<std::vector<size_t>> preds;
  std::vector<size_t> order;                    // file index of each planned stage
  std::vector<int> pos;                         // planned position of each file index
  std::vector<std::pair<int, int>> slot_owner;  // (stage, output) that produces each slot
};

}  // namespace

GraphPlan plan_graph(Config config) {
  GraphPlanner p(config);
  const bool given_plugins_stood_in = p.load_plugins();
  p.resolve_run();
  p.resolve_stages();
  p.name_owners_of_unknown_parameters();
  p.find_edges();
  p.order_stages();
  p.lay_out_slots();
  p.bind_ports();
  p.lay_out_bf16_copies();
  p.check_roles();
  p.check_accumulation();
  if (!p.issues.empty()) throw ConfigError(p.issues);
  GraphPlan plan = std::move(p.plan);
  // The graph's own plugins were not loaded: its resolved form (a resume's config.yaml, the
  // checkpoints) names the given ones that served (resolved_config_yaml adds them by kind), so a
  // later run without --plugin does not load both and refuse the second.
  if (given_plugins_stood_in) config.plugins.clear();
  plan.config = std::move(config);
  return plan;
}

// ---- Graph ----

Graph::Graph(GraphPlan plan, RunState& run) : plan_(std::move(plan)) {
  for (size_t k = 0; k < plan_.stages.size(); ++k) {
    auto& ps = plan_.stages[k];
    stages_.push_back(StageRegistry::create(ps.schema->kind()));
    auto ctx = std::make_unique<StageContext>();
    ctx->name_ = ps.name;
    ctx->schema_ = ps.schema;
    ctx->params_ = ps.params;
    ctx->run_ = &run;
    ctx->concurrency_ = ps.concurrency;
    ctx->index_ = static_cast<int>(k);
    ctx->plan_ = &plan_;
    for (const auto& b : ps.inputs) ctx->input_slots_.push_back(b.slot);
    ctx->output_slots_ = ps.output_slots;
    contexts_.push_back(std::move(ctx));
  }
  run.micro_batches_per_step = static_cast<uint64_t>(std::max<int64_t>(1, plan_.micro_batches));
  for (size_t k = 0; k < stages_.size(); ++k) {
    plan_.instances.push_back(stages_[k].get());
    plan_.contexts.push_back(contexts_[k].get());
  }
}

Graph::~Graph() = default;

void Graph::setup() {
  // The last trainable stage: after its setup the model's weights move into the run's arena,
  // before the update stages take the parameters.
  size_t last_trainable = stages_.size();
  for (size_t k = 0; k < stages_.size(); ++k)
    if (plan_.stages[k].schema->is_trainable()) last_trainable = k;
  if (!stages_.empty() && !contexts_.front()->run().param_arena)
    contexts_.front()->run().param_arena = std::make_shared<ParamArena>();
  for (size_t k = 0; k < stages_.size(); ++k) {
    try {
      stages_[k]->setup(*contexts_[k]);
    } catch (const ConfigError&) {
      throw;
    } catch (...) {
      throw std::runtime_error("stage '" + plan_.stages[k].name + "' (" +
                               plan_.stages[k].schema->kind() +
                               "): setup failed: " + what_of_current_exception());
    }
    for (size_t o = 0; o < plan_.stages[k].output_slots.size(); ++o) {
      const auto& slot = plan_.slots[plan_.stages[k].output_slots[o]];
      if (!slot.declared)
        throw std::logic_error("stage '" + plan_.stages[k].name + "' did not declare output '" +
                               plan_.stages[k].schema->outputs()[o].name + "' in setup()");
    }
    if (k == last_trainable && contexts_[k]->run().param_arena)
      contexts_[k]->run().param_arena->pack();
    // Once the head is set up, a run without run.steps knows its length, before the stages
    // after it (an optimizer's schedule) read it.
    if (k + 1 == static_cast<size_t>(plan_.head_end)) {
      RunState& run = contexts_[k]->run();
      if (run.total_steps == 0 && run.source_batches > 0) {
        uint64_t batches = run.source_batches;
        for (size_t r = 1; r <= k; ++r) batches = stages_[r]->batches_out(batches);
        run.total_steps = batches / run.micro_batches_per_step;
      }
    }
  }
}

int Graph::find(std::string_view name) const {
  for (size_t k = 0; k < plan_.stages.size(); ++k)
    if (plan_.stages[k].name == name) return static_cast<int>(k);
  return -1;
}

Batch Graph::new_batch() const {
  Batch b;
  b.slots.resize(plan_.slots.size());
  return b;
}

// ---- Stage defaults ----

bool Stage::produce(Batch&, StageContext& ctx) {
  throw std::logic_error("stage '" + ctx.name() + "' is a source but does not implement produce()");
}
void Stage::seek(uint64_t next_index, StageContext& ctx) {
  // Rebatchers without state between batches need nothing; a source must position itself.
  if (next_index == 0 || ctx.schema().stage_role() != StageRole::source) return;
  throw std::runtime_error("stage '" + ctx.name() + "' cannot resume from batch " +
                           std::to_string(next_index));
}
bool Stage::rebatch(Batch&, const std::function<bool(Batch&)>&, StageContext& ctx) {
  throw std::logic_error("stage '" + ctx.name() +
                         "' is a rebatch stage but does not implement rebatch()");
}

std::string resolved_config_yaml(const GraphPlan& plan) {
  std::map<std::string, Params> sp;
  for (const auto& s : plan.stages) sp[s.name] = s.params;
  return resolved_config_yaml(plan.config, sp, plan.run);
}

}  // namespace slipstream
