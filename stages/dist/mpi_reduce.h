// The MPI side of `allreduce`: initialisation (once per process), the bucketed average of
// gradients over all ranks overlapped with the backward pass, a deadline on every wait, and a
// sum of a few numbers (validation metrics). Nothing here is called unless the MPI backend is
// chosen.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "stages/dist/grad_buckets.h"

namespace slipstream::dist {

// MPI_Init_thread (MPI_THREAD_SERIALIZED: at any time one thread calls MPI, the reducer's helper
// thread during a step's reductions, the caller's otherwise) unless MPI is already initialised;
// MPI_Finalize at exit when we initialised it, or MPI_Abort when a wait timed out (a collective
// still in flight would make MPI_Finalize hang; the abort makes the launcher end every rank).
void mpi_init_once();
int mpi_world_size();
int mpi_rank();
bool mpi_is_initialized();

// True when the environment says a launcher started more than one rank (Open MPI, PMI/MPICH,
// Slurm). Reads environment variables only.
bool launched_with_multiple_ranks();

// Ends every rank of the run now (MPI_Abort), or this process when MPI is not initialised.
[[noreturn]] void mpi_abort_all(int code);

// data[0, bytes) = root's (blocking; e.g. NCCL's unique id from rank 0).
void mpi_broadcast(void* data, size_t bytes, int root);

// values = their sum (minimum, maximum) over all ranks (blocking, in place). A rank that does not
// answer within `timeout_s` ends the wait with an error naming `what`. This is also what runs
// of several ranks reduce their metric sums with (engine/rank_reduce.h: registered here, with a
// deadline of 300 s until the allreduce stage sets its own).
void mpi_reduce(std::span<double> values, RankReduce op, double timeout_s, const std::string& what);
// values = their average over all ranks (float sum, then times 1/world), as mpi_reduce.
void mpi_average(std::span<float> values, double timeout_s, const std::string& what);
// Rank 0's `all` = every rank's `mine` back to back in rank order, resized to fit (other ranks'
// `all` is left alone). Blocking, with the deadline; `what` names it in a timeout.
void mpi_gather_to_root(std::span<const float> mine, std::vector<float>& all, double timeout_s,
                        const std::string& what);
// ZeRO-1's collectives on a buffer split in rank order (rank r: counts[r] elements; displs[r],
// their position): `mine` = the average over the ranks of this rank's part of `data`; and every
// rank's part of `data` into every rank's `data`. Blocking, with the deadline.
void mpi_reduce_scatter_average(const float* data, std::span<const size_t> counts, float* mine,
                                double timeout_s, const std::string& what);
void mpi_allgather_in_place(float* data, std::span<const size_t> counts,
                            std::span<const size_t> displs, double timeout_s,
                            const std::string& what);

// Averages the gradients of `buckets` over all ranks, each bucket with MPI_Iallreduce(SUM) as
// soon as every parameter in it is final, posted in bucket order by a helper thread that also
// drives MPI's progress, so communication runs while the backward pass computes the earlier
// layers' gradients. Each rank also tells its right-hand neighbour (rank + 1) which step it has
// reached; when a wait times out, the rank whose left-hand neighbour never reached the step
// names that neighbour.
//
// With `shard` (ZeRO-1, sync.shard_optimizer) each bucket is reduce-scattered instead: rank r of
// W receives the average of the bucket's r-th W-th (its buffer split evenly), and only that part
// of its gradients is averaged. The optimizer updates those pieces (shard_pieces) and
// gather_weights all-gathers the updated weights bucket by bucket.
class MpiBucketReducer {
 public:
  MpiBucketReducer(GradBuckets buckets, double timeout_s, bool shard = false);
  ~MpiBucketReducer();
  MpiBucketReducer(const MpiBucketReducer&) = delete;
  MpiBucketReducer& operator=(const MpiBucketReducer&) = delete;

  // The backward pass of step `step` (1-based: the step being trained) has made parameter k's
  // gradient final (k: position in the list the buckets were built from). Idempotent per step.
  void param_ready(size_t k, uint64_t step);

  struct StepTiming {
    double comm_s = 0;     // first bucket posted .. last bucket averaged
    double exposed_s = 0;  // of that, what the caller waited after its backward pass ended
  };
  // Starts every bucket not started yet, waits for all, and leaves the averages in the
  // gradients. Throws (and marks MPI for abort at exit) when the other ranks do not answer
  // within the timeout.
  StepTiming finish(uint64_t step);

  const GradBuckets& buckets() const { return buckets_; }

  // ---- shard ----
  // The element ranges of the parameters whose averaged gradients rank `rank` receives, in
  // bucket order (the same lists on every rank).
  std::vector<GradBuckets::Range> shard_pieces(int rank) const;
  // Every rank's shard_pieces of the weights (Parameter::value) into every rank, after each
  // rank updated its own. Blocking, with the deadline; call after finish(step).
  void gather_weights(uint64_t step);
  // Rank 0's `all` = every rank's `mine` in rank order (others' untouched). Blocking, with the
  // deadline; `what` names it in a timeout.
  void gather_to_root(std::span<const float> mine, std::vector<float>& all,
                      const std::string& what);

 private:
  struct Mpi;  // the MPI handles (requests, heartbeat buffers), opaque to includers
  void worker();
  void start_step(uint64_t step);
  [[noreturn]] void timed_out(uint64_t step);

  GradBuckets buckets_;
  double timeout_s_;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<Mpi> mpi_;
  std::vector<std::vector<float>> staging_;  // per bucket that is not one block
  bool shard_ = false;
  std::vector<std::vector<int>> counts_, displs_;  // shard: per bucket, each rank's range
  std::vector<std::vector<float>> received_;       // shard: per bucket, this rank's average
  std::vector<std::vector<float>> value_staging_;  // shard: per bucket whose weights are apart

  // Caller's thread only.
  uint64_t step_ = 0;  // the step whose reductions are collecting (0: none)
  std::vector<size_t> pending_;
  std::vector<uint8_t> param_done_;

  // Shared with the worker, under mu_.
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<uint8_t> ready_;
  size_t ready_count_ = 0, done_count_ = 0;
  uint64_t active_step_ = 0;
  uint64_t generation_ = 0;  // one per collection: a step number may repeat
  bool stop_ = false;
  double first_post_s_ = 0, last_done_s_ = 0;
  std::atomic<int64_t> left_step_{-1};  // the last step rank - 1 said it reached
  std::thread thread_;
};

}  // namespace slipstream::dist
