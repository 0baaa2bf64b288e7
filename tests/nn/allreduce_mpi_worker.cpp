// Run by allreduce_mpi_test under `mpirun -np 2`: each rank fills gradients with rank-dependent
// values, averages them with the allreduce stage's MPI path (small buckets, so parameters
// straddle buckets), and checks the mean. Exit status 0 on success.
#include <cmath>
#include <cstdio>
#include <vector>

#include "stages/dist/mpi_reduce.h"

using namespace slipstream;

int main() {
  if (!dist::launched_with_multiple_ranks()) {
    std::fprintf(stderr, "not started by a multi-rank launcher\n");
    return 2;
  }
  dist::mpi_init_once();
  const int rank = dist::mpi_rank(), world = dist::mpi_world_size();
  std::vector<Parameter> params(3);
  const int64_t sizes[3] = {10, 3, 17};
  for (int k = 0; k < 3; ++k) {
    params[size_t(k)].name = "p" + std::to_string(k);
    params[size_t(k)].grad = Tensor::empty({sizes[k]}, DType::f32);
    for (int64_t i = 0; i < sizes[k]; ++i)
      params[size_t(k)].grad.data<float>()[i] = float(rank + 1) * float(k * 100 + i);
  }
  std::vector<Parameter*> ptrs;
  for (auto& p : params) ptrs.push_back(&p);
  dist::GradBuckets buckets(ptrs, 7);
  std::vector<float> buffer(7);
  dist::mpi_average(buckets, buffer);
  // mean over ranks of (r + 1) * v = v * (world + 1) / 2
  int bad = 0;
  for (int k = 0; k < 3; ++k)
    for (int64_t i = 0; i < sizes[k]; ++i) {
      const float want = float(k * 100 + i) * float(world + 1) / 2.0f;
      if (std::abs(params[size_t(k)].grad.data<float>()[i] - want) > 1e-4f * std::max(1.0f, want))
        ++bad;
    }
  std::printf("rank %d of %d: %s\n", rank, world, bad ? "MISMATCH" : "ok");
  return bad || world != 2 ? 1 : 0;
}
