// See host_memory.h. cgroup v2 (the unified hierarchy of current systemd, Docker and Slurm
// setups) and v1 (its memory controller: older hosts, Slurm's cgroup/v1 plugin).
#include "engine/host_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
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

// What a cgroup leaves under its limit: the limit less its use besides page cache (cached file
// pages count in its use but are given back under pressure). Nothing without a limit.
std::optional<HostMemory> left_under(const std::string& limit_file, const std::string& usage_file,
                                     const std::string& stat_file, const std::string& cache_key,
                                     const std::string& what) {
  const auto limit = cgroup_value(limit_file);
  auto used = cgroup_value(usage_file);
  // v1 writes "no limit" as the largest page-aligned number.
  if (!limit || !used || *limit >= (uint64_t{1} << 60)) return std::nullopt;
  used = *used - std::min(*used, cgroup_stat(stat_file, cache_key).value_or(0));
  return HostMemory{*limit > *used ? *limit - *used : 0, what + " (limit " + format_bytes(*limit) +
                                                             ", in use without page cache " +
                                                             format_bytes(*used) + ")"};
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

std::optional<HostMemory> cgroup_memory_left(const std::string& self_cgroup,
                                             const std::string& root) {
  std::ifstream in(self_cgroup);
  std::optional<HostMemory> out;
  auto lower = [&](std::optional<HostMemory> m) {
    if (m && (!out || m->bytes < out->bytes)) out = std::move(m);
  };
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("0::")) {  // v2: "0::/path"
      const std::string dir = root + line.substr(3);
      lower(left_under(dir + "/memory.max", dir + "/memory.current", dir + "/memory.stat", "file",
                       "cgroup memory.max"));
      continue;
    }
    // v1: "N:CONTROLLERS:/path", the memory controller's hierarchy at ROOT/memory; in a
    // container the path is the host's and the container sees its own cgroup at the top.
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::istringstream controllers(line.substr(a + 1, b - a - 1));
    bool memory = false;
    for (std::string c; std::getline(controllers, c, ',');) memory = memory || c == "memory";
    if (!memory) continue;
    for (const std::string& dir : {root + "/memory" + line.substr(b + 1), root + "/memory"}) {
      std::error_code ec;
      if (!std::filesystem::exists(dir + "/memory.limit_in_bytes", ec)) continue;
      lower(left_under(dir + "/memory.limit_in_bytes", dir + "/memory.usage_in_bytes",
                       dir + "/memory.stat", "total_cache", "cgroup v1 memory.limit_in_bytes"));
      break;
    }
  }
  return out;
}

std::optional<HostMemory> usable_host_memory() {
  std::optional<HostMemory> out;
  if (const auto avail = mem_available()) out = HostMemory{*avail, "MemAvailable"};
  if (auto cgroup = cgroup_memory_left("/proc/self/cgroup", "/sys/fs/cgroup"))
    if (!out || cgroup->bytes < out->bytes) out = std::move(cgroup);
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
