// Results a device computed, on their way to the host without a wait in the step
// (ExecContext::read_back_later): each is copied into page-locked staging on the compute stream
// when asked, and its report (a function of the host copy) runs when its group completes. A group
// is what was asked between two close() calls — the runner closes one when a batch's work is
// enqueued — and it completes with one wait for an event recorded at its close, so the host can
// enqueue batch k+1 before it reads batch k's results. On the CPU and under the emulator the
// copies are memcpy and the events always complete, but reports still wait for their group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/copy_stream.h"
#include "engine/device.h"
#include "engine/tensor.h"

namespace slipstream {

class ReadBackQueue {
 public:
  // Runs report() for the stage that asked (-1: none); the runner names that stage in errors.
  using Each = std::function<void(int stage, const std::function<void()>& report)>;

  ReadBackQueue(const Device& device, void* stream);
  ~ReadBackQueue();
  ReadBackQueue(const ReadBackQueue&) = delete;
  ReadBackQueue& operator=(const ReadBackQueue&) = delete;

  void add(const void* buffer, size_t bytes, std::function<void(const void* host)> on_host,
           int stage);
  // A result the device's work writes into `host` itself (mapped page-locked memory): nothing to
  // copy; on_host(host) runs when the open group completes.
  void add_written(const void* host, std::function<void(const void* host)> on_host, int stage);
  // The other way: `bytes` of host memory copied now into page-locked staging, then to `buffer`
  // (the device's) in stream order; the staging is held until the open group completes.
  void upload(void* buffer, const void* host, size_t bytes, int stage);
  // Ends the open group (an event on the stream after it) and returns its number; with nothing
  // asked since the last close, no group: the number of the last one (0 before any).
  uint64_t close();
  // Waits for the groups up to `group` and runs their reports, in order, on the calling thread.
  // When a report throws, the reports after it in those groups are dropped and the error goes on.
  void complete_through(uint64_t group, const Each& each = {});
  // close(), then complete_through() of everything.
  void complete_all(const Each& each = {});
  // Everything asked so far waited for (a failed wait ignored) and dropped, no report run.
  void abandon() noexcept;

 private:
  void copy(void* dst, const void* src, size_t bytes, bool to_device);  // on the stream
  void device_copy(void* dst, const void* src, size_t bytes);           // on the stream
  void* device_staging(size_t bytes);  // this step's next place in device staging

  struct Item {
    Tensor staging;
    std::function<void(const void*)> on_host;  // null for an upload
    int stage = -1;
    const void* written = nullptr;  // add_written's host memory (no staging)
  };
  struct Group {
    uint64_t id = 0;
    std::unique_ptr<StreamEvent> done;
    std::vector<Item> items;
  };

  Device device_;
  void* stream_;
  std::mutex mu_;
  std::vector<Item> open_;
  std::deque<Group> closed_;
  std::vector<std::unique_ptr<StreamEvent>> spare_events_;  // events of completed groups
  uint64_t last_id_ = 0;
  // A recorded step's read-backs and uploads pass through device memory at fixed places
  // (engine/step_graphs.h): the buffers (the last one in use) and the step's offset in it.
  std::vector<Tensor> device_staging_;
  size_t staged_ = 0;
};

}  // namespace slipstream
