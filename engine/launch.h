// This process's place in a multi-process run started by a launcher (mpirun, srun, ...), read from
// the launcher's environment variables only: nothing is initialised here.
#pragma once

#include <string>

namespace slipstream {

struct LaunchInfo {
  int rank = 0;          // 0 .. world_size-1
  int world_size = 1;    // 1 when not started by a launcher
  std::string launcher;  // "openmpi", "pmix", "pmi", "slurm", or "" (single process)
};

// Open MPI (OMPI_COMM_WORLD_RANK/SIZE), PMIx (PMIX_RANK + PMIX_SIZE), PMI/MPICH (PMI_RANK/SIZE),
// Slurm (SLURM_PROCID/SLURM_NTASKS), in that order. Throws std::runtime_error when a launcher's
// variables are inconsistent (rank outside [0, size)).
LaunchInfo launch_info();

}  // namespace slipstream
