// Caching allocators with statistics: a host pool (page-locked when a CUDA device is in use, so
// copies to the device can be asynchronous) and, in CUDA builds, a device pool with size classes
// and stream-ordered reuse. The hot loop never reaches malloc/cudaMalloc once the caches are warm.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/device.h"

namespace slipstream {

struct PoolStats {
  uint64_t in_use_bytes = 0;    // handed out now
  uint64_t reserved_bytes = 0;  // obtained from the system (in use + cached)
  uint64_t peak_bytes = 0;      // max of in_use_bytes
  uint64_t allocations = 0;     // allocate() calls
  uint64_t failures = 0;        // allocate() calls that threw
};

// Thrown when a pool cannot satisfy a request even after releasing its cache. The message says
// what was being allocated, how much, the pool's state, and which knob to lower.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class MemoryPool {
 public:
  virtual ~MemoryPool() = default;
  // `what` names the allocation for error messages ("batch tensor replays.state", ...).
  // `stream` is the CUDA stream the block will be used on (nullptr: the default stream); ignored
  // by host pools.
  virtual void* allocate(size_t bytes, const char* what, void* stream = nullptr) = 0;
  virtual void deallocate(void* ptr, size_t bytes, void* stream = nullptr) = 0;
  virtual PoolStats stats() const = 0;
  // peak_bytes starts again from what is in use now (a measurement's window).
  virtual void reset_peak() = 0;
  virtual const std::string& name() const = 0;
  virtual Device device() const = 0;
  // Returns cached free blocks to the system (not called in the hot loop).
  virtual void release_cached() = 0;
  // Makes sure `blocks` blocks the size of `bytes` can be in use at once without reaching the
  // system: the high-water mark of a known number of buffers, reached before the hot loop rather
  // than whenever timing first asks for it. This version allocates `blocks` more and hands them
  // back (more than needed when some are in use); the host pool counts what it has.
  virtual void reserve(size_t bytes, size_t blocks, const char* what);
};

// Size class for caching: requests round up so that freed blocks are reusable by similar sizes.
// Up to 1 MiB: multiples of 512 B; above: multiples of 2 MiB, or of 1/8 of the request's power of
// two when that is larger (at most 12.5% waste from 16 MiB up; below that up to one 2 MiB step).
// See docs/memory.md.
size_t pool_size_class(size_t bytes);

// "512 B", "1.5 GiB": for messages and reports.
std::string format_bytes(uint64_t bytes);

// The process's pools. Host memory is pinned only when pinning is enabled (a CUDA run).
class Pools {
 public:
  static MemoryPool& host();
  static MemoryPool& device(int cuda_index);  // throws on a CPU-only build
  static MemoryPool& for_device(const Device& d) { return d.is_cpu() ? host() : device(d.index); }
  // Call before the first host allocation of a CUDA run.
  static void enable_pinned_host(bool on);
  // Every pool created so far (for stats publishing).
  static std::vector<MemoryPool*> all();
  // Hint appended to out-of-memory messages (e.g. "lower batches.batch_size (now 256)").
  // oom_hint() returns a generic hint until one is set.
  static void set_oom_hint(std::string hint);
  static std::string oom_hint();
};

}  // namespace slipstream
