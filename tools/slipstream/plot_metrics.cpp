#include "tools/slipstream/plot_metrics.h"

#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

namespace slipstream::plot {

bool is_row_field(const std::string& key) {
  return key == "step" || key == "split" || key == "time" || key == "epoch" ||
         key == "steps_averaged";
}

MetricsLog parse_metrics(std::istream& in) {
  MetricsLog log;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A crash mid-write leaves a truncated last line; skipping (and counting) it keeps the
    // rest of the run plottable.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      ++log.skipped;
      continue;
    }
    MetricRow row;
    row.step = j["step"].get<int64_t>();
    row.split = j.contains("split") && j["split"].is_string() ? j["split"].get<std::string>()
                                                              : std::string("train");
    for (const auto& [key, v] : j.items()) {
      if (is_row_field(key)) continue;
      if (v.is_number())
        row.values[key] = v.get<double>();
      else if (v.is_null())
        row.values[key] = std::numeric_limits<double>::quiet_NaN();
    }
    log.rows.push_back(std::move(row));
  }
  return log;
}

MetricsLog load_metrics(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw PlotError(file.string() + ": no such file (expected the run's metrics.jsonl)");
  std::ifstream in(file);
  if (!in) throw PlotError("cannot open " + file.string());
  return parse_metrics(in);
}

}  // namespace slipstream::plot
