// What this binary is: the release version and the git commit it was built from.
#pragma once

#include <string_view>

namespace slipstream {

std::string_view version();     // e.g. "0.1.0"
std::string_view git_commit();  // short hash, "-dirty" with uncommitted changes, or "unknown"

}  // namespace slipstream
