#include "engine/exec_context.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

namespace {
thread_local int read_back_owner = -1;  // ExecContext::ReadBackOwner
}  // namespace

ExecContext::ExecContext(const Device& device, bool emulate_cuda, size_t blas_workspace_bytes)
    : device_(device) {
  if (device.is_cpu()) {
    backend_ = emulate_cuda ? KernelBackend::emulated : KernelBackend::cpu;
    return;
  }
  backend_ = KernelBackend::cuda;
#if SLIPSTREAM_HAS_CUDA
  stream_ = cuda_rt::create_stream(device.index);
  try {
    blas_handle_ = cuda_rt::create_blaslt(device.index);
    workspace_ = Tensor::empty({static_cast<int64_t>(blas_workspace_bytes)}, DType::u8, device,
                               "cuBLASLt workspace", stream_);
  } catch (...) {
    if (blas_handle_) cuda_rt::destroy_blaslt(blas_handle_);
    cuda_rt::destroy_stream(stream_);
    throw;
  }
#else
  (void)blas_workspace_bytes;
  throw std::runtime_error("device " + device.str() + ": this build has no CUDA support");
#endif
}

ExecContext::~ExecContext() {
#if SLIPSTREAM_HAS_CUDA
  if (!stream_) return;
  try {
    cuda_rt::synchronize_stream(device_.index, stream_);
  } catch (...) {
    // A failed stream has reported its error already; teardown goes on.
  }
  workspace_ = Tensor();
  if (blas_handle_) cuda_rt::destroy_blaslt(blas_handle_);
  cuda_rt::destroy_stream(stream_);
#endif
}

std::string ExecContext::describe() const {
  return backend_ == KernelBackend::emulated ? "the CUDA emulator" : device_.str();
}

void ExecContext::read_back(void* host, const void* buffer, size_t bytes) const {
  if (bytes == 0) return;
  if (device_.is_cpu()) {
    std::memcpy(host, buffer, bytes);
    return;
  }
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::copy_to_host_on(stream_, device_.index, host, buffer, bytes);
#endif
}

void ExecContext::read_back_later(const void* buffer, size_t bytes,
                                  std::function<void(const void* host)> on_host) const {
  Tensor staging = Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::u8,
                                 Device::cpu(), "read-back staging");
  if (device_.is_cpu()) {
    std::memcpy(staging.raw(), buffer, bytes);
  } else {
#if SLIPSTREAM_HAS_CUDA
    cuda_rt::copy_async(device_.index, stream_, staging.raw(), buffer, bytes, false);
#endif
  }
  std::lock_guard lock(read_backs_mu_);
  read_backs_.push_back({std::move(staging), std::move(on_host), read_back_owner});
}

void ExecContext::complete_read_backs(
    const std::function<void(int stage, const std::function<void()>& report)>& each) const {
  std::vector<PendingReadBack> done;
  {
    std::lock_guard lock(read_backs_mu_);
    done.swap(read_backs_);
  }
  if (done.empty()) return;
  synchronize();  // every copy asked so far is on the stream
  for (PendingReadBack& r : done) {
    const std::function<void()> report = [&r] { r.on_host(r.staging.raw()); };
    if (each)
      each(r.stage, report);
    else
      report();
  }
}

ExecContext::ReadBackOwner::ReadBackOwner(int stage) : previous_(read_back_owner) {
  read_back_owner = stage;
}

ExecContext::ReadBackOwner::~ReadBackOwner() {
  read_back_owner = previous_;
}

void ExecContext::synchronize() const {
#if SLIPSTREAM_HAS_CUDA
  if (stream_) cuda_rt::synchronize_stream(device_.index, stream_);
#endif
}

namespace {
std::string (*cpu_bf16_describer)() = nullptr;
}  // namespace

void set_cpu_bf16_description(std::string (*describe)()) {
  cpu_bf16_describer = describe;
}

std::string cpu_bf16_description() {
  return cpu_bf16_describer ? cpu_bf16_describer() : std::string();
}

}  // namespace slipstream
