#include "engine/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

namespace slipstream {

namespace {
struct RegistryData {
  std::mutex mu;
  std::map<std::string, StageSchema, std::less<>> kinds;
  std::set<std::string> plugins;
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
  if (d.kinds.count(kind))
    throw std::runtime_error("stage kind '" + kind + "' is registered twice");
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
  }
  // The plugin's static initialisers call add(), which takes the lock: do not hold it here.
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    throw std::runtime_error("cannot load plugin '" + path + "': " + (err ? err : "unknown error"));
  }
  auto& d = data();
  std::lock_guard lock(d.mu);
  d.plugins.insert(canonical);
}

}  // namespace slipstream
