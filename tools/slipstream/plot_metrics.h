// Reading a run's metrics.jsonl into rows of named numeric values, for `slipstream plot`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <istream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace slipstream::plot {

// Bad input the command reports and exits 1 on (missing file, nothing to draw, ...).
class PlotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MetricRow {
  int64_t step = 0;
  std::string split;                     // "train" or "validation"
  std::map<std::string, double> values;  // a JSON null is kept as NaN: a gap in the curve
};

struct MetricsLog {
  std::vector<MetricRow> rows;
  size_t skipped = 0;             // non-empty lines that were not a JSON object with a step
  std::vector<size_t> bad_lines;  // their 1-based line numbers
  std::string first_bad;          // the first of them, cut short, for an error message
};

// Keys that describe the row rather than measure the run; never plotted.
bool is_row_field(const std::string& key);

MetricsLog parse_metrics(std::istream& in);
// Throws PlotError naming the file when it is missing or unreadable, empty, or has no line that
// is a metrics row (then naming the first bad line).
MetricsLog load_metrics(const std::filesystem::path& file);
// "FILE: skipped 2 malformed lines (lines 7, 9)", or "" when none was skipped.
std::string skipped_summary(const std::filesystem::path& file, const MetricsLog& log);

}  // namespace slipstream::plot
