// A second stream beside the compute stream, for host-to-device copies that overlap the step,
// and the events that order the two (and the host after either). On a CUDA device: a
// non-blocking stream and events without timing. On the CPU and under the emulator the same
// calls are synchronous: copies are memcpy, events are always complete, waits are no-ops — so
// code written against this (the prefetch stage's ring) runs, and is tested, on every backend.
#pragma once

#include <cstddef>

#include "engine/device.h"

namespace slipstream {

class StreamEvent {
 public:
  explicit StreamEvent(const Device& device);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  // Marks the end of the work enqueued on `stream` so far (a cudaStream_t; null: nothing to
  // mark, the event stays complete).
  void record(void* stream);
  // `stream`'s later work waits, on the device, for the work before the last record.
  void block(void* stream) const;
  bool done() const;         // the host asks; never waits
  void synchronize() const;  // the host waits

 private:
  Device device_;
  void* event_ = nullptr;  // cudaEvent_t
};

class CopyStream {
 public:
  explicit CopyStream(const Device& device);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  void* stream() const { return stream_; }  // cudaStream_t; null on the CPU
  // Enqueues a copy of `bytes` from host memory to the device (page-locked host memory makes it
  // asynchronous: leave the source untouched until an event recorded after it is done). On the
  // CPU, a memcpy.
  void to_device(void* dst, const void* src, size_t bytes);

 private:
  Device device_;
  void* stream_ = nullptr;
};

}  // namespace slipstream
