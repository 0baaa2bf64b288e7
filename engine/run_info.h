// run.json in a run directory: one entry per invocation (the first run and every resume) with
// what is needed to repeat it: the command line, working directory, host, time, slipstream
// version and git commit, device, and the checkpoint a resume started from.
#pragma once

#include <string>

namespace slipstream {

struct Invocation {
  std::string command;       // as typed (empty when the run was started through the API)
  std::string device;        // the device the run chose, e.g. "cpu", "cuda:0"
  std::string resumed_from;  // checkpoint directory, empty for the first invocation
};

// The time now through strftime's `format`, in UTC or local time.
std::string time_text(const char* format, bool utc);
// This machine's name ("unknown" when the system will not say).
std::string host_name();

// Appends `inv` (and the working directory, host, time, version, commit) to run_dir/run.json,
// replacing the file atomically. A run.json that does not parse is kept as run.json.bad.
void append_run_info(const std::string& run_dir, const Invocation& inv);

}  // namespace slipstream
