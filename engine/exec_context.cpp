#include "engine/exec_context.h"

#include <cstring>
#include <stdexcept>

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

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
