// Process limits that would make a run hang instead of fail. A virtual memory limit (ulimit -v,
// RLIMIT_AS) counts address space, not memory: thread stacks, BLAS buffers and the CUDA runtime
// reserve far more than they touch, and OpenBLAS retries a failed map of its buffers forever
// (the run spins at 100% CPU with no message). Memory is bounded with a cgroup (Slurm --mem,
// docker --memory, systemd-run -p MemoryMax=), which counts what is resident.
#pragma once

#include <cstdint>
#include <string>

namespace slipstream {

// Below this an address-space limit is refused at start: a CPU run maps about 1.5 GiB on 2
// cores before it loads any data, more with more cores.
inline constexpr uint64_t kMinAddressSpaceBytes = uint64_t{4} << 30;

struct AddressSpaceCheck {
  std::string refusal;  // the limit is too low to run: what to do instead
  std::string note;     // a limit is set: what it can and cannot do
};
AddressSpaceCheck check_address_space_limit();

}  // namespace slipstream
