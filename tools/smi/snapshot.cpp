#include "snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace slipstream::smi {

Snapshot take_snapshot(const Nvml* nvml, const std::vector<unsigned>& gpu_select,
                       const std::string& stats_dir) {
  Snapshot snap;
  snap.taken = std::chrono::system_clock::now();
  snap.stats_dir = stats_dir;
  if (nvml) snap.gpu = nvml->query(gpu_select);
  for (auto& found : stats::find_records(stats_dir)) {
    if (found.result.record)
      snap.runs.push_back(*found.result.record);
    else
      snap.errors.push_back({found.path, found.result.error});
  }
  return snap;
}

int bottleneck_stage(const stats::RunRecord& run) {
  int best = -1;
  double best_busy = 0.0;
  for (uint32_t i = 0; i < run.num_stages && i < static_cast<uint32_t>(stats::kMaxStages); ++i) {
    const auto& s = run.stages[i];
    // NaN compares false both ways: a stage without a reading never wins.
    if (!(s.blocked_output_frac_recent < kBlockedOutputLimit)) continue;
    if (s.busy_frac_recent > best_busy) {
      best = static_cast<int>(i);
      best_busy = s.busy_frac_recent;
    }
  }
  return best;
}

const char* state_name(stats::RunState state) {
  switch (state) {
    case stats::RunState::starting:
      return "starting";
    case stats::RunState::running:
      return "running";
    case stats::RunState::finishing:
      return "finishing";
    case stats::RunState::done:
      return "done";
    case stats::RunState::failed:
      return "failed";
  }
  return "unknown";
}

double heartbeat_age_s(const stats::RunRecord& run, double now_unix_s) {
  return std::max(0.0, now_unix_s - static_cast<double>(run.update_unix_ns) * 1e-9);
}

bool is_stale(const stats::RunRecord& run, double now_unix_s) {
  const bool live = run.state == stats::RunState::starting ||
                    run.state == stats::RunState::running ||
                    run.state == stats::RunState::finishing;
  return live && run.update_unix_ns != 0 && heartbeat_age_s(run, now_unix_s) >= kStaleAfterS;
}

std::string run_state_text(const stats::RunRecord& run, double now_unix_s) {
  if (!is_stale(run, now_unix_s)) return state_name(run.state);
  const double age = heartbeat_age_s(run, now_unix_s);
  char buf[32];
  if (age < 3600)
    std::snprintf(buf, sizeof buf, "stale %.0fs", age);
  else
    std::snprintf(buf, sizeof buf, "stale %.0fh", age / 3600);
  return buf;
}

}  // namespace slipstream::smi
