// Caching device allocator: size classes (pool_size_class), stream-ordered reuse.
//
// A freed block goes back to its size class with the stream it was last used on and an event
// recorded on that stream. The same stream may take it again at once: stream order puts the new
// work after the old. Another stream takes it only once the event has completed, so no host sync
// is ever needed. While that stream's work is being recorded for a CUDA graph
// (kernels/step_recorder.h) the work that used the block is not enqueued yet: the block is
// marked pending, the same stream may still take it, and its event is recorded once the step's
// work is issued. cudaMalloc runs only on a cache miss; on failure the cache is released (cudaFree
// synchronises the device, so blocks still in flight are safe) and the call retried once.
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/atomic_max.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "kernels/step_recorder.h"

namespace slipstream::cuda_rt {

namespace {

class DevicePool final : public MemoryPool {
 public:
  explicit DevicePool(int index) : index_(index), name_("cuda:" + std::to_string(index)) {}

  void* allocate(size_t bytes, const char* what, void* stream) override {
    allocations_.fetch_add(1, std::memory_order_relaxed);
    const size_t cls = pool_size_class(bytes);
    auto s = static_cast<cudaStream_t>(stream);
    std::unique_lock lock(mu_);
    Block b{};
    if (!take_cached(cls, s, &b)) {
      try {
        b.ptr = device_malloc(cls, bytes, what);
      } catch (...) {
        failures_.fetch_add(1, std::memory_order_relaxed);
        throw;
      }
      reserved_.fetch_add(cls, std::memory_order_relaxed);
    }
    b.cls = cls;
    b.stream = s;
    live_.emplace(b.ptr, b);
    uint64_t now = in_use_.fetch_add(cls, std::memory_order_relaxed) + cls;
    raise_to(peak_, now);
    return b.ptr;
  }

  void deallocate(void* ptr, size_t bytes, void* stream) override {
    if (!ptr) return;
    std::lock_guard lock(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end())
      throw std::logic_error(name_ +
                             " pool: deallocate of a block it does not own (double free?), " +
                             format_bytes(bytes));
    Block b = it->second;
    live_.erase(it);
    in_use_.fetch_sub(b.cls, std::memory_order_relaxed);
    if (stream) b.stream = static_cast<cudaStream_t>(stream);
    if (capture::recording_for(b.stream)) {
      b.pending = true;
      free_[b.cls].push_back(b);
      if (!pending_scheduled_) {
        pending_scheduled_ = true;
        capture::after_enqueued(b.stream, [this] { record_pending(); });
      }
      return;
    }
    // Never throws from here (called from destructors): a block whose event cannot be recorded
    // (runtime shutting down) is simply not cached.
    if (!b.event && cudaEventCreateWithFlags(&b.event, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      b.event = nullptr;
    }
    if (!b.event || cudaEventRecord(b.event, b.stream) != cudaSuccess) {
      cudaGetLastError();
      free_block(b);
      return;
    }
    free_[b.cls].push_back(b);
  }

  PoolStats stats() const override {
    return {in_use_.load(), reserved_.load(), peak_.load(), allocations_.load(), failures_.load()};
  }
  void reset_peak() override { peak_.store(in_use_.load()); }
  const std::string& name() const override { return name_; }
  Device device() const override { return Device::cuda(index_); }

  void release_cached() override {
    std::lock_guard lock(mu_);
    release_cached_locked();
  }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t cls = 0;
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;
    bool pending = false;  // freed while its stream was recorded: no event yet
  };

  // The recorded step's work is issued: events for the blocks it freed.
  void record_pending() {
    std::lock_guard lock(mu_);
    pending_scheduled_ = false;
    for (auto& [cls, list] : free_)
      for (size_t i = 0; i < list.size();) {
        Block& b = list[i];
        if (!b.pending) {
          ++i;
          continue;
        }
        b.pending = false;
        if (!b.event && cudaEventCreateWithFlags(&b.event, cudaEventDisableTiming) != cudaSuccess)
          b.event = nullptr;
        if (!b.event || cudaEventRecord(b.event, b.stream) != cudaSuccess) {
          cudaGetLastError();
          free_block(b);
          list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        ++i;
      }
  }

  bool take_cached(size_t cls, cudaStream_t s, Block* out) {
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return false;
    auto& list = it->second;
    for (size_t i = list.size(); i-- > 0;) {  // newest first: likely still in cache (L2)
      if (list[i].stream == s) {
        *out = list[i];
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
        return true;
      }
    }
    for (size_t i = 0; i < list.size(); ++i) {  // oldest first: most likely done
      if (list[i].pending) continue;
      cudaError_t q = cudaEventQuery(list[i].event);
      if (q == cudaSuccess) {
        *out = list[i];
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
        return true;
      }
      if (q != cudaErrorNotReady) check(q, "cudaEventQuery", name_);
    }
    return false;
  }

  void* device_malloc(size_t cls, size_t bytes, const char* what) {
    DeviceGuard guard(index_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, cls);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached_locked();
      err = cudaMalloc(&p, cls);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      std::string dev = "unknown";
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        dev = format_bytes(free_b) + " of " + format_bytes(total_b);
      else
        cudaGetLastError();
      throw OutOfMemoryError(
          "out of device memory on " + name_ + " allocating " + format_bytes(bytes) + " for " +
          (what ? what : "?") + ": pool in use " + format_bytes(in_use_.load()) + ", reserved " +
          format_bytes(reserved_.load()) + ", device free " + dev + "; " + Pools::oom_hint());
    }
    check(err, "cudaMalloc", name_ + ", " + format_bytes(cls) + " for " + (what ? what : "?"));
    return p;
  }

  void free_block(const Block& b) {
    if (cudaFree(b.ptr) != cudaSuccess) cudaGetLastError();
    if (b.event && cudaEventDestroy(b.event) != cudaSuccess) cudaGetLastError();
    reserved_.fetch_sub(b.cls, std::memory_order_relaxed);
  }

  void release_cached_locked() {
    DeviceGuard guard(index_);
    for (auto& [cls, list] : free_) {
      // A pending block's work is still to be enqueued (a recorded step): it stays.
      std::vector<Block> keep;
      for (const Block& b : list)
        if (b.pending)
          keep.push_back(b);
        else
          free_block(b);
      list.swap(keep);
    }
  }

  const int index_;
  const std::string name_;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<Block>> free_;  // size class -> cached blocks
  std::unordered_map<void*, Block> live_;
  bool pending_scheduled_ = false;  // record_pending() is deferred to the recorded step's end
  std::atomic<uint64_t> in_use_{0}, reserved_{0}, peak_{0}, allocations_{0}, failures_{0};
};

}  // namespace

std::unique_ptr<MemoryPool> make_device_pool(int index) {
  return std::make_unique<DevicePool>(index);
}

}  // namespace slipstream::cuda_rt
