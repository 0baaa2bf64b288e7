// The NCCL side of `allreduce`: device gradients averaged over the ranks with
// ncclAllReduce(ncclAvg) on a communication stream of their own. Each bucket is enqueued as soon
// as the backward pass has enqueued the work that makes it final (an event recorded on the
// compute stream orders the two), so the device reduces the last layers' gradients while it
// computes the earlier ones; the compute stream waits for the last bucket before the optimizer's
// kernels, and the host never waits (a watchdog thread does, for a rank that stops). The fork,
// the collectives and the join go through the step recorder, so a training step captured as a
// CUDA graph holds its reductions too. NCCL is opened at run time (libnccl.so.<major>), so a
// binary that never chooses this backend does not need it. On the emulated device (host memory,
// no NCCL) the same reducer averages its buckets with MPI on the host, blocking, so the
// backend's bookkeeping and its capture run multi-rank in CI.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/device.h"
#include "stages/dist/grad_buckets.h"

namespace slipstream::dist {

// True in builds with CUDA (where this backend exists on GPUs; the emulated device has it in
// every build).
bool nccl_built();

class NcclBucketReducer {
 public:
  // `compute_stream`: the run's cudaStream_t (ExecContext::stream()). With world > 1, rank 0
  // creates the NCCL id and broadcasts it over MPI (initialised by the caller); a one-rank
  // communicator needs no MPI.
  // With world > 1 a watchdog thread checks that each step's reductions complete on the device
  // within `timeout_s` of being enqueued; when they do not (a rank stopped and the others wait
  // in the collective), it says so naming the step and ends every rank through MPI_Abort.
  // `emulated`: the run's device is the emulator (compute_stream null, buckets in host memory);
  // the averages go through MPI (initialised by the caller when world > 1), each wait bounded by
  // `timeout_s`.
  // `shard` (ZeRO-1, world > 1): each bucket is reduce-scattered instead, rank r of W receiving
  // the average of its range of the bucket's buffer (GradBuckets::shard_begin); the optimizer
  // updates those pieces (shard_pieces) and gather_weights all-gathers the weights.
  NcclBucketReducer(GradBuckets buckets, void* compute_stream, int rank, int world,
                    double timeout_s, bool emulated = false, bool shard = false);
  ~NcclBucketReducer();
  NcclBucketReducer(const NcclBucketReducer&) = delete;
  NcclBucketReducer& operator=(const NcclBucketReducer&) = delete;

  // The backward pass of step `step` has enqueued everything that writes parameter k's gradient
  // (k: position in the list the buckets were built from). Idempotent per step.
  void param_ready(size_t k, uint64_t step);
  // Enqueues every bucket not enqueued yet and makes the compute stream wait for all of them.
  void finish(uint64_t step);

  // ---- shard ----
  // The element ranges of the parameters whose averaged gradients rank `rank` receives, in
  // bucket order (the same lists on every rank); empty without shard.
  std::vector<GradBuckets::Range> shard_pieces(int rank) const;
  // Enqueued on the compute stream after the optimizer's update of this rank's pieces: every
  // rank's pieces of the weights into every rank; the compute stream then waits for them.
  void gather_weights();
  // Enqueued on the compute stream: *value (one double in the run's device memory) = its sum
  // over the ranks (the gradient norm's squares), the compute stream waiting for it.
  void sum(double* value);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slipstream::dist
