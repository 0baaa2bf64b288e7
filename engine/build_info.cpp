#include "engine/build_info.h"

#include "git_commit.h"  // generated at build time (cmake/GitCommit.cmake)

namespace slipstream {

std::string_view version() {
  return SLIPSTREAM_VERSION;
}
std::string_view git_commit() {
  return SLIPSTREAM_GIT_COMMIT;
}

}  // namespace slipstream
