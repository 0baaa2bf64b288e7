#include "engine/registry.h"

#include "engine/sdk_abi.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace slipstream {

namespace {
struct RegistryData {
  std::mutex mu;
  std::map<std::string, StageSchema, std::less<>> kinds;
  std::set<std::string> plugins;
  // While load_plugin's dlopen runs (one plugin at a time: `loading`), the kinds it registers
  // that another registered before.
  std::recursive_mutex loading;
  bool plugin_loading = false;
  std::vector<std::string> duplicates;
  std::set<std::string> loaded_now;  // the kinds the loading plugin registered so far
  std::vector<std::string> twice;    // kinds the loading plugin itself registers twice
  std::vector<std::string> thrown;   // what its schema() calls threw
  std::string other_sdk;  // the SLIPSTREAM_SDK_ABI it was built with, when not this one's
  std::map<std::string, std::string> refused;  // plugin path -> the error its load gave
  std::map<std::string, std::string, std::less<>> plugin_of;  // kind -> the plugin it came from
  std::set<std::string> given;  // plugins loaded as `given` (slipstream --plugin)
};
RegistryData& data() {
  static RegistryData d;  // function-local: safe from static-initialisation order
  return d;
}
}  // namespace

bool StageRegistry::add(StageSchema schema) {
  auto& d = data();
  std::lock_guard lock(d.mu);
  std::string kind = schema.kind();
  if (d.kinds.count(kind)) {
    if (d.plugin_loading) {
      (d.loaded_now.count(kind) ? d.twice : d.duplicates).push_back(kind);
      return false;
    }
    throw std::runtime_error("stage kind '" + kind + "' is registered twice");
  }
  if (d.plugin_loading) d.loaded_now.insert(kind);
  d.kinds.emplace(kind, std::move(schema));
  return true;
}

bool StageRegistry::add_kind(StageSchema (*make)(), Stage* (*factory)(), const char* sdk_abi) {
  if (sdk_abi && std::strcmp(sdk_abi, SLIPSTREAM_SDK_ABI) != 0) {
    auto& d = data();
    std::lock_guard lock(d.mu);
    if (!d.plugin_loading)
      throw std::runtime_error(std::string("a stage built against other slipstream headers (") +
                               sdk_abi + ", this one's " + SLIPSTREAM_SDK_ABI + ")");
    d.other_sdk = sdk_abi;
    return false;
  }
  try {
    StageSchema s = make();
    s.factory = factory;
    return add(std::move(s));
  } catch (...) {
    auto& d = data();
    std::lock_guard lock(d.mu);
    if (!d.plugin_loading) throw;
    d.thrown.push_back(what_of_current_exception());
    return false;
  }
}

const StageSchema* StageRegistry::find(std::string_view kind) {
  auto& d = data();
  std::lock_guard lock(d.mu);
  auto it = d.kinds.find(kind);
  return it == d.kinds.end() ? nullptr : &it->second;
}

std::vector<const StageSchema*> StageRegistry::all() {
  auto& d = data();
  std::lock_guard lock(d.mu);
  std::vector<const StageSchema*> out;
  for (auto& [k, s] : d.kinds) out.push_back(&s);
  std::stable_sort(out.begin(), out.end(),
                   [](auto* a, auto* b) { return a->family_name() < b->family_name(); });
  return out;
}

std::string StageRegistry::plugin_of(std::string_view kind) {
  auto& d = data();
  std::lock_guard lock(d.mu);
  const auto it = d.plugin_of.find(kind);
  return it == d.plugin_of.end() ? std::string() : it->second;
}

bool StageRegistry::kind_from_given_plugin(std::string_view kind) {
  auto& d = data();
  std::lock_guard lock(d.mu);
  const auto it = d.plugin_of.find(kind);
  return it != d.plugin_of.end() && d.given.count(it->second);
}

std::unique_ptr<Stage> StageRegistry::create(std::string_view kind) {
  const StageSchema* s = find(kind);
  if (!s || !s->factory) throw std::runtime_error("unknown stage kind '" + std::string(kind) + "'");
  return std::unique_ptr<Stage>(s->factory());
}

void StageRegistry::load_plugin(const std::string& path, bool given) {
  std::string canonical = path;
  std::error_code ec;
  auto abs = std::filesystem::weakly_canonical(path, ec);
  if (!ec) canonical = abs.string();
  {
    auto& d = data();
    std::lock_guard lock(d.mu);
    if (d.plugins.count(canonical)) {
      if (given) d.given.insert(canonical);
      return;
    }
    if (auto it = d.refused.find(canonical); it != d.refused.end())
      throw std::runtime_error(it->second);  // its kinds stay as the first load left them
  }
  // The plugin's static initialisers call add(), which takes the lock: do not hold it here.
  auto& d = data();
  std::lock_guard one_at_a_time(d.loading);  // recursive: a plugin's initialiser may load one
  bool outer_loading = false;
  // A plugin loading this one: what its own load noted so far, kept.
  std::vector<std::string> outer_duplicates, outer_twice, outer_thrown;
  std::string outer_sdk;
  std::set<std::string> outer_loaded;
  size_t kinds_before = 0;
  {
    std::lock_guard lock(d.mu);
    outer_loading = std::exchange(d.plugin_loading, true);
    outer_duplicates = std::exchange(d.duplicates, {});
    outer_twice = std::exchange(d.twice, {});
    outer_thrown = std::exchange(d.thrown, {});
    outer_sdk = std::exchange(d.other_sdk, {});
    outer_loaded = std::exchange(d.loaded_now, {});
    kinds_before = d.kinds.size();
  }
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::lock_guard lock(d.mu);
  d.plugin_loading = outer_loading;
  const std::vector<std::string> duplicates = std::exchange(d.duplicates, outer_duplicates);
  const std::vector<std::string> twice = std::exchange(d.twice, outer_twice);
  const std::vector<std::string> thrown = std::exchange(d.thrown, outer_thrown);
  const std::string other_sdk = std::exchange(d.other_sdk, outer_sdk);
  for (const std::string& kind : d.loaded_now) d.plugin_of.emplace(kind, canonical);
  d.loaded_now = std::move(outer_loaded);
  if (!handle) {
    const char* err = dlerror();
    throw std::runtime_error("cannot load plugin '" + path + "': " + (err ? err : "unknown error"));
  }
  // Its other kinds are registered (the library stays loaded); the load is refused, now and
  // whenever it is asked for again.
  auto refuse = [&](const std::string& error) {
    d.refused.emplace(canonical, error);
    throw std::runtime_error(error);
  };
  auto listed = [](const std::vector<std::string>& kinds) {
    std::string out;
    for (const auto& k : kinds) out += (out.empty() ? "'" : ", '") + k + "'";
    return out;
  };
  if (!other_sdk.empty())
    refuse("plugin '" + path + "' was built against other slipstream headers (SDK " + other_sdk +
           "; this slipstream's: " + SLIPSTREAM_SDK_ABI +
           "): rebuild it against the headers of the slipstream that loads it (`cmake --install "
           "BUILD --component sdk`, or the build tree's own)");
  if (!thrown.empty())
    refuse("plugin '" + path +
           "': a stage's schema() threw while the plugin loaded: " + thrown.front() +
           (thrown.size() > 1 ? " (and " + std::to_string(thrown.size() - 1) + " more)" : ""));
  if (!twice.empty())
    refuse("plugin '" + path + "' registers stage kind(s) " + listed(twice) +
           " twice (two of its classes name the same kind): rename one");
  if (!duplicates.empty())
    refuse("plugin '" + path + "' registers stage kind(s) " + listed(duplicates) +
           ", registered before it (by the program or a plugin loaded earlier): rename the "
           "plugin's kind, or load only one of them");
  if (d.kinds.size() == kinds_before) {
    // Another library (a typo in the path, a dependency named instead of the plugin): a graph
    // naming its kinds would fail later with "unknown kind", far from the cause.
    const std::string error = "plugin '" + path +
                              "' registers no stage kind (SLIPSTREAM_REGISTER_STAGE): not a "
                              "slipstream stage plugin, or one already linked into the program";
    d.refused.emplace(canonical, error);
    throw std::runtime_error(error);
  }
  d.plugins.insert(canonical);
  if (given) d.given.insert(canonical);
}

}  // namespace slipstream
