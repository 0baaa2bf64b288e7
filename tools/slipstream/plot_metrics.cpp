#include "tools/slipstream/plot_metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
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
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A crash mid-write leaves a truncated last line; skipping (and counting) it keeps the
    // rest of the run plottable.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number()) {
      ++log.skipped;
      log.bad_lines.push_back(number);
      if (log.first_bad.empty())
        log.first_bad = line.size() > 60 ? line.substr(0, 57) + "..." : line;
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
    throw PlotError(file.string() + ": " +
                    (ec ? ec.message()  // a folder that cannot be entered: permission denied
                     : std::filesystem::exists(file, ec) ? std::string("not a file")
                                                         : std::string("no such file")) +
                    " (expected the run's metrics.jsonl)");
  std::ifstream in(file);
  if (!in) throw PlotError("cannot open " + file.string() + ": " + std::strerror(errno));
  MetricsLog log = parse_metrics(in);
  if (in.bad()) throw PlotError("cannot read " + file.string());
  if (log.rows.empty() && log.skipped == 0)
    throw PlotError(file.string() + ": empty (the run has not logged a step yet)");
  if (log.rows.empty())
    throw PlotError(file.string() + ":" + std::to_string(log.bad_lines.front()) +
                    ": not a metrics row (a JSON object with a numeric \"step\"), nor is any "
                    "other line: " +
                    log.first_bad);
  return log;
}

std::string skipped_summary(const std::filesystem::path& file, const MetricsLog& log) {
  if (log.skipped == 0) return "";
  std::string s = file.string() + ": skipped " + std::to_string(log.skipped) + " malformed line" +
                  (log.skipped == 1 ? " (line " : "s (lines ");
  for (size_t i = 0; i < log.bad_lines.size() && i < 5; ++i)
    s += (i ? ", " : "") + std::to_string(log.bad_lines[i]);
  return s + (log.bad_lines.size() > 5 ? ", ...)" : ")");
}

}  // namespace slipstream::plot
