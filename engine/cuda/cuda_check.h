// Internal: CUDA error checking that names the call, and a current-device guard.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace slipstream::cuda_rt {

// Throws std::runtime_error "cudaMalloc failed (cuda:0, 4 KiB): out of memory
// [cudaErrorMemoryAllocation]". Clears the runtime's last error first so it does not leak into
// the next unrelated check.
inline void check(cudaError_t err, const char* call, const std::string& context = {}) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  std::string msg = std::string(call) + " failed";
  if (!context.empty()) msg += " (" + context + ")";
  msg += std::string(": ") + cudaGetErrorString(err) + " [" + cudaGetErrorName(err) + "]";
  throw std::runtime_error(msg);
}

// Makes `index` the calling thread's current device for a scope, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != index)
      check(cudaSetDevice(index), "cudaSetDevice", "cuda:" + std::to_string(index));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    int cur = prev_;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
};

}  // namespace slipstream::cuda_rt
