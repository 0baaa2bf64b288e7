// See host_memory.h. cgroup v2 only (the unified hierarchy of current systemd, Docker and Slurm
// setups); a v1 or absent cgroup leaves MemAvailable as the figure.
#include "engine/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "engine/memory_pool.h"

namespace slipstream {
namespace {

std::optional<uint64_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return std::nullopt;
}

// A number from a cgroup file; nothing for "max" (no limit) or an unreadable file.
std::optional<uint64_t> cgroup_value(const std::string& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoull(text);
  } catch (...) {
    return std::nullopt;
  }
}

// A key of a cgroup's memory.stat ("file": its page cache, which the kernel reclaims before it
// kills anything).
std::optional<uint64_t> cgroup_stat(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return std::nullopt;
}

// The process's cgroup v2 folder ("0::/path" in /proc/self/cgroup).
std::optional<std::string> own_cgroup() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("0::")) return "/sys/fs/cgroup" + line.substr(3);
  return std::nullopt;
}

// The process's address space in use (VmSize in /proc/self/status).
std::optional<uint64_t> address_space_in_use() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("VmSize:")) return std::stoull(line.substr(7)) * 1024;
  return std::nullopt;
}

}  // namespace

std::optional<HostMemory> usable_host_memory() {
  std::optional<HostMemory> out;
  if (const auto avail = mem_available()) out = HostMemory{*avail, "MemAvailable"};
  if (const auto dir = own_cgroup()) {
    const auto limit = cgroup_value(*dir + "/memory.max");
    auto used = cgroup_value(*dir + "/memory.current");
    // In use less the page cache: cached file pages count in memory.current but are given back
    // under pressure.
    if (used)
      used = *used - std::min(*used, cgroup_stat(*dir + "/memory.stat", "file").value_or(0));
    if (limit && used) {
      const uint64_t left = *limit > *used ? *limit - *used : 0;
      if (!out || left < out->bytes)
        out = HostMemory{left, "cgroup memory.max (limit " + format_bytes(*limit) +
                                   ", in use without page cache " + format_bytes(*used) + ")"};
    }
  }
  // ulimit -v: an allocation past it fails (bad_alloc) whatever the machine has free.
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    if (const auto vm = address_space_in_use()) {
      const uint64_t limit = as.rlim_cur, left = limit > *vm ? limit - *vm : 0;
      if (!out || left < out->bytes)
        out = HostMemory{left, "ulimit -v (address space limit " + format_bytes(limit) +
                                   ", in use " + format_bytes(*vm) + ")"};
    }
  return out;
}

}  // namespace slipstream
