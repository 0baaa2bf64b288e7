#include "engine/read_back_queue.h"

#include <algorithm>
#include <cstring>

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
  if (device_.is_cpu()) {
    std::memcpy(staging.raw(), buffer, bytes);
  } else {
#if SLIPSTREAM_HAS_CUDA
    cuda_rt::copy_async(device_.index, stream_, staging.raw(), buffer, bytes, false);
#endif
  }
  std::lock_guard lock(mu_);
  open_.push_back({std::move(staging), std::move(on_host), stage});
}

uint64_t ReadBackQueue::close() {
  std::lock_guard lock(mu_);
  if (open_.empty()) return last_id_;
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
      const std::function<void()> report = [&item] { item.on_host(item.staging.raw()); };
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

}  // namespace slipstream
