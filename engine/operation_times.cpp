// See operation_times.h.
#include "engine/operation_times.h"

#include <cstdio>

namespace slipstream {

namespace {

// A sum over the timed graphs, a unit's worth.
double per_unit(const OperationTimes& t, uint64_t batches_per_unit, double total) {
  return t.graphs ? total / static_cast<double>(t.graphs) * static_cast<double>(batches_per_unit)
                  : 0;
}

double share_pct(const OperationTimes& t, double ms) {
  return t.graph_ms > 0 ? 100.0 * ms / t.graph_ms : 0.0;
}

constexpr size_t kRows = 30;  // the table's rows; the rest are summed on one line

}  // namespace

std::string format_operation_times(const OperationTimes& t, uint64_t batches_per_unit,
                                   const std::string& unit) {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line,
                "operations on the device, time stamps between them in the %s's graph: %llu "
                "graphs timed, %llu ran without a graph (not timed); the host waited for each "
                "graph, so wall times beside this table are not the %s's own\n",
                unit.c_str(), static_cast<unsigned long long>(t.graphs),
                static_cast<unsigned long long>(t.untimed), unit.c_str());
  out += line;
  if (t.graphs == 0) return out;
  std::snprintf(line, sizeof line, "device time a %s: %.3f ms (%llu graph%s a %s)\n", unit.c_str(),
                per_unit(t, batches_per_unit, t.graph_ms),
                static_cast<unsigned long long>(batches_per_unit), batches_per_unit == 1 ? "" : "s",
                unit.c_str());
  out += line;
  const std::string calls = "calls/" + unit, us = "us/" + unit;
  std::snprintf(line, sizeof line, "%-44s %-12s %11s %11s %7s\n", "operation", "stage",
                calls.c_str(), us.c_str(), "share");
  out += line;
  auto row = [&](const std::string& what, const std::string& stage, double launches, double ms) {
    std::snprintf(line, sizeof line, "%-44.44s %-12.12s %11.1f %11.1f %6.1f%%\n", what.c_str(),
                  stage.c_str(), per_unit(t, batches_per_unit, launches),
                  1e3 * per_unit(t, batches_per_unit, ms), share_pct(t, ms));
    out += line;
  };
  double rest_ms = 0, rest_launches = 0;
  for (size_t i = 0; i < t.ops.size(); ++i) {
    const OperationTime& op = t.ops[i];
    if (i < kRows) {
      row(op.what, op.stage_name, static_cast<double>(op.launches), op.device_ms);
    } else {
      rest_ms += op.device_ms;
      rest_launches += static_cast<double>(op.launches);
    }
  }
  if (t.ops.size() > kRows)
    row("(" + std::to_string(t.ops.size() - kRows) + " more)", "", rest_launches, rest_ms);
  return out;
}

nlohmann::json operation_times_json(const OperationTimes& t, uint64_t batches_per_unit,
                                    const std::string& unit) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OperationTime& op : t.ops)
    ops.push_back(
        {{"what", op.what},
         {"stage", op.stage_name},
         {"calls_per_" + unit, per_unit(t, batches_per_unit, static_cast<double>(op.launches))},
         {"us_per_" + unit, 1e3 * per_unit(t, batches_per_unit, op.device_ms)},
         {"share_pct", share_pct(t, op.device_ms)}});
  return {{"graphs_timed", t.graphs},
          {"untimed_batches", t.untimed},
          {"batches_per_" + unit, batches_per_unit},
          {"device_ms_per_" + unit, per_unit(t, batches_per_unit, t.graph_ms)},
          {"ops", ops}};
}

void add_operation_time_sets(std::vector<std::string>& sets, const std::string& device) {
  if (device != "emulated") return;
  for (const std::string& s : sets)
    if (s.starts_with("run.cuda_graph=")) return;
  sets.push_back("run.cuda_graph=on");
}

}  // namespace slipstream
