// Everything one refresh of slipstream-smi shows: GPU readings plus the runs' stats records.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/stats_record.h"
#include "nvml.h"

namespace slipstream::smi {

struct RecordError {
  std::string path;
  std::string message;  // names the file and what is wrong
};

struct Snapshot {
  std::chrono::system_clock::time_point taken;
  std::string stats_dir;
  GpuReport gpu;
  std::vector<stats::RunRecord> runs;  // sorted by pid
  std::vector<RecordError> errors;     // records that could not be read
};

// Reads the GPUs (through nvml, may be null) and every record of ours in stats_dir.
Snapshot take_snapshot(const Nvml* nvml, const std::vector<unsigned>& gpu_select,
                       const std::string& stats_dir);

// The bottleneck stage of a run: among stages not mostly blocked on output
// (blocked_output_frac_recent < kBlockedOutputLimit), the one with the highest busy fraction;
// ties go to the upstream (earlier) stage. -1 when no stage qualifies or none is busy at all.
// A stage that is mostly blocked on output is held back by something downstream, so however
// busy its workers look, speeding it up would not speed up the run.
inline constexpr double kBlockedOutputLimit = 0.5;
int bottleneck_stage(const stats::RunRecord& run);

const char* state_name(stats::RunState state);

// Seconds since the run last published its record (it does every run.stats_interval_ms).
double heartbeat_age_s(const stats::RunRecord& run, double now_unix_s);
// A run that says it is starting, running or finishing but has not published for this long is
// stale: stopped (SIGSTOP, a debugger), hung, or its machine suspended.
inline constexpr double kStaleAfterS = 15;
// Whether `run` is stale at `now_unix_s` (above); its rates and ETA are then from before it
// stopped.
bool is_stale(const stats::RunRecord& run, double now_unix_s);
// state_name, or "stale 83s" for a stale run.
std::string run_state_text(const stats::RunRecord& run, double now_unix_s);

}  // namespace slipstream::smi
