// This process's place in a multi-process run started by a launcher (mpirun, srun, ...), read from
// the launcher's environment variables only: nothing is initialised here.
#pragma once

#include <string>

namespace slipstream {

struct LaunchInfo {
  int rank = 0;          // 0 .. world_size-1
  int world_size = 1;    // 1 when not started by a launcher
  int local_rank = 0;    // among the ranks on this node: picks the node's GPU
  std::string launcher;  // "openmpi", "pmix", "pmi", "slurm", or "" (single process)
};

// Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), PMIx (PMIX_RANK + PMIX_SIZE, PMIX_LOCAL_RANK),
// PMI/MPICH (PMI_RANK/SIZE, MPI_LOCALRANKID), Slurm (SLURM_PROCID/SLURM_NTASKS, SLURM_LOCALID),
// in that order; a launcher that gives no local rank counts as one rank per node (local rank 0).
// Throws std::runtime_error when a launcher's variables are inconsistent (rank outside
// [0, size), a negative local rank).
LaunchInfo launch_info();

}  // namespace slipstream
