#include "engine/resource_limits.h"

#include <sys/resource.h>

#include "engine/memory_pool.h"

namespace slipstream {

AddressSpaceCheck check_address_space_limit() {
  AddressSpaceCheck out;
  rlimit l{};
  if (getrlimit(RLIMIT_AS, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return out;
  const std::string limit = format_bytes(static_cast<uint64_t>(l.rlim_cur));
  const std::string instead =
      "bound memory with a cgroup instead (Slurm --mem, docker --memory, systemd-run -p "
      "MemoryMax=), which counts resident memory";
  if (l.rlim_cur < kMinAddressSpaceBytes) {
    out.refusal = "a virtual memory limit (ulimit -v) of " + limit + " is set, below the " +
                  format_bytes(kMinAddressSpaceBytes) +
                  " of address space a run needs (thread stacks, BLAS buffers and libraries map "
                  "more than they use, and OpenBLAS waits forever when a map fails): raise it "
                  "(ulimit -v unlimited) and " +
                  instead;
    return out;
  }
  out.note = "note: a virtual memory limit (ulimit -v) of " + limit +
             " is set; should the run reach it, OpenBLAS may stop making progress instead of "
             "failing: " +
             instead;
  return out;
}

}  // namespace slipstream
