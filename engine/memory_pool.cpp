#include "engine/memory_pool.h"
#include "engine/atomic_max.h"
#include "engine/host_memory.h"

#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <unordered_map>

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

namespace {
constexpr size_t kSmallStep = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kLargeStep = size_t{2} << 20;
constexpr size_t kHostAlignment = 64;  // cache line; also AVX-512 loads

size_t round_up(size_t n, size_t step) {
  return (n + step - 1) / step * step;
}
}  // namespace

size_t pool_size_class(size_t bytes) {
  if (bytes == 0) return kSmallStep;  // still a distinct block: pointers stay unique
  if (bytes <= kSmallLimit) return round_up(bytes, kSmallStep);
  if (bytes > (size_t{1} << 62)) return bytes;  // rounding could overflow; fails anyway
  return round_up(bytes, std::max(kLargeStep, std::bit_floor(bytes) / 8));
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  if (v - static_cast<double>(static_cast<uint64_t>(v)) < 0.05 || v >= 100)
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

namespace {

std::string host_available_memory() {
  const auto m = usable_host_memory();
  return m ? format_bytes(m->bytes) + " (" + m->source + ")" : std::string("unknown");
}

// Caching host allocator. Free lists per size class under one mutex (allocations are few per
// batch); statistics are atomics so readers (the stats publisher) never take the lock.
class HostPool final : public MemoryPool {
 public:
  void* allocate(size_t bytes, const char* what, void* /*stream*/) override {
    allocations_.fetch_add(1, std::memory_order_relaxed);
    const size_t cls = pool_size_class(bytes);
    std::unique_lock lock(mu_);
    void* p = nullptr;
    bool pinned = pinned_;
    if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = system_alloc(cls, pinned);
      if (!p) {  // drop the cache and try once more before giving up
        release_cached_locked();
        p = system_alloc(cls, pinned);
      }
      if (!p) {
        failures_.fetch_add(1, std::memory_order_relaxed);
        lock.unlock();
        throw OutOfMemoryError("out of host memory allocating " + format_bytes(bytes) + " for " +
                               (what ? what : "?") + (pinned ? " (page-locked)" : "") +
                               ": pool in use " + format_bytes(in_use_.load()) + ", reserved " +
                               format_bytes(reserved_.load()) + ", system available " +
                               host_available_memory() + "; " + Pools::oom_hint());
      }
      reserved_.fetch_add(cls, std::memory_order_relaxed);
    }
    live_.emplace(p, Live{cls, pinned});
    uint64_t now = in_use_.fetch_add(cls, std::memory_order_relaxed) + cls;
    raise_to(peak_, now);
    return p;
  }

  void deallocate(void* ptr, size_t bytes, void* /*stream*/) override {
    if (!ptr) return;
    std::lock_guard lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end())
      throw std::logic_error("host pool: deallocate of a block it does not own (double free?), " +
                             format_bytes(bytes));
    Live b = it->second;
    live_.erase(it);
    in_use_.fetch_sub(b.cls, std::memory_order_relaxed);
    if (b.pinned != pinned_) {  // pinning changed while it was out: not reusable as is
      system_free(ptr, b.pinned);
      reserved_.fetch_sub(b.cls, std::memory_order_relaxed);
      return;
    }
    free_[b.cls].push_back(ptr);
  }

  PoolStats stats() const override {
    return {in_use_.load(), reserved_.load(), peak_.load(), allocations_.load(), failures_.load()};
  }
  void reset_peak() override { peak_.store(in_use_.load()); }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device::cpu(); }

  void release_cached() override {
    std::lock_guard lock(mu_);
    release_cached_locked();
  }

  void reserve(size_t bytes, size_t blocks, const char* what) override {
    const size_t cls = pool_size_class(bytes);
    std::lock_guard lock(mu_);
    std::vector<void*>& cached = free_[cls];
    size_t have = cached.size();
    for (const auto& [p, b] : live_) have += b.cls == cls && b.pinned == pinned_;
    for (; have < blocks; ++have) {
      void* p = system_alloc(cls, pinned_);
      if (!p) {
        failures_.fetch_add(1, std::memory_order_relaxed);
        throw OutOfMemoryError("out of host memory reserving " + std::to_string(blocks) + " x " +
                               format_bytes(bytes) + " for " + (what ? what : "?") +
                               (pinned_ ? " (page-locked)" : "") + ": pool reserved " +
                               format_bytes(reserved_.load()) + ", system available " +
                               host_available_memory() + "; " + Pools::oom_hint());
      }
      reserved_.fetch_add(cls, std::memory_order_relaxed);
      cached.push_back(p);
    }
  }

  void set_pinned(bool on) {
    std::lock_guard lock(mu_);
    if (on == pinned_) return;
    pinned_ = on;
    release_cached_locked();  // cached blocks are of the old kind
    name_ = on ? "host (pinned)" : "host";
  }

 private:
  struct Live {
    size_t cls;
    bool pinned;
  };

  static void* system_alloc(size_t bytes, bool pinned) {
    if (bytes > (size_t{1} << 62)) return nullptr;  // beyond any address space
#if SLIPSTREAM_HAS_CUDA
    if (pinned) return cuda_rt::host_alloc_pinned(bytes);
#else
    (void)pinned;
#endif
    return std::aligned_alloc(kHostAlignment, round_up(bytes, kHostAlignment));
  }
  static void system_free(void* p, bool pinned) {
#if SLIPSTREAM_HAS_CUDA
    if (pinned) return cuda_rt::host_free_pinned(p);
#else
    (void)pinned;
#endif
    std::free(p);
  }

  void release_cached_locked() {
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) system_free(p, pinned_);
      reserved_.fetch_sub(cls * blocks.size(), std::memory_order_relaxed);
    }
    free_.clear();
  }

  mutable std::mutex mu_;
  bool pinned_ = false;
  std::string name_ = "host";
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, Live> live_;
  std::atomic<uint64_t> in_use_{0}, reserved_{0}, peak_{0}, allocations_{0}, failures_{0};
};

struct Registry {
  std::mutex mu;
  HostPool host;
  std::vector<std::unique_ptr<MemoryPool>> devices;  // by CUDA index; null until first use
  std::string oom_hint;
};

// Never destroyed: tensors held by static objects may be freed after main returns, and the
// CUDA runtime may already be gone by then.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

void MemoryPool::reserve(size_t bytes, size_t blocks, const char* what) {
  std::vector<void*> held;
  held.reserve(blocks);
  try {
    for (size_t i = 0; i < blocks; ++i) held.push_back(allocate(bytes, what));
  } catch (...) {
    for (void* p : held) deallocate(p, bytes);
    throw;
  }
  for (void* p : held) deallocate(p, bytes);
}

MemoryPool& Pools::host() {
  return registry().host;
}

MemoryPool& Pools::device(int cuda_index) {
#if SLIPSTREAM_HAS_CUDA
  CudaProbe p = probe_cuda();
  if (!p.available)
    throw std::runtime_error("no memory pool for cuda:" + std::to_string(cuda_index) + ": " +
                             p.reason);
  if (cuda_index < 0 || cuda_index >= static_cast<int>(p.devices.size()))
    throw std::runtime_error("no memory pool for cuda:" + std::to_string(cuda_index) +
                             ": this machine has " + std::to_string(p.devices.size()) +
                             " CUDA device(s)");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  if (r.devices.size() < p.devices.size()) r.devices.resize(p.devices.size());
  auto& pool = r.devices[static_cast<size_t>(cuda_index)];
  if (!pool) pool = cuda_rt::make_device_pool(cuda_index);
  return *pool;
#else
  throw std::runtime_error("no memory pool for cuda:" + std::to_string(cuda_index) +
                           ": this build has no CUDA support (configured with SLIPSTREAM_CUDA=OFF "
                           "or without nvcc)");
#endif
}

void Pools::enable_pinned_host(bool on) {
#if SLIPSTREAM_HAS_CUDA
  // Pinning needs a working driver; without one the run is on the CPU and pageable is right.
  if (on && !probe_cuda().available) on = false;
  registry().host.set_pinned(on);
#else
  (void)on;
#endif
}

std::vector<MemoryPool*> Pools::all() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<MemoryPool*> out{&r.host};
  for (auto& d : r.devices)
    if (d) out.push_back(d.get());
  return out;
}

void Pools::set_oom_hint(std::string hint) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.oom_hint = std::move(hint);
}

std::string Pools::oom_hint() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.oom_hint.empty() ? "lower the batch size or the number of batches in flight"
                            : r.oom_hint;
}

}  // namespace slipstream
