// RunOptions for engine tests whose runs write a run directory (under the test's TempDir, through
// run.runs_dir): no stats record, progress lines into a sink.
#pragma once

#include <sstream>

#include "engine/runner.h"

namespace slipstream::testing {

inline RunOptions writing_options() {
  static std::ostringstream sink;
  RunOptions o;
  o.create_run_dir = true;
  o.publish_stats = false;
  o.log = &sink;
  return o;
}

}  // namespace slipstream::testing
