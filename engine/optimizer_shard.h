// ZeRO-1: the optimizer's state split over the ranks of a run. The stage that reduces the
// gradients (allreduce with shard_optimizer) publishes this in setup, before the optimizer's
// setup; the optimizer then keeps moments for this rank's pieces only, updates only them, and
// calls gather_weights so that every rank holds every updated weight again.
//
// The runner calls gather_state on every rank at the same points, before a checkpoint may be
// written (a step some stage's step_end_reads_device() names, each validation pass, the end of a
// run that was not interrupted), so rank 0's save() holds the whole state and a checkpoint reads
// the same as one written without sharding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace slipstream {

struct Parameter;

struct OptimizerShard {
  // Elements [begin, begin + n) of one parameter's flat value and gradient.
  struct Piece {
    Parameter* param = nullptr;
    size_t begin = 0, n = 0;
  };
  int rank = 0, world = 1;
  // Every rank's pieces (the same lists on every rank): disjoint, and together every element of
  // every parameter the reducer holds. After the reduction, a rank's gradients are averaged over
  // the ranks on its own pieces only.
  std::vector<std::vector<Piece>> pieces;
  const std::vector<Piece>& mine() const { return pieces[static_cast<size_t>(rank)]; }

  // values = their sum over the ranks (in place). Collective, blocking (host values).
  std::function<void(std::span<double> values)> sum;
  // Device gradients (the nccl backend): *value, one double in the run's device memory, = its
  // sum over the ranks, enqueued on the run's compute stream. Null for host gradients.
  std::function<void(double* value)> sum_on_device;
  // After every rank updated its pieces: every rank's pieces' values into every rank's weights.
  // Collective: blocking for host weights; for device weights enqueued on the compute stream,
  // which then waits for it.
  std::function<void()> gather_weights;
  // Rank 0's `all` = every rank's `mine` back to back in rank order, resized to fit (other
  // ranks' `all` is left alone). Collective.
  std::function<void(std::span<const float> mine, std::vector<float>& all)> gather_to_root;

  // Set by the optimizer: brings its state whole to rank 0 (collective). The runner calls it and
  // notes the step in `gathered_step`; a checkpoint of another step cannot hold the state.
  std::function<void()> gather_state;
  uint64_t gathered_step = UINT64_MAX;
};

}  // namespace slipstream
