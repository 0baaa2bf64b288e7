// The execution context every op of a run is issued in: the run's device and, on CUDA, the
// compute stream, a cuBLASLt handle and its workspace. One per process, made by the runner
// once the device is chosen and offered to stages as StageContext::exec(), for building device
// ops (stages/nn/device_ops.h) that enqueue on its stream. No stage uses it yet: every stage
// still runs on the CPU (docs/architecture.md, "Not built yet").
#pragma once

#include <cstddef>
#include <memory>

#include "engine/device.h"
#include "engine/tensor.h"

namespace slipstream {

class ExecContext {
 public:
  // On the CPU nothing is created. On CUDA: a non-blocking stream, a cuBLASLt handle and
  // `blas_workspace_bytes` from the device pool; errors name the CUDA call.
  explicit ExecContext(const Device& device, size_t blas_workspace_bytes = size_t{32} << 20);
  ~ExecContext();
  ExecContext(const ExecContext&) = delete;
  ExecContext& operator=(const ExecContext&) = delete;

  const Device& device() const { return device_; }
  void* stream() const { return stream_; }            // cudaStream_t; null on the CPU
  void* blas_handle() const { return blas_handle_; }  // cublasLtHandle_t; null on the CPU
  void* blas_workspace() const { return workspace_.defined() ? workspace_.raw() : nullptr; }
  size_t blas_workspace_bytes() const { return workspace_.defined() ? workspace_.nbytes() : 0; }
  // Waits for everything enqueued on the stream (the host phases: checkpoints, logging, tests).
  void synchronize() const;

 private:
  Device device_;
  void* stream_ = nullptr;
  void* blas_handle_ = nullptr;
  Tensor workspace_;
};

}  // namespace slipstream
