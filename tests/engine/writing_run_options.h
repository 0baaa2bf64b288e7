// RunOptions for engine tests whose runs write a run directory (under the test's TempDir, through
// run.runs_dir): no stats record, progress lines into a sink.
#pragma once

#include <sstream>
#include <string>
#include <vector>

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

// The same, its progress lines into `log` (what a test reads back).
inline RunOptions writing_options(std::ostream& log) {
  RunOptions o = writing_options();
  o.log = &log;
  return o;
}

// `sets` with one more override (a run's settings, and this run's own).
inline std::vector<std::string> with_set(std::vector<std::string> sets, std::string extra) {
  sets.push_back(std::move(extra));
  return sets;
}

}  // namespace slipstream::testing
