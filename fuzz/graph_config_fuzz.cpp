// libFuzzer target for the graph/preset YAML loader: any input must load and plan, or throw a
// ConfigError (which names file:line:col), never crash, hang or let another exception escape.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <typeinfo>

#include "engine/config.h"
#include "engine/graph.h"

namespace {

// One temp dir per process under $TMPDIR (parallel jobs must not share the file); the same
// file is rewritten each iteration.
const std::string& yaml_path() {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/graph_config_fuzz.XXXXXX";
    if (!::mkdtemp(dir.data())) std::abort();
    return dir + "/fuzz.yaml";
  }();
  return path;
}

bool contains(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
}

// Whether a line's first non-blank character is ','.
bool line_starts_with_comma(std::string_view text) {
  bool line_start = true;
  for (char c : text) {
    if (c == '\n' || c == '\r') {
      line_start = true;
    } else if (line_start && c != ' ' && c != '\t') {
      if (c == ',') return true;
      line_start = false;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // plugins: would dlopen whatever file the input names. Device and proc files (extends:
  // /dev/zero) never end: a user's choice, not a loader bug.
  if (contains(text, "plugins") || contains(text, "/dev") || contains(text, "/proc") ||
      contains(text, "/sys"))
    return 0;
  // yaml-cpp 0.7 loops forever on a ',' where a block token is expected, e.g. a file that is
  // just "," (fuzz/crashers/graph_config_yamlcpp_hang*.yaml): reported, skipped here.
  if (line_starts_with_comma(text)) return 0;
  {
    std::ofstream out(yaml_path(), std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!out) std::abort();
  }
  try {
    slipstream::Config config = slipstream::load_config(yaml_path(), {});
    (void)slipstream::plan_graph(std::move(config));
  } catch (const slipstream::ConfigError&) {
    return 0;  // the expected outcome for bad input
  } catch (const std::exception& e) {
    // The project's standard is a ConfigError naming file:line:col for every bad input.
    // GRAPH_FUZZ_REPORT_ONLY=1 logs the first of each exception type and goes on, to survey.
    static const bool report_only = std::getenv("GRAPH_FUZZ_REPORT_ONLY") != nullptr;
    static std::set<std::string> seen;
    if (!report_only || seen.insert(typeid(e).name()).second)
      std::fprintf(stderr, "graph_config_fuzz: %s escaped: %s\ninput: %s\n", typeid(e).name(),
                   e.what(), std::string(text.substr(0, 300)).c_str());
    if (!report_only) std::abort();
  }
  return 0;
}
