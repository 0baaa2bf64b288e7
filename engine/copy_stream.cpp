#include "engine/copy_stream.h"

#include <cstring>

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

StreamEvent::StreamEvent(const Device& device) : device_(device) {
#if SLIPSTREAM_HAS_CUDA
  if (device.is_cuda()) event_ = cuda_rt::create_event(device.index);
#endif
}

StreamEvent::~StreamEvent() {
#if SLIPSTREAM_HAS_CUDA
  if (event_) cuda_rt::destroy_event(event_);
#endif
}

void StreamEvent::record(void* stream) {
#if SLIPSTREAM_HAS_CUDA
  if (event_ && stream) cuda_rt::record_event(device_.index, event_, stream);
#else
  (void)stream;
#endif
}

void StreamEvent::block(void* stream) const {
#if SLIPSTREAM_HAS_CUDA
  if (event_ && stream) cuda_rt::stream_wait_event(device_.index, stream, event_);
#else
  (void)stream;
#endif
}

bool StreamEvent::done() const {
#if SLIPSTREAM_HAS_CUDA
  if (event_) return cuda_rt::event_done(device_.index, event_);
#endif
  return true;
}

void StreamEvent::synchronize() const {
#if SLIPSTREAM_HAS_CUDA
  if (event_) cuda_rt::event_synchronize(device_.index, event_);
#endif
}

CopyStream::CopyStream(const Device& device) : device_(device) {
#if SLIPSTREAM_HAS_CUDA
  if (device.is_cuda()) stream_ = cuda_rt::create_stream(device.index);
#endif
}

CopyStream::~CopyStream() {
#if SLIPSTREAM_HAS_CUDA
  if (!stream_) return;
  try {
    cuda_rt::synchronize_stream(device_.index, stream_);
  } catch (...) {
    // A failed copy has reported its error already; teardown goes on.
  }
  cuda_rt::destroy_stream(stream_);
#endif
}

void CopyStream::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
#if SLIPSTREAM_HAS_CUDA
  if (stream_) {
    cuda_rt::copy_async(device_.index, stream_, dst, src, bytes, true);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace slipstream
