// The default table, the --json snapshot and the dmon lines.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "snapshot.h"

namespace slipstream::smi {

// Total width of the default view's boxes, borders included.
inline constexpr size_t kTableWidth = 110;
inline constexpr std::string_view kBottleneckMark = "<- bottleneck";

// nvidia-smi's default view, for GPUs and slipstream pipelines. `version` heads the table.
std::string render_table(const Snapshot& snap, std::string_view version);

nlohmann::json snapshot_json(const Snapshot& snap, std::string_view version);

// dmon column groups, chosen with -s letters: p power/temp, u utilisation, m memory,
// c clocks (GPU rows); r run step rate, s stage summary (run rows).
struct DmonGroups {
  bool power = false, utilization = false, memory = false, clocks = false;
  bool run_rate = false, stages = false;
  bool any_gpu() const { return power || utilization || memory || clocks; }
  bool any_run() const { return run_rate || stages; }
};
inline constexpr std::string_view kDmonDefaultGroups = "pucrs";
// Throws UsageError for a letter that is not a group.
DmonGroups parse_dmon_groups(std::string_view letters);
// The two '#' header lines: column names, then units.
std::string dmon_header(const DmonGroups& groups);
// One line per GPU, then one per run, for one interval.
std::string dmon_lines(const DmonGroups& groups, const Snapshot& snap);

}  // namespace slipstream::smi
