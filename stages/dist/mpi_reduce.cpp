#include "stages/dist/mpi_reduce.h"

#include <cstdlib>
#include <stdexcept>

#include "engine/launch.h"

#if SLIPSTREAM_HAS_MPI
#include <mpi.h>
#endif

namespace slipstream::dist {

bool launched_with_multiple_ranks() {
  return launch_info().world_size > 1;
}

#if SLIPSTREAM_HAS_MPI

namespace {
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) +
                           " failed: " + std::string(msg, static_cast<size_t>(len)));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
}  // namespace

bool mpi_is_initialized() {
  int init = 0;
  MPI_Initialized(&init);
  return init != 0;
}

void mpi_init_once() {
  if (mpi_is_initialized()) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED)
    throw std::runtime_error("the MPI library does not support MPI_THREAD_SERIALIZED");
  std::atexit(finalize_at_exit);
}

int mpi_world_size() {
  int n = 1;
  check(MPI_Comm_size(MPI_COMM_WORLD, &n), "MPI_Comm_size");
  return n;
}

int mpi_rank() {
  int r = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &r), "MPI_Comm_rank");
  return r;
}

void mpi_average(const GradBuckets& buckets, std::vector<float>& buffer) {
  const float scale = 1.0f / static_cast<float>(mpi_world_size());
  for (size_t i = 0; i < buckets.count(); ++i) {
    const size_t n = buckets.size(i);
    buckets.flatten(i, buffer.data());
    check(MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD),
          "MPI_Allreduce");
    buckets.unflatten(i, buffer.data(), scale);
  }
}

#else  // a build configured with -DSLIPSTREAM_MPI=OFF: one process, no MPI backend

namespace {
[[noreturn]] void no_mpi() {
  throw std::runtime_error(
      "allreduce backend mpi: this build has no MPI (configured with -DSLIPSTREAM_MPI=OFF); "
      "install Open MPI (libopenmpi-dev) and reconfigure, or run one process with backend none");
}
}  // namespace

void mpi_init_once() {
  no_mpi();
}
int mpi_world_size() {
  return 1;
}
int mpi_rank() {
  return 0;
}
bool mpi_is_initialized() {
  return false;
}
void mpi_average(const GradBuckets&, std::vector<float>&) {
  no_mpi();
}

#endif

}  // namespace slipstream::dist
