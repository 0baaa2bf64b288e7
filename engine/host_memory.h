// What memory this process can still take on the host: the kernel's MemAvailable, lowered to
// what the process's cgroup (a container's, Slurm's) leaves under its memory limit (v2's
// memory.max, v1's memory.limit_in_bytes) — the limit
// less what the cgroup uses besides page cache — since a job that passes its cgroup's limit is
// killed whatever the machine has free; and lowered to what an address space limit (ulimit -v,
// RLIMIT_AS) leaves past the process's VmSize, since allocations past it fail.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace slipstream {

struct HostMemory {
  uint64_t bytes = 0;  // usable now
  std::string source;  // "MemAvailable", or "cgroup memory.max (limit L, in use U)"
};

// Nothing when neither can be read (not Linux, no /proc).
std::optional<HostMemory> usable_host_memory();

// What the process's cgroups leave under their memory limits — v2 (memory.max) and v1 (the
// memory controller's memory.limit_in_bytes, page cache "total_cache" aside) — read from
// `self_cgroup` (/proc/self/cgroup) with the hierarchies under `root` (/sys/fs/cgroup); nothing
// without a limit. usable_host_memory's part, apart so tests give it other files.
std::optional<HostMemory> cgroup_memory_left(const std::string& self_cgroup,
                                             const std::string& root);

}  // namespace slipstream
