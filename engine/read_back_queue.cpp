#include "engine/read_back_queue.h"

#include <algorithm>
#include <cstring>

#include "kernels/step_recorder.h"

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

ReadBackQueue::ReadBackQueue(const Device& device, void* stream)
    : device_(device), stream_(stream) {}

ReadBackQueue::~ReadBackQueue() = default;

void ReadBackQueue::add(const void* buffer, size_t bytes,
                        std::function<void(const void* host)> on_host, int stage) {
  Tensor staging = Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::u8,
                                 Device::cpu(), "read-back staging");
  if (capture::recording_for(stream_)) {
    // A recorded step (a CUDA graph of it may replay): the step copies into device staging at a
    // place that is the same every step, and the copy to this step's host staging follows the
    // step's work, outside the graph.
    void* dev = device_staging(bytes);
    device_copy(dev, buffer, bytes);
    void* host = staging.raw();
    capture::after_enqueued(stream_, [this, host, dev, bytes] { copy(host, dev, bytes, false); });
  } else {
    copy(staging.raw(), buffer, bytes, false);
  }
  std::lock_guard lock(mu_);
  open_.push_back({std::move(staging), std::move(on_host), stage});
}

void ReadBackQueue::add_written(const void* host, std::function<void(const void* host)> on_host,
                                int stage) {
  std::lock_guard lock(mu_);
  open_.push_back({Tensor(), std::move(on_host), stage, host});
}

void ReadBackQueue::upload(void* buffer, const void* host, size_t bytes, int stage) {
  Tensor staging = Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::u8,
                                 Device::cpu(), "upload staging");
  std::memcpy(staging.raw(), host, bytes);
  if (capture::recording_for(stream_)) {
    // A recorded step: the host bytes reach device staging before the step's work (outside a
    // graph of it), the step copies them from there — the same place every step.
    void* dev = device_staging(bytes);
    {
      const capture::Unrecorded now;
      copy(dev, staging.raw(), bytes, true);
    }
    device_copy(buffer, dev, bytes);
  } else {
    copy(buffer, staging.raw(), bytes, true);
  }
  std::lock_guard lock(mu_);
  open_.push_back({std::move(staging), nullptr, stage});
}

void* ReadBackQueue::device_staging(size_t bytes) {
  constexpr size_t kAlign = 256;
  const size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  if (device_staging_.empty() || staged_ + need > device_staging_.back().nbytes()) {
    // Earlier buffers stay: graphs captured with them may still replay.
    const size_t size =
        std::max<size_t>({size_t{64} << 10, need,
                          device_staging_.empty() ? 0 : 2 * device_staging_.back().nbytes()});
    device_staging_.push_back(Tensor::empty({static_cast<int64_t>(size)}, DType::u8, device_,
                                            "read-back device staging", stream_));
    staged_ = 0;
  }
  void* p = static_cast<char*>(device_staging_.back().raw()) + staged_;
  staged_ += need;
  return p;
}

void ReadBackQueue::device_copy(void* dst, const void* src, size_t bytes) {
  if (device_.is_cpu()) {
    // The emulator's "device" is host memory: a memcpy in stream order (recorded with a step).
    capture::enqueue(
        "staging copy", stream_, [&] { return capture::key_of(dst, src, bytes); },
        [=] { std::memcpy(dst, src, bytes); });
    return;
  }
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::copy_device_async(device_.index, stream_, dst, src, bytes);
#endif
}

void ReadBackQueue::copy(void* dst, const void* src, size_t bytes, bool to_device) {
  if (device_.is_cpu()) return device_copy(dst, src, bytes);
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::copy_async(device_.index, stream_, dst, src, bytes, to_device);
#else
  (void)to_device;
#endif
}

uint64_t ReadBackQueue::close() {
  std::lock_guard lock(mu_);
  if (open_.empty()) return last_id_;
  staged_ = 0;  // the next step's device staging starts over (stream order keeps it safe)
  Group g;
  g.id = ++last_id_;
  if (spare_events_.empty()) {
    g.done = std::make_unique<StreamEvent>(device_);
  } else {
    g.done = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  g.done->record(stream_);  // after the group's copies
  g.items.swap(open_);
  closed_.push_back(std::move(g));
  return last_id_;
}

void ReadBackQueue::complete_through(uint64_t group, const Each& each) {
  for (;;) {
    Group g;
    {
      std::lock_guard lock(mu_);
      if (closed_.empty() || closed_.front().id > group) return;
      g = std::move(closed_.front());
      closed_.pop_front();
    }
    g.done->synchronize();
    struct Recycle {  // the event goes back to the spares however the reports end
      ReadBackQueue& q;
      Group& g;
      ~Recycle() {
        std::lock_guard lock(q.mu_);
        q.spare_events_.push_back(std::move(g.done));
      }
    } recycle{*this, g};
    for (Item& item : g.items) {
      if (!item.on_host) continue;  // an upload's staging, held until its copy was done
      const std::function<void()> report = [&item] {
        item.on_host(item.written ? item.written : item.staging.raw());
      };
      if (each)
        each(item.stage, report);
      else
        report();
    }
  }
}

void ReadBackQueue::complete_all(const Each& each) {
  complete_through(close(), each);
}

void ReadBackQueue::abandon() noexcept {
  std::deque<Group> groups;
  std::vector<Item> open;
  {
    std::lock_guard lock(mu_);
    groups.swap(closed_);
    open.swap(open_);
    staged_ = 0;  // the next step's device staging starts over, as close() has it
  }
  for (Group& g : groups) {
    try {
      g.done->synchronize();
    } catch (...) {
    }
  }
  if (!open.empty()) {  // not closed: no event of theirs yet
    try {
      StreamEvent done(device_);
      done.record(stream_);
      done.synchronize();
    } catch (...) {
    }
  }
}

}  // namespace slipstream
