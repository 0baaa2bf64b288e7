#include "stages/data/batch_ring.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "engine/copy_stream.h"
#include "engine/memory_pool.h"

namespace slipstream {

namespace {
constexpr size_t kAlign = 256;  // cudaMalloc's alignment: every view starts like a fresh tensor

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

struct BatchRing::State {
  struct Slot {
    explicit Slot(const Device& d) : copied(d), released(d) {}
    Tensor buffer;             // the slot's device bytes, allocated for the copy stream
    StreamEvent copied;        // copy stream, after the slot's copies
    StreamEvent released;      // compute stream, when the slot's batch went
    std::vector<Tensor> host;  // what the last copy read, held until `copied` is done
    bool held = false;         // a batch holds the slot (its fence is alive)
    bool released_once = false;
  };

  State(std::shared_ptr<const ExecContext> e, size_t in_flight)
      : exec(std::move(e)), copy(exec->device()), max_in_flight(in_flight) {}

  // The host pool holds blocks for as many batches of this layout (size class -> blocks a batch
  // takes) as can be alive at once (batch_ring.h); reserved again when the ring gains a slot.
  void reserve_host(const std::map<size_t, size_t>& layout) {
    if (max_in_flight == 0) return;
    const size_t batches = max_in_flight + 2 + slots.size();
    size_t& done = reserved[layout];
    if (done >= batches) return;
    for (const auto& [cls, per_batch] : layout)
      Pools::host().reserve(cls, per_batch * batches, "the loader's batches awaiting their copies");
    done = batches;
  }

  std::shared_ptr<const ExecContext> exec;
  CopyStream copy;
  size_t max_in_flight;
  std::map<std::map<size_t, size_t>, size_t> reserved;  // batch layout -> batches reserved for
  std::mutex mu;
  std::vector<std::unique_ptr<Slot>> slots;
  size_t cursor = 0;
  uint64_t reallocs = 0;
  std::string failure;  // a fence's destructor could not record `released` (reported at load)
};

namespace {

class SlotFence final : public BatchFence {
 public:
  SlotFence(std::shared_ptr<BatchRing::State> state, BatchRing::State::Slot* slot)
      : state_(std::move(state)), slot_(slot) {}

  void wait(const ExecContext& exec) override { slot_->copied.block(exec.stream()); }

  ~SlotFence() override {
    std::lock_guard lock(state_->mu);
    try {
      slot_->released.record(state_->exec->stream());
      slot_->released_once = true;
      slot_->held = false;
    } catch (const std::exception& e) {
      // The slot stays held (never reused: its last reader is unknown); the next load says why.
      if (state_->failure.empty()) state_->failure = e.what();
    }
  }

 private:
  std::shared_ptr<BatchRing::State> state_;
  BatchRing::State::Slot* slot_;
};

}  // namespace

BatchRing::BatchRing(std::shared_ptr<const ExecContext> exec, size_t slots, size_t max_in_flight)
    : state_(std::make_shared<State>(std::move(exec), max_in_flight)) {
  for (size_t i = 0; i < slots; ++i)
    state_->slots.push_back(std::make_unique<State::Slot>(state_->exec->device()));
}

BatchRing::~BatchRing() = default;

size_t BatchRing::slots() const {
  std::lock_guard lock(state_->mu);
  return state_->slots.size();
}

uint64_t BatchRing::reallocs() const {
  std::lock_guard lock(state_->mu);
  return state_->reallocs;
}

size_t BatchRing::host_batches_reserved() const {
  std::lock_guard lock(state_->mu);
  size_t most = 0;
  for (const auto& [layout, batches] : state_->reserved) most = std::max(most, batches);
  return most;
}

std::shared_ptr<BatchFence> BatchRing::load(std::span<Tensor* const> tensors) {
  // Where each host tensor goes in the slot.
  std::vector<size_t> offsets;
  std::vector<Tensor*> moved;
  std::map<size_t, size_t> layout;  // the host pool's size class -> tensors of the batch
  size_t bytes = 0;
  for (Tensor* t : tensors) {
    if (!t->defined() || !t->device().is_cpu()) continue;
    offsets.push_back(bytes);
    moved.push_back(t);
    bytes += align_up(std::max<size_t>(t->nbytes(), 1));
    ++layout[pool_size_class(t->nbytes())];
  }
  if (moved.empty()) return nullptr;

  State& s = *state_;
  std::lock_guard lock(s.mu);
  if (!s.failure.empty())
    throw std::runtime_error("prefetch: marking a batch's slot free failed: " + s.failure);
  // Host memory of copies that have finished goes back to the loader now.
  for (auto& slot : s.slots)
    if (!slot->host.empty() && slot->copied.done()) slot->host.clear();

  // A slot no batch holds and no view of which is left, from the cursor on; else a new one.
  State::Slot* slot = nullptr;
  const size_t n = s.slots.size();
  for (size_t i = 0; i < n && !slot; ++i) {
    State::Slot* c = s.slots[(s.cursor + i) % n].get();
    if (!c->held && (!c->buffer.defined() || c->buffer.storage_users() == 1)) {
      slot = c;
      s.cursor = (s.cursor + i + 1) % n;
    }
  }
  if (!slot) {
    s.slots.push_back(std::make_unique<State::Slot>(s.exec->device()));
    slot = s.slots.back().get();
    s.cursor = 0;
  }
  s.reserve_host(layout);

  void* copy_stream = s.copy.stream();
  // The compute stream is done with the slot's previous batch before the copy stream writes it
  // (or, when the buffer grows, frees it: the pool orders the free on the copy stream).
  if (slot->released_once) slot->released.block(copy_stream);
  if (!slot->buffer.defined() || slot->buffer.nbytes() < bytes) {
    slot->buffer = Tensor();
    slot->buffer = Tensor::empty({static_cast<int64_t>(bytes)}, DType::u8, s.exec->device(),
                                 "prefetch slot (the batch's tensors on the device)", copy_stream);
    ++s.reallocs;
  }
  // The previous copy into the slot has read its host tensors before they go back.
  if (!slot->host.empty()) {
    slot->copied.synchronize();
    slot->host.clear();
  }

  for (size_t i = 0; i < moved.size(); ++i) {
    Tensor& t = *moved[i];
    s.copy.to_device(static_cast<char*>(slot->buffer.raw()) + offsets[i], t.raw(), t.nbytes());
    slot->host.push_back(t);
    t = slot->buffer.view_bytes(offsets[i], t.shape(), t.dtype());
  }
  slot->copied.record(copy_stream);
  // Synchronous copies (CPU, emulator) are done: nothing to hold.
  if (!copy_stream) slot->host.clear();
  slot->held = true;
  return std::make_shared<SlotFence>(state_, slot);
}

}  // namespace slipstream
