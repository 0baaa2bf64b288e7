// The prefetch stage's ring of device slots: each batch's host tensors are copied into one slot
// (one device buffer, the tensors at 256-byte aligned offsets) on a copy stream of their own, so
// the copy of batch k+1 runs while the compute stream trains on batch k.
//
// Ordering, all on the device (the host never waits for the compute stream):
//   copy stream:    [wait: slot released] copies -> record `copied`
//   compute stream: [wait: `copied`] (the runner, BatchFence::wait) the step ... batch goes ->
//                   record `released` (the fence's destructor)
// A slot is handed to a new batch only when the batch before it has gone (its fence destroyed,
// so `released` is recorded) and no view of its buffer is left; otherwise the ring takes a new
// slot, so it grows to the number of batches held between the prefetch stage and the end of
// their steps at once (run.max_in_flight, one more while the runner's host runs a batch
// ahead, and the batches RunOptions::resident_batches keeps). The host tensors a copy reads stay
// held until its `copied` event is done: the loader cannot reuse page-locked memory the copy engine
// is still reading. That wait — for a copy issued a ring's turn earlier — is the only one the
// ring makes the host do, and it bounds how far the data side runs ahead of the device.
//
// How many batches' host memory is alive at once therefore depends on timing: a step slowed by
// another process on the GPU leaves more copies unfinished, and the host pool would grow in the
// middle of a run (a page-locked allocation in the hot loop). So the ring reserves in the host
// pool, for each batch layout it sees and whenever it gains a slot, the most that can be alive:
// the batches before the ring (run.max_in_flight, one the source is filling and one waiting at
// the limiter) and one per slot whose copy may still be reading.
//
// On the CPU backend nothing is copied (prefetch does not use the ring); under the emulator the
// ring runs with host buffers and synchronous copies, so the slot bookkeeping is exercised by
// every emulated run.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "engine/stage.h"

namespace slipstream {

class BatchRing {
 public:
  // `exec`: the run's execution context (its device and compute stream); `slots`: the ring's
  // starting size; `max_in_flight`: run.max_in_flight (0: unknown, nothing is reserved).
  BatchRing(std::shared_ptr<const ExecContext> exec, size_t slots, size_t max_in_flight = 0);
  ~BatchRing();
  BatchRing(const BatchRing&) = delete;
  BatchRing& operator=(const BatchRing&) = delete;

  // Copies the host tensors among `tensors` into a free slot (enqueued on the copy stream),
  // replaces each with its view of the slot and returns the fence the batch must carry. Tensors
  // already on the device, and undefined ones, are left as they are; with none to copy the
  // result is null.
  std::shared_ptr<BatchFence> load(std::span<Tensor* const> tensors);

  size_t slots() const;       // slots now
  uint64_t reallocs() const;  // slot buffers (re)allocated: the first fill, and growth of a shape
  // The most batches of one layout the host pool is reserved for (0 before the first load, and
  // for a ring that does not know run.max_in_flight).
  size_t host_batches_reserved() const;

  struct State;  // shared with the fences the ring hands out (batch_ring.cpp)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace slipstream
