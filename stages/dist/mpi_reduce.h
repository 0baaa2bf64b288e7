// The MPI side of `allreduce`: initialisation (once per process) and the bucketed average of
// gradients over all ranks. Nothing here is called unless the MPI backend is chosen.
#pragma once

#include <string>
#include <vector>

#include "stages/dist/grad_buckets.h"

namespace slipstream::dist {

// MPI_Init_thread (MPI_THREAD_SERIALIZED: the trainable section calls from varying TBB threads,
// one at a time) unless MPI is already initialised; MPI_Finalize at exit when we initialised it.
void mpi_init_once();
int mpi_world_size();
int mpi_rank();
bool mpi_is_initialized();

// True when the environment says a launcher started more than one rank (Open MPI, PMI/MPICH,
// Slurm). Reads environment variables only.
bool launched_with_multiple_ranks();

// In-place MPI_Allreduce (sum) of every bucket through `buffer` (bucket_elems floats), then
// gradients = sum / world size.
void mpi_average(const GradBuckets& buckets, std::vector<float>& buffer);

}  // namespace slipstream::dist
