// The execution context every op of a run is issued in: the run's device, which kernels run
// there (the backend) and, on CUDA, the compute stream, a cuBLASLt handle and its workspace.
// One per process, made by the runner once the device is chosen and offered to stages as
// StageContext::exec(); the model stages pick their ops from it once, in setup
// (stages/ops/with_ops.h), and enqueue every op on its stream.
//
// The `emulated` backend runs the CUDA code path on the CPU: the .cu kernels compiled for the
// CPU emulator (kernels/emulation), host memory, no stream. `device: emulated` selects it, so a
// graph's device path can be checked end to end on a machine without a GPU.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/read_back_queue.h"
#include "engine/tensor.h"

namespace slipstream {

enum class KernelBackend { cpu, cuda, emulated };

class ExecContext {
 public:
  // On the CPU (and under the emulator) nothing is created. On CUDA: a non-blocking stream, a
  // cuBLASLt handle and `blas_workspace_bytes` from the device pool; errors name the CUDA call.
  explicit ExecContext(const Device& device, bool emulate_cuda = false,
                       size_t blas_workspace_bytes = size_t{32} << 20);
  ~ExecContext();
  ExecContext(const ExecContext&) = delete;
  ExecContext& operator=(const ExecContext&) = delete;

  // Where buffers live: the CUDA device, or the host (cpu and emulated backends).
  const Device& device() const { return device_; }
  KernelBackend backend() const { return backend_; }
  // True when ops run as CUDA kernels (on a device or under the emulator).
  bool device_ops() const { return backend_ != KernelBackend::cpu; }
  // "cpu", "cuda:0", "the CUDA emulator": for messages.
  std::string describe() const;
  void* stream() const { return stream_; }            // cudaStream_t; null on the CPU
  void* blas_handle() const { return blas_handle_; }  // cublasLtHandle_t; null on the CPU
  void* blas_workspace() const { return workspace_.defined() ? workspace_.raw() : nullptr; }
  size_t blas_workspace_bytes() const { return workspace_.defined() ? workspace_.nbytes() : 0; }
  // Waits for everything enqueued on the stream (the host phases: checkpoints, logging, tests).
  void synchronize() const;
  // Copies `bytes` of buffer memory (the context's device) to host memory, ordered after the
  // work queued on the stream, and waits for it (setup, tests, host phases).
  void read_back(void* host, const void* buffer, size_t bytes) const;
  // The same copy without waiting: into page-locked staging, after the work queued so far, with
  // `on_host` kept to run on the copy when its group completes (engine/read_back_queue.h).
  // Stages report what the device computed this way (the loss's sums, the optimizer's outcome),
  // so a step enqueues all of its work before the host waits for any of it. On the CPU and
  // under the emulator the copy is a memcpy, and `on_host` still waits for its group: the same
  // order everywhere.
  void read_back_later(const void* buffer, size_t bytes,
                       std::function<void(const void* host)> on_host) const;
  // Where the device's kernels may write `host` directly: for page-locked host memory (the host
  // pool's on a CUDA run), the address CUDA maps it at; under the emulator and on the CPU, `host`
  // itself. Null where kernels cannot reach it (pageable memory). A result written there is read
  // back with no copy (read_back_written).
  void* device_address_of_host(void* host) const;
  // A result the device's work writes into host memory itself (at device_address_of_host):
  // `on_host` runs on `host` when its group completes, as read_back_later's report would, with
  // no copy on the stream and none in a CUDA graph of the step. Nothing may write there again
  // before then: the caller's work completes its read-backs before it is enqueued again (a
  // stream's frame, Runner::stream_next).
  void read_back_written(const void* host, std::function<void(const void* host)> on_host) const;
  // Host values the device's work reads in stream order (a batch's random key): copied now
  // into page-locked staging, then to `buffer` on the stream, the staging held until the batch's
  // read-backs complete. Unlike a synchronous copy this can be part of a CUDA graph of the step
  // (engine/step_graphs.h): the graph copies from the same staging, which holds this step's value.
  void upload_later(void* buffer, const void* host, size_t bytes) const;
  // The read-backs asked since the last close become a group (the runner closes one when a
  // batch's work is enqueued); its number, for complete_read_backs_through.
  uint64_t close_read_backs() const;
  // Waits for the groups up to `group` (one event each) and runs their functions in the order
  // asked, on the calling thread. When a function throws, the ones after it are dropped and the
  // error goes on. `each`, when given, runs every function itself (`report()`), told the stage
  // that asked for it (the ReadBackOwner of the asking thread, -1 for none): the runner names
  // that stage in an error.
  void complete_read_backs_through(uint64_t group, const ReadBackQueue::Each& each = {}) const;
  // Everything asked so far: close_read_backs(), then complete through it (forward-only
  // batches: validation, scoring, streaming; tests).
  void complete_read_backs(const ReadBackQueue::Each& each = {}) const;
  // Everything asked so far dropped after a failed batch: the copies are waited for (their
  // staging is not freed under them; a failed wait is ignored) and no function runs, so none
  // writes later into memory its asker may have let go.
  void abandon_read_backs() const noexcept;

  // For its scope, read-backs asked on this thread belong to graph stage `stage` (the runner
  // sets it around a stage's batch hooks: forward, backward, step_end, validation_end, its
  // reports; elsewhere a read-back's owner is -1).
  class ReadBackOwner {
   public:
    explicit ReadBackOwner(int stage);
    ~ReadBackOwner();
    ReadBackOwner(const ReadBackOwner&) = delete;
    ReadBackOwner& operator=(const ReadBackOwner&) = delete;

   private:
    int previous_;
  };

 private:
  Device device_;
  KernelBackend backend_ = KernelBackend::cpu;
  void* stream_ = nullptr;
  void* blas_handle_ = nullptr;
  Tensor workspace_;
  std::unique_ptr<ReadBackQueue> read_backs_;  // on stream_; destroyed before it
};

// What precision bf16 does on this CPU, for the note a run prints at start: the library with the
// CPU kernels registers the function at load time (stages/nn/cpu_bf16_note.cpp), the engine
// knowing nothing of them; empty when none is registered.
void set_cpu_bf16_description(std::string (*describe)());
std::string cpu_bf16_description();

}  // namespace slipstream
