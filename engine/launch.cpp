#include "engine/launch.h"

#include <cstdlib>
#include <stdexcept>

namespace slipstream {

namespace {
bool read_int(const char* name, int& out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0') return false;
  out = static_cast<int>(x);
  return true;
}
}  // namespace

LaunchInfo launch_info() {
  struct Vars {
    const char *rank, *size, *local, *name;
  };
  for (const Vars& v : {Vars{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi"},
                        Vars{"PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "pmix"},
                        Vars{"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "pmi"},
                        Vars{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "slurm"}}) {
    LaunchInfo info;
    if (!read_int(v.rank, info.rank) || !read_int(v.size, info.world_size)) continue;
    if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size)
      throw std::runtime_error(std::string(v.rank) + "=" + std::to_string(info.rank) + " and " +
                               v.size + "=" + std::to_string(info.world_size) +
                               " are inconsistent");
    if (read_int(v.local, info.local_rank) && info.local_rank < 0)
      throw std::runtime_error(std::string(v.local) + "=" + std::to_string(info.local_rank) +
                               " is negative");
    info.launcher = v.name;
    return info;
  }
  return {};
}

}  // namespace slipstream
