#include "engine/registry.h"

#include <dlfcn.h>

#include <algorithm>
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
  std::map<std::string, std::string> refused;  // plugin path -> the error its load gave
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
      d.duplicates.push_back(kind);
      return false;
    }
    throw std::runtime_error("stage kind '" + kind + "' is registered twice");
  }
  d.kinds.emplace(kind, std::move(schema));
  return true;
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

std::unique_ptr<Stage> StageRegistry::create(std::string_view kind) {
  const StageSchema* s = find(kind);
  if (!s || !s->factory) throw std::runtime_error("unknown stage kind '" + std::string(kind) + "'");
  return std::unique_ptr<Stage>(s->factory());
}

void StageRegistry::load_plugin(const std::string& path) {
  std::string canonical = path;
  std::error_code ec;
  auto abs = std::filesystem::weakly_canonical(path, ec);
  if (!ec) canonical = abs.string();
  {
    auto& d = data();
    std::lock_guard lock(d.mu);
    if (d.plugins.count(canonical)) return;
    if (auto it = d.refused.find(canonical); it != d.refused.end())
      throw std::runtime_error(it->second);  // its kinds stay as the first load left them
  }
  // The plugin's static initialisers call add(), which takes the lock: do not hold it here.
  auto& d = data();
  std::lock_guard one_at_a_time(d.loading);  // recursive: a plugin's initialiser may load one
  bool outer_loading = false;
  std::vector<std::string> outer_duplicates;  // a plugin loading this one: its own, kept
  size_t kinds_before = 0;
  {
    std::lock_guard lock(d.mu);
    outer_loading = std::exchange(d.plugin_loading, true);
    outer_duplicates = std::exchange(d.duplicates, {});
    kinds_before = d.kinds.size();
  }
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::lock_guard lock(d.mu);
  d.plugin_loading = outer_loading;
  const std::vector<std::string> duplicates = std::exchange(d.duplicates, outer_duplicates);
  if (!handle) {
    const char* err = dlerror();
    throw std::runtime_error("cannot load plugin '" + path + "': " + (err ? err : "unknown error"));
  }
  if (!duplicates.empty()) {
    // Its other kinds are registered (the library stays loaded); the load is refused, now and
    // whenever it is asked for again.
    std::string kinds;
    for (const auto& k : duplicates) kinds += (kinds.empty() ? "'" : ", '") + k + "'";
    const std::string error = "plugin '" + path + "' registers stage kind(s) " + kinds +
                              ", registered before it (by the program or a plugin loaded "
                              "earlier): rename the plugin's kind, or load only one of them";
    d.refused.emplace(canonical, error);
    throw std::runtime_error(error);
  }
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
}

}  // namespace slipstream
