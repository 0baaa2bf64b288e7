#include "engine/exec_context.h"

#include <cstring>
#include <stdexcept>

#include "kernels/step_recorder.h"

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
    read_backs_ = std::make_unique<ReadBackQueue>(device, nullptr);
    return;
  }
  backend_ = KernelBackend::cuda;
#if SLIPSTREAM_HAS_CUDA
  stream_ = cuda_rt::create_stream(device.index);
  try {
    blas_handle_ = cuda_rt::create_blaslt(device.index);
    workspace_ = Tensor::empty({static_cast<int64_t>(blas_workspace_bytes)}, DType::u8, device,
                               "cuBLASLt workspace", stream_);
    read_backs_ = std::make_unique<ReadBackQueue>(device, stream_);
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
  read_backs_.reset();
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
    capture::sync_point("a synchronous read-back");
    std::memcpy(host, buffer, bytes);
    return;
  }
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::copy_to_host_on(stream_, device_.index, host, buffer, bytes);
#endif
}

void ExecContext::read_back_later(const void* buffer, size_t bytes,
                                  std::function<void(const void* host)> on_host) const {
  read_backs_->add(buffer, bytes, std::move(on_host), read_back_owner);
}

void* ExecContext::device_address_of_host(void* host) const {
  if (device_.is_cpu()) return host;  // the CPU, and the emulator's "device" memory
#if SLIPSTREAM_HAS_CUDA
  return cuda_rt::mapped_device_pointer(host);
#else
  return nullptr;
#endif
}

void ExecContext::read_back_written(const void* host,
                                    std::function<void(const void* host)> on_host) const {
  read_backs_->add_written(host, std::move(on_host), read_back_owner);
}

void ExecContext::upload_later(void* buffer, const void* host, size_t bytes) const {
  read_backs_->upload(buffer, host, bytes, read_back_owner);
}

void ExecContext::abandon_read_backs() const noexcept {
  read_backs_->abandon();
}

uint64_t ExecContext::close_read_backs() const {
  return read_backs_->close();
}

void ExecContext::complete_read_backs_through(uint64_t group,
                                              const ReadBackQueue::Each& each) const {
  read_backs_->complete_through(group, each);
}

void ExecContext::complete_read_backs(const ReadBackQueue::Each& each) const {
  read_backs_->complete_all(each);
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
