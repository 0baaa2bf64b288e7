// Run by allreduce_mpi_test under `mpirun -np 2` and `-np 3`: each rank fills gradients with
// rank-dependent values (three parameters in one flat store, two on their own), averages them
// through the allreduce stage's reducer with small buckets (in-place and staged buckets,
// parameters straddling buckets), announcing parameters one by one in a rank-dependent order,
// three times (steps 1, 2 and 2 again), and checks the mean. Then the same buckets sharded
// (ZeRO-1): every element of every parameter in exactly one rank's pieces, each rank's pieces of
// the gradients averaged, every rank's weights gathered into every rank (in place and staged),
// and a gather to rank 0. Exit status 0 on success.
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

// ZeRO-1 over the same parameters: returns the number of mismatches.
int check_shard(const std::vector<Parameter*>& ptrs, std::vector<Parameter>& params,
                const int64_t* sizes, int rank, int world) {
  dist::GradBuckets buckets(ptrs, 7);
  int bad = 0, values_in_place = 0;
  for (size_t i = 0; i < buckets.count(); ++i) values_in_place += buckets.value_block(i) != nullptr;
  if (values_in_place == 0 || values_in_place == static_cast<int>(buckets.count())) ++bad;
  dist::MpiBucketReducer reducer(buckets, 60.0, /*shard=*/true);
  // Disjoint and complete: each element's owner, exactly one; every rank a fair share.
  std::vector<std::vector<int>> owner(5);
  for (int k = 0; k < 5; ++k) owner[size_t(k)].assign(size_t(sizes[k]), -1);
  for (int r = 0; r < world; ++r) {
    size_t n = 0;
    for (const auto& piece : reducer.shard_pieces(r)) {
      const auto k = static_cast<size_t>(std::stoi(piece.param->name.substr(1)));
      for (size_t j = piece.begin; j < piece.begin + piece.n; ++j) {
        if (owner[k][j] != -1) ++bad;
        owner[k][j] = r;
      }
      n += piece.n;
    }
    if (std::abs(double(n) - 43.0 / world) > double(buckets.count())) ++bad;
  }
  for (const auto& o : owner)
    for (int r : o) bad += r == -1;
  // Reduce-scatter: this rank's pieces hold the mean.
  const uint64_t step = 1;
  for (int k = 0; k < 5; ++k)
    for (int64_t i = 0; i < sizes[k]; ++i)
      params[size_t(k)].grad.data<float>()[i] = float(rank + 1) * float(k * 100 + i + step);
  for (size_t j = 0; j < ptrs.size(); ++j) reducer.param_ready(j, step);
  reducer.finish(step);
  for (int k = 0; k < 5; ++k)
    for (int64_t i = 0; i < sizes[k]; ++i) {
      if (owner[size_t(k)][size_t(i)] != rank) continue;
      const float want = float(k * 100 + i + step) * float(world + 1) / 2.0f;
      if (std::abs(params[size_t(k)].grad.data<float>()[i] - want) > 1e-4f * want) ++bad;
    }
  // All-gather: each rank writes its pieces; everyone ends with every rank's.
  auto weight = [](int r, int k, int64_t i) { return float(1000 * (r + 1) + k * 100 + i); };
  for (int k = 0; k < 5; ++k)
    for (int64_t i = 0; i < sizes[k]; ++i)
      params[size_t(k)].value.data<float>()[i] =
          owner[size_t(k)][size_t(i)] == rank ? weight(rank, k, i) : -1.0f;
  reducer.gather_weights(step);
  for (int k = 0; k < 5; ++k)
    for (int64_t i = 0; i < sizes[k]; ++i)
      if (params[size_t(k)].value.data<float>()[i] != weight(owner[size_t(k)][size_t(i)], k, i))
        ++bad;
  // Gather to rank 0: rank r sends r + 1 copies of r.
  std::vector<float> mine(size_t(rank + 1), float(rank)), all{-5.0f};
  reducer.gather_to_root(mine, all, "test gather");
  if (rank == 0) {
    std::vector<float> want;
    for (int r = 0; r < world; ++r) want.insert(want.end(), size_t(r + 1), float(r));
    if (all != want) ++bad;
  } else if (all != std::vector<float>{-5.0f}) {
    ++bad;
  }
  std::printf("rank %d of %d: sharded, %zu buckets, weights of %d in place: %s\n", rank, world,
              buckets.count(), values_in_place, bad ? "MISMATCH" : "ok");
  return bad;
}

int main(int argc, char** argv) {
  if (!dist::launched_with_multiple_ranks()) {
    std::fprintf(stderr, "not started by a multi-rank launcher\n");
    return 2;
  }
  const int want_world = argc > 1 ? std::atoi(argv[1]) : 2;
  dist::mpi_init_once();
  const int rank = dist::mpi_rank(), world = dist::mpi_world_size();
  const int64_t sizes[5] = {10, 3, 17, 4, 9};
  Tensor store = Tensor::empty({30}, DType::f32);   // parameters 0..2 are views of one block
  Tensor values = Tensor::empty({30}, DType::f32);  // ... and their weights of another
  std::vector<Parameter> params(5);
  int64_t at = 0;
  for (int k = 0; k < 5; ++k) {
    params[size_t(k)].name = "p" + std::to_string(k);
    params[size_t(k)].grad =
        k < 3 ? store.slice_rows(at, at + sizes[k]) : Tensor::empty({sizes[k]}, DType::f32);
    params[size_t(k)].value =
        k < 3 ? values.slice_rows(at, at + sizes[k]) : Tensor::empty({sizes[k]}, DType::f32);
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
  bad += check_shard(ptrs, params, sizes, rank, world);
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
