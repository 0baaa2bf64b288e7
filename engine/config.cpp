#include "engine/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include "engine/registry.h"
#include "engine/safetensors.h"
#include "engine/text_match.h"

namespace fs = std::filesystem;

namespace slipstream {

namespace {

std::string join_issues(const std::vector<ConfigIssue>& issues) {
  std::string s;
  for (size_t i = 0; i < issues.size(); ++i) s += (i ? "\n" : "") + issues[i].str();
  return s;
}

SourceMark mark_of(const YAML::Node& n, const std::string& file) {
  YAML::Mark m = n.Mark();
  if (m.line < 0) return {file, 0, 0};
  return {file, m.line + 1, m.column + 1};
}

[[noreturn]] void fail(SourceMark mark, std::string message) {
  throw ConfigError({{std::move(mark), std::move(message)}});
}

// yaml-cpp keeps every pair of a mapping but lookups see only the first: a repeated key would
// silently lose the later value, so it is an error, as in most YAML loaders' strict modes. Keys
// are names: a list, mapping or null as a key is an error too. An alias is the node it names,
// checked once: `checked` holds the text positions of the lists and mappings seen, so a file of
// aliases of aliases (a "billion laughs") costs its size, not its expansion.
void check_mapping_keys(const YAML::Node& n, const std::string& file, std::set<int>& checked) {
  if ((n.IsSequence() || n.IsMap()) && n.Mark().pos >= 0 && !checked.insert(n.Mark().pos).second)
    return;
  if (n.IsSequence()) {
    for (const auto& e : n) check_mapping_keys(e, file, checked);
  } else if (n.IsMap()) {
    std::map<std::string, YAML::Mark> seen;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar())
        fail(mark_of(it->first, file),
             std::string("a key must be a name, not ") + (it->first.IsSequence() ? "a list"
                                                          : it->first.IsMap()    ? "a mapping"
                                                                                 : "empty"));
      auto [at, fresh] = seen.emplace(it->first.Scalar(), it->first.Mark());
      if (!fresh)
        fail(mark_of(it->first, file),
             "duplicate key '" + it->first.Scalar() + "' (first at line " +
                 std::to_string(at->second.line + 1) + "); remove one of them");
      check_mapping_keys(it->second, file, checked);
    }
  }
}

// Counts the documents in `text` (stopping at 2) without building them, for yaml-cpp 0.7's
// LoadAll never returns on some malformed input (a ',' outside a flow collection): its parser
// reports an empty document at the same token forever. Two empty documents at one position
// are that loop; it is reported as a syntax error at the token instead.
class DocumentCounter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& m) override {
    start_ = m;
    events_ = 0;
    null_only_ = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { event(m, true); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { event(m, false); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    event(m, false);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    event(m, false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    event(m, false);
  }
  void OnMapEnd() override {}

  // True when the document just handled is a lone null at the same position as the one before.
  bool stuck() const { return stuck_; }
  // Where the document's content begins (its start when it has none).
  const YAML::Mark& start() const { return start_; }
  const YAML::Mark& last_null() const { return last_null_; }

  void next_document() {
    if (events_ == 1 && null_only_) {
      stuck_ = had_null_doc_ && same(last_null_, null_at_);
      had_null_doc_ = true;
      last_null_ = null_at_;
    } else {
      had_null_doc_ = false;
    }
  }

 private:
  static bool same(const YAML::Mark& a, const YAML::Mark& b) {
    return a.pos == b.pos && a.line == b.line && a.column == b.column;
  }
  void event(const YAML::Mark& m, bool null) {
    if (++events_ == 1) {
      start_ = m;
      if (null) null_at_ = m;
    }
    null_only_ = null_only_ && null;
  }

  YAML::Mark start_, null_at_, last_null_;
  size_t events_ = 0;
  bool null_only_ = true, had_null_doc_ = false, stuck_ = false;
};

bool is_checkpoint_weights(const std::string& path) {
  return path.ends_with(".safetensors");
}

// resolved_config_yaml's first line, which tells its files from graphs people write.
constexpr std::string_view kResolvedHeader = "# Resolved configuration: ";

// The preset a resolved file's run was started from, as its first line (`first`) names it
// ("preset 'NAME' (FILE)"): a resume or a repeat of the run is still that preset's run
// (slipstream-smi's `preset`, the note on a GPU-sized preset on the CPU, a resolved file written
// again). Empty for any other line.
std::pair<std::string, std::string> resolved_preset(const std::string& first) {
  const std::string lead = std::string(kResolvedHeader) + "preset '";
  if (!first.starts_with(lead)) return {};
  const size_t end = first.find('\'', lead.size());
  if (end == std::string::npos || end == lead.size()) return {};
  std::string name = first.substr(lead.size(), end - lead.size()), file;
  if (first.compare(end, 3, "' (") == 0) {
    const size_t close = first.find("), graph ", end + 3);
    if (close != std::string::npos) file = first.substr(end + 3, close - end - 3);
  }
  return {name, file};
}

// The graph file a checkpoint's weights carry (metadata `slipstream.config`); marks in it name
// the weights file, with lines counted in that text.
std::string graph_of_checkpoint(const std::string& path) {
  SafetensorsFile f;
  try {
    f = read_safetensors(path, SafetensorsRead::metadata);
  } catch (const std::exception& e) {
    fail({path}, e.what());
  }
  auto it = f.metadata.find("slipstream.config");
  if (it == f.metadata.end())
    fail({path},
         "carries no graph (no 'slipstream.config' in its metadata: not written by "
         "slipstream, or by a version before checkpoints described themselves); give the "
         "run directory's config.yaml instead");
  return it->second;
}

constexpr uintmax_t kMaxGraphFileBytes = uintmax_t{4} << 20;

// `first_line`, when given, gets the text's first line (a resolved file's header).
YAML::Node load_yaml(const std::string& path, std::string* first_line = nullptr) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path run_config = fs::path(path) / "config.yaml";
    fail({path}, "is a directory, not a YAML file" +
                     (fs::exists(run_config, ec)
                          ? " (a run directory? its graph is " + run_config.string() + ")"
                          : std::string()));
  }
  std::string text;
  if (is_checkpoint_weights(path)) {
    text = graph_of_checkpoint(path);
  } else {
    // yaml-cpp holds a few hundred bytes a byte of a long list: a graph file is small, and a
    // huge one is refused before it is parsed.
    if (const auto size = fs::file_size(path, ec); !ec && size > kMaxGraphFileBytes)
      fail({path}, "is " + std::to_string(size >> 20) + " MiB; a graph file holds at most " +
                       std::to_string(kMaxGraphFileBytes >> 20) +
                       " MiB (name folders in a path list, not every file in them)");
    if (!fs::is_regular_file(path, ec) && fs::exists(path, ec))
      fail({path}, "is not a regular file");
    std::ifstream in(path, std::ios::binary);
    if (!in) fail({path}, std::string("cannot read file: ") + std::strerror(errno));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) fail({path}, "cannot read file");
    // A replay, weights or an image given by mistake: said as that, not as a YAML error quoting
    // its bytes to the terminal.
    const bool utf16_or_32 = text.starts_with("\xff\xfe") || text.starts_with("\xfe\xff") ||
                             text.starts_with(std::string("\0\0\xfe\xff", 4));
    if (!utf16_or_32 && text.find('\0') != std::string::npos)
      fail({path},
           "is not a YAML file (it holds binary data); give a preset, a graph file, a run "
           "directory or a checkpoint");
  }
  if (first_line) *first_line = text.substr(0, text.find('\n'));
  try {
    std::istringstream scan(text);
    YAML::Parser parser(scan);
    DocumentCounter counter;
    std::optional<YAML::Mark> second;
    for (int docs = 0; docs < 3 && parser.HandleNextDocument(counter); ++docs) {
      counter.next_document();
      if (counter.stuck()) {
        const YAML::Mark& m = counter.last_null();
        const size_t pos = static_cast<size_t>(std::max(m.pos, 0));
        const unsigned char c = pos < text.size() ? static_cast<unsigned char>(text[pos]) : 0;
        fail({path, m.line + 1, m.column + 1},
             std::string("YAML syntax error: unexpected ") +
                 (c >= 0x20 && c < 0x7f ? "'" + std::string(1, static_cast<char>(c)) + "'"
                                        : std::string("character")));
      }
      if (docs == 1) second = counter.start();
    }
    if (second)
      fail({path, second->line + 1, second->column + 1},
           "a second YAML document ('---') is not read; keep the whole graph in one document");
    YAML::Node root = YAML::Load(text);
    std::set<int> checked;
    check_mapping_keys(root, path, checked);
    return root;
  } catch (const YAML::ParserException& e) {
    fail({path, e.mark.line + 1, e.mark.column + 1}, "YAML syntax error: " + e.msg);
  }
}

// Rejects keys outside `allowed`, pointing at the key and suggesting the closest.
void check_keys(const YAML::Node& map, const std::vector<std::string>& allowed,
                const std::string& file, const std::string& where) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    std::string key = it->first.as<std::string>();
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == key;
    if (!ok)
      fail(mark_of(it->first, file),
           where + "unknown key '" + key + "'" + did_you_mean(key, allowed));
  }
}

std::string scalar(const YAML::Node& n, const std::string& file, const std::string& what) {
  if (!n.IsScalar()) fail(mark_of(n, file), what + " must be a string");
  return n.as<std::string>();
}

// Where the value of `key` in `map` is: its own mark, or for an empty value (`kind:`), which
// yaml-cpp places at the next token (lines below, past comments), the key's.
SourceMark value_mark(const YAML::Node& map, const std::string& key, const std::string& file) {
  for (auto it = map.begin(); it != map.end(); ++it)
    if (it->first.IsScalar() && it->first.Scalar() == key)
      return it->second.IsNull() ? mark_of(it->first, file) : mark_of(it->second, file);
  return mark_of(map, file);
}

// The string value of `key` in `map`; an empty or non-string value is an error at the key.
std::string scalar_in(const YAML::Node& map, const std::string& key, const std::string& file) {
  const YAML::Node n = map[key];
  if (!n.IsScalar()) fail(value_mark(map, key, file), key + " must be a string");
  return n.as<std::string>();
}

// fs::exists that answers false, not an exception, for names the system refuses (too long).
bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

std::string parse_sized_for(const YAML::Node& n, const std::string& file) {
  std::string v = scalar(n, file, "sized_for");
  if (v != "cpu" && v != "gpu")
    fail(mark_of(n, file), "sized_for must be cpu or gpu, not '" + v + "'");
  return v;
}

bool has_yaml_suffix(const std::string& s) {
  return s.ends_with(".yaml") || s.ends_with(".yml");
}

// Finds a file named relative to `base_dir`, its parent, or the working directory.
// Absolute: a run's config.yaml names its graph and plugins so that eval, infer, the policy
// library and a resume find them from any folder.
std::optional<std::string> find_relative(const std::string& name, const fs::path& base_dir) {
  fs::path p(name);
  if (p.is_absolute()) return path_exists(p) ? std::optional(p.string()) : std::nullopt;
  for (const fs::path& dir : {base_dir, base_dir.parent_path(), fs::current_path()}) {
    fs::path c = dir / p;
    if (path_exists(c)) return fs::absolute(c).lexically_normal().string();
  }
  return std::nullopt;
}

std::vector<std::string> available_presets() {
  std::set<std::string> names;
  for (const auto& dir : preset_search_dirs()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (has_yaml_suffix(e.path().filename().string())) names.insert(e.path().stem().string());
  }
  return {names.begin(), names.end()};
}

std::string find_preset(const std::string& name_or_path, const SourceMark& mark,
                        const fs::path& relative_to) {
  if (has_yaml_suffix(name_or_path) || is_checkpoint_weights(name_or_path) ||
      name_or_path.find('/') != std::string::npos) {
    if (auto p = find_relative(name_or_path, relative_to)) return *p;
    fail(mark, "no such preset or graph file '" + name_or_path + "'");
  }
  if (!relative_to.empty()) {
    fs::path sibling = relative_to / (name_or_path + ".yaml");
    if (path_exists(sibling)) return sibling.string();
  }
  for (const auto& dir : preset_search_dirs()) {
    fs::path p = fs::path(dir) / (name_or_path + ".yaml");
    if (path_exists(p)) return p.string();
  }
  auto names = available_presets();
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  fail(mark, "unknown preset '" + name_or_path + "'" + did_you_mean(name_or_path, names) +
                 " (available: " + (list.empty() ? "none found" : list) + ")");
}

struct PresetLayers {
  std::optional<ConfigValue> graph;
  std::string description, sized_for;
  std::vector<std::pair<std::string, ConfigValue>> run;  // in order of application
  std::vector<std::pair<std::string, ConfigValue>> set;
};

void load_preset_chain(const std::string& path, std::vector<std::string>& chain,
                       PresetLayers& out) {
  for (const auto& c : chain)
    if (c == path) {
      std::string cycle;
      for (const auto& x : chain) cycle += x + " -> ";
      fail({path}, "preset extends itself: " + cycle + path);
    }
  chain.push_back(path);
  YAML::Node root = load_yaml(path);
  if (!root.IsMap()) fail(mark_of(root, path), "a preset must be a mapping of keys");
  check_keys(root, {"extends", "graph", "run", "set", "description", "sized_for"}, path,
             "preset: ");
  if (auto ext = root["extends"]) {
    std::string base = scalar(ext, path, "extends");
    std::string base_path = find_preset(base, mark_of(ext, path), fs::path(path).parent_path());
    load_preset_chain(base_path, chain, out);
  }
  if (auto g = root["graph"]) out.graph = ConfigValue{g, mark_of(g, path)};
  if (auto d = root["description"]) out.description = scalar(d, path, "description");
  if (auto z = root["sized_for"]) out.sized_for = parse_sized_for(z, path);
  for (const char* section : {"run", "set"}) {
    YAML::Node n = root[section];
    if (!n) continue;
    if (!n.IsMap())
      fail(value_mark(root, section, path), std::string(section) + " must be a mapping");
    auto& dst = std::string(section) == "run" ? out.run : out.set;
    for (auto it = n.begin(); it != n.end(); ++it)
      dst.emplace_back(it->first.as<std::string>(),
                       ConfigValue{it->second, mark_of(it->first, path)});
  }
}

// `at`: where the inputs are (the key's place when the value is empty).
std::vector<InputRef> parse_inputs(const YAML::Node& n, const std::string& file,
                                   const SourceMark& at) {
  std::vector<InputRef> refs;
  auto split = [&](const std::string& text, InputRef& r) {
    auto dot = text.find('.');
    r.stage = text.substr(0, dot);
    if (dot != std::string::npos) r.port = text.substr(dot + 1);
  };
  if (n.IsSequence()) {
    for (const auto& e : n) {
      InputRef r;
      r.mark = mark_of(e, file);
      split(scalar(e, file, "an input"), r);
      refs.push_back(r);
    }
  } else if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      InputRef r;
      r.mark = mark_of(it->second.IsNull() ? it->first : it->second, file);
      r.as_port = it->first.as<std::string>();
      if (!it->second.IsScalar()) fail(r.mark, "an input must be a string");
      split(it->second.as<std::string>(), r);
      refs.push_back(r);
    }
  } else if (n.IsScalar()) {
    InputRef r;
    r.mark = mark_of(n, file);
    split(n.as<std::string>(), r);
    refs.push_back(r);
  } else {
    fail(at, "inputs must be a list of stage names or a map port: stage.port");
  }
  return refs;
}

void load_graph_file(const std::string& path, Config& c) {
  YAML::Node root = load_yaml(path);
  if (!root.IsMap()) fail(mark_of(root, path), "a graph file must be a mapping of keys");
  check_keys(root, {"description", "sized_for", "plugins", "stages", "run"}, path, "graph: ");
  c.graph_file = path;
  if (auto d = root["description"]) c.description = scalar(d, path, "description");
  if (auto z = root["sized_for"]) c.sized_for = parse_sized_for(z, path);
  fs::path dir = fs::path(path).parent_path();
  if (auto pl = root["plugins"]) {
    if (!pl.IsSequence()) fail(mark_of(pl, path), "plugins must be a list of .so paths");
    for (const auto& p : pl) {
      std::string name = scalar(p, path, "a plugin");
      auto found = find_relative(name, dir);
      if (!found) {
        // Where it was looked for: beside the graph file, the folder above, the working one.
        // plan_graph says it, unless the kinds come from a plugin loaded otherwise (--plugin).
        const fs::path a = fs::absolute(dir);
        c.missing_plugins.emplace_back(
            "plugin '" + name + "' not found" +
                (fs::path(name).is_absolute()
                     ? std::string()
                     : " (a relative path is looked for from " + a.string() + ", " +
                           a.parent_path().string() + " and the working folder " +
                           fs::current_path().string() + ")"),
            mark_of(p, path));
        continue;
      }
      c.plugins.emplace_back(*found, mark_of(p, path));
    }
  }
  YAML::Node stages = root["stages"];
  if (!stages || !stages.IsSequence() || stages.size() == 0)
    fail(mark_of(stages ? stages : root, path), "graph: 'stages' must be a non-empty list");
  std::vector<ConfigIssue> issues;
  std::set<std::string> seen;
  for (const auto& s : stages) {
    if (!s.IsMap()) fail(mark_of(s, path), "each stage must be a mapping with name and kind");
    check_keys(s, {"name", "kind", "inputs", "params", "concurrency"}, path, "stage: ");
    StageConfig sc;
    sc.mark = mark_of(s, path);
    if (!s["name"]) fail(sc.mark, "stage without a 'name'");
    if (!s["kind"]) fail(sc.mark, "stage without a 'kind'");
    sc.name = scalar_in(s, "name", path);
    sc.kind = scalar_in(s, "kind", path);
    sc.kind_mark = value_mark(s, "kind", path);
    if (sc.name.empty() || sc.name.find_first_of(". =") != std::string::npos)
      issues.push_back(
          {mark_of(s["name"], path),
           "stage name '" + sc.name + "' must be non-empty without '.', '=' or spaces"});
    if (!seen.insert(sc.name).second)
      issues.push_back({mark_of(s["name"], path), "duplicate stage name '" + sc.name + "'"});
    if (auto in = s["inputs"]) {
      sc.inputs_mark = value_mark(s, "inputs", path);
      sc.inputs = parse_inputs(in, path, sc.inputs_mark);
    } else {
      sc.inputs_mark = sc.mark;
    }
    if (auto p = s["params"]) {
      if (!p.IsMap()) fail(value_mark(s, "params", path), "params must be a mapping");
      for (auto it = p.begin(); it != p.end(); ++it)
        sc.params[it->first.as<std::string>()] = {it->second, mark_of(it->first, path)};
    }
    if (auto cc = s["concurrency"]) sc.concurrency = ConfigValue{cc, mark_of(cc, path)};
    c.stages.push_back(std::move(sc));
  }
  if (!issues.empty()) throw ConfigError(issues);
  if (auto r = root["run"]) {
    if (!r.IsMap()) fail(value_mark(root, "run", path), "run must be a mapping");
    for (auto it = r.begin(); it != r.end(); ++it)
      c.run[it->first.as<std::string>()] = {it->second, mark_of(it->first, path)};
  }
}

// Applies one "stage.param" (or "run.key") assignment.
void apply_set(Config& c, const std::string& key, ConfigValue value) {
  auto dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size())
    fail(value.mark, "override '" + key + "' must look like stage.param or run.key");
  std::string stage = key.substr(0, dot), param = key.substr(dot + 1);
  if (stage == "run") {
    c.run[param] = std::move(value);
    return;
  }
  for (auto& s : c.stages)
    if (s.name == stage) {
      s.params[param] = std::move(value);
      return;
    }
  std::vector<std::string> names{"run"};
  for (const auto& s : c.stages) names.push_back(s.name);
  fail(value.mark,
       "override '" + key + "': no stage named '" + stage + "'" + did_you_mean(stage, names));
}

}  // namespace

ConfigError::ConfigError(std::vector<ConfigIssue> issues)
    : std::runtime_error(join_issues(issues)), issues_(std::move(issues)) {}

std::vector<std::string> preset_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* home = std::getenv("SLIPSTREAM_HOME"))
    dirs.push_back(std::string(home) + "/presets");
  dirs.push_back((fs::current_path() / "presets").string());
  // An installed slipstream: <prefix>/bin/slipstream and <prefix>/share/slipstream/presets.
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path shared = exe.parent_path().parent_path() / "share" / "slipstream" / "presets";
    if (fs::is_directory(shared, ec)) dirs.push_back(shared.string());
  }
#ifdef SLIPSTREAM_SOURCE_DIR_DEFAULT
  dirs.push_back(std::string(SLIPSTREAM_SOURCE_DIR_DEFAULT) + "/presets");
#endif
  return dirs;
}

std::pair<std::string, ConfigValue> parse_override(const std::string& assignment,
                                                   const std::string& expected) {
  SourceMark mark{"--set " + assignment};
  auto eq = assignment.find('=');
  if (eq == std::string::npos) fail(mark, "expected --set " + expected);
  YAML::Node value;
  const std::string text = assignment.substr(eq + 1);
  // `--set replays.paths=$DIR` with DIR unset: no value, never "none" (an empty list would
  // train on synthetic games instead of the replays meant).
  if (text.find_first_not_of(" \t") == std::string::npos)
    fail(mark,
         "no value after '=' (an unset shell variable?): give one ([] is an empty list, "
         "\"\" an empty string)");
  try {
    value = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    // A list or mapping that does not parse is a typo to point at, not a string to pass on.
    const size_t first = text.find_first_not_of(" \t");
    if (first != std::string::npos && (text[first] == '[' || text[first] == '{'))
      fail(mark,
           "malformed value '" + text + "': " + e.msg + " (a list is [a, b], a mapping {k: v})");
    value = YAML::Node(text);  // not YAML: take it as a plain string
  }
  return {assignment.substr(0, eq), ConfigValue{value, mark}};
}

Config load_config(const std::string& preset_or_file, const std::vector<std::string>& overrides) {
  Config c;
  std::string path = find_preset(preset_or_file, {"<command line>"}, {});
  // A checkpoint directory: the graph its weights carry.
  std::error_code ec;
  if (fs::is_directory(path, ec) && fs::exists(fs::path(path) / "model.safetensors", ec))
    path = (fs::path(path) / "model.safetensors").string();
  std::string first_line;
  YAML::Node root = load_yaml(path, &first_line);
  if (root.IsMap() && !root["stages"] && !root["graph"] && !root["extends"]) {
    // Neither a graph file nor a preset: point at the key that was probably meant.
    check_keys(root,
               {"stages", "plugins", "run", "description", "sized_for", "graph", "extends", "set"},
               path, "top level: ");
  }
  if (root.IsMap() && root["stages"]) {
    c.preset = fs::path(path).stem().string();
    load_graph_file(path, c);
    // A checkpoint's graph is always resolved_config_yaml's; a YAML file when it begins as that
    // does.
    c.resolved = is_checkpoint_weights(path) || first_line.starts_with(kResolvedHeader);
    if (c.resolved) {
      auto [name, file] = resolved_preset(first_line);
      if (!name.empty()) {
        c.preset = name;
        c.preset_file = file;
      }
    }
  } else {
    PresetLayers layers;
    std::vector<std::string> chain;
    load_preset_chain(path, chain, layers);
    c.preset = fs::path(path).stem().string();
    c.preset_file = path;
    if (!layers.graph) fail({path}, "preset names no graph (add `graph: configs/NAME.yaml`)");
    std::string g = scalar(layers.graph->node, layers.graph->mark.file, "graph");
    auto found = find_relative(g, fs::path(layers.graph->mark.file).parent_path());
    if (!found) fail(layers.graph->mark, "graph file '" + g + "' not found");
    load_graph_file(*found, c);
    if (!layers.description.empty()) c.description = layers.description;
    if (!layers.sized_for.empty()) c.sized_for = layers.sized_for;
    for (auto& [k, v] : layers.run) c.run[k] = v;
    for (auto& [k, v] : layers.set) apply_set(c, k, v);
  }
  for (const auto& o : overrides) {
    auto [key, value] = parse_override(o);
    apply_set(c, key, value);
  }
  return c;
}

std::string resolved_config_yaml(const Config& c, const std::map<std::string, Params>& stage_params,
                                 const Params& run_params) {
  std::ostringstream os;
  os << kResolvedHeader << "preset '" << c.preset << "'";
  if (!c.preset_file.empty()) os << " (" << c.preset_file << ")";
  os << ", graph " << c.graph_file << ".\n# Repeat this run: slipstream run --config THIS_FILE\n";
  if (!c.description.empty()) os << "description: " << param_value_str(c.description) << "\n";
  if (!c.sized_for.empty()) os << "sized_for: " << c.sized_for << "\n";
  // The graph's plugins, and those its kinds came from by another way (`slipstream --plugin`):
  // a resume, eval or the policy library reading this file needs them all.
  std::vector<std::string> plugins, canonical;
  auto add = [&](const std::string& p) {
    std::error_code ec;
    const std::string c = fs::weakly_canonical(p, ec).string();
    if (std::find(canonical.begin(), canonical.end(), c) != canonical.end()) return;
    canonical.push_back(c);
    plugins.push_back(p);
  };
  for (const auto& [p, m] : c.plugins) add(p);
  for (const auto& s : c.stages)
    if (std::string p = StageRegistry::plugin_of(s.kind); !p.empty()) add(p);
  if (!plugins.empty()) {
    os << "plugins:\n";
    for (const auto& p : plugins) os << "  - " << param_value_str(p) << "\n";
  }
  os << "run:\n";
  // Paths are written absolute (as they resolved for this run), with the text given as a comment.
  auto line = [&](const std::string& indent, const std::string& k, const Params::Entry& e) {
    os << indent << k << ": " << param_value_str(e.value);
    if (!e.as_given.empty()) os << "  # as given: " << e.as_given;
    os << "\n";
  };
  for (const auto& [k, e] : run_params.entries()) line("  ", k, e);
  os << "stages:\n";
  for (const auto& s : c.stages) {
    os << "  - name: " << s.name << "\n    kind: " << s.kind << "\n";
    if (!s.inputs.empty()) {
      os << "    inputs: {";
      bool mapped = false;
      for (const auto& r : s.inputs) mapped = mapped || !r.as_port.empty();
      if (!mapped) {
        os.seekp(-1, std::ios_base::cur);
        os << "[";
      }
      for (size_t i = 0; i < s.inputs.size(); ++i) {
        const auto& r = s.inputs[i];
        os << (i ? ", " : "");
        if (mapped) os << (r.as_port.empty() ? r.port : r.as_port) << ": ";
        os << r.stage << (r.port.empty() ? "" : "." + r.port);
      }
      os << (mapped ? "}\n" : "]\n");
    }
    if (s.concurrency) os << "    concurrency: " << s.concurrency->node.as<std::string>() << "\n";
    auto it = stage_params.find(s.name);
    if (it != stage_params.end() && !it->second.entries().empty()) {
      os << "    params:\n";
      for (const auto& [k, e] : it->second.entries()) line("      ", k, e);
    }
  }
  return os.str();
}

}  // namespace slipstream
