// Run by allreduce_mpi_test under `mpirun -np 2` and `-np 3`: each rank fills gradients with
// rank-dependent values (three parameters in one flat store, two on their own), averages them
// through the allreduce stage's reducer with small buckets (in-place and staged buckets,
// parameters straddling buckets), announcing parameters one by one in a rank-dependent order,
// three times (steps 1, 2 and 2 again), and checks the mean. Exit status 0 on success.
//
// With "stall" after the rank count: step 1 as above, then rank 1 announces step 2's first bucket
// (so its neighbour hears it reached step 2) and stops itself (SIGSTOP) inside the step; the
// other ranks' reductions time out after 3 s, and the one that finds rank 1 silent says so.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "stages/dist/mpi_reduce.h"

using namespace slipstream;

int main(int argc, char** argv) {
  if (!dist::launched_with_multiple_ranks()) {
    std::fprintf(stderr, "not started by a multi-rank launcher\n");
    return 2;
  }
  const int want_world = argc > 1 ? std::atoi(argv[1]) : 2;
  dist::mpi_init_once();
  const int rank = dist::mpi_rank(), world = dist::mpi_world_size();
  const int64_t sizes[5] = {10, 3, 17, 4, 9};
  Tensor store = Tensor::empty({30}, DType::f32);  // parameters 0..2 are views of one block
  std::vector<Parameter> params(5);
  int64_t at = 0;
  for (int k = 0; k < 5; ++k) {
    params[size_t(k)].name = "p" + std::to_string(k);
    params[size_t(k)].grad =
        k < 3 ? store.slice_rows(at, at + sizes[k]) : Tensor::empty({sizes[k]}, DType::f32);
    if (k < 3) at += sizes[k];
  }
  std::vector<Parameter*> ptrs;  // backward order: the last parameter first
  for (int k = 4; k >= 0; --k) ptrs.push_back(&params[size_t(k)]);
  dist::GradBuckets buckets(ptrs, 7);
  int in_place = 0;
  for (size_t i = 0; i < buckets.count(); ++i) in_place += buckets.contiguous(i) != nullptr;
  const bool stall = argc > 2 && std::string(argv[2]) == "stall";
  dist::MpiBucketReducer reducer(buckets, stall ? 3.0 : 60.0);
  if (stall) {
    for (size_t j = 0; j < ptrs.size(); ++j) reducer.param_ready(j, 1);
    reducer.finish(1);
    if (rank == 1) {
      reducer.param_ready(0, 2);  // the first bucket goes out: "reached step 2"
      // Long enough for the helper thread to have posted it, even on a loaded machine.
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      raise(SIGSTOP);
      _exit(4);  // continued by the launcher as it ends the job: say nothing more
    }
    for (size_t j = 0; j < ptrs.size(); ++j) reducer.param_ready(j, 2);
    try {
      reducer.finish(2);
    } catch (const std::exception& e) {
      std::printf("rank %d: %s\n", rank, e.what());
      std::fflush(stdout);
      return 3;  // exit: Open MPI's abort at exit ends the other ranks
    }
    std::printf("rank %d: step 2 finished although rank 1 stopped\n", rank);
    return 1;
  }
  int bad = 0;
  // Step 2 twice: a collection may repeat a step number (each finish() ends one).
  for (uint64_t step : {uint64_t{1}, uint64_t{2}, uint64_t{2}}) {
    for (int k = 0; k < 5; ++k)
      for (int64_t i = 0; i < sizes[k]; ++i)
        params[size_t(k)].grad.data<float>()[i] = float(rank + 1) * float(k * 100 + i + step);
    // Announcements in an order that differs by rank: buckets still start in bucket order.
    for (size_t j = 0; j < ptrs.size(); ++j)
      reducer.param_ready((j + static_cast<size_t>(rank)) % ptrs.size(), step);
    reducer.finish(step);
    // mean over ranks of (r + 1) * v = v * (world + 1) / 2
    for (int k = 0; k < 5; ++k)
      for (int64_t i = 0; i < sizes[k]; ++i) {
        const float want = float(k * 100 + i + step) * float(world + 1) / 2.0f;
        if (std::abs(params[size_t(k)].grad.data<float>()[i] - want) > 1e-4f * std::max(1.0f, want))
          ++bad;
      }
  }
  // A sum of doubles (the validation metrics' path).
  double v[2] = {1.0, double(rank)};
  dist::mpi_reduce(v, RankReduce::sum, 60.0, "test sum");
  if (v[0] != world || v[1] != world * (world - 1) / 2.0) ++bad;
  double m[2] = {double(rank + 5), double(-rank)};
  dist::mpi_reduce(m, RankReduce::min, 60.0, "test min");
  if (m[0] != 5 || m[1] != -(world - 1)) ++bad;
  std::printf("rank %d of %d: %zu buckets, %d in place: %s\n", rank, world, buckets.count(),
              in_place, bad ? "MISMATCH" : "ok");
  return bad || world != want_world || in_place == 0 ||
                 in_place == static_cast<int>(buckets.count())
             ? 1
             : 0;
}
