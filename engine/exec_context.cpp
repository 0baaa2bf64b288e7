#include "engine/exec_context.h"

#include <stdexcept>

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

ExecContext::ExecContext(const Device& device, size_t blas_workspace_bytes) : device_(device) {
  if (device.is_cpu()) return;
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

void ExecContext::synchronize() const {
#if SLIPSTREAM_HAS_CUDA
  if (stream_) cuda_rt::synchronize_stream(device_.index, stream_);
#endif
}

}  // namespace slipstream
