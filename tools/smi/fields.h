// The --query-gpu / --query-run / --query-stage fields and their csv output.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "format.h"
#include "snapshot.h"

namespace slipstream::smi {

enum class QueryGroup { gpu, run, stage };
const char* group_name(QueryGroup group);  // "gpu", "run", "stage"

// What one output row is about; members not relevant to the group are null / -1.
struct RowContext {
  const GpuReport* report = nullptr;
  const GpuInfo* gpu = nullptr;
  const stats::RunRecord* run = nullptr;
  int stage = -1;
  int bottleneck = -1;
  double now_unix_s = 0;
};

struct FieldDef {
  std::string name;
  std::string unit;
  std::string description;
  std::function<FieldValue(const RowContext&)> value;
};

const std::vector<FieldDef>& query_fields(QueryGroup group);

// A command-line mistake: exits with status 2 and this message.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "a,b,c" -> the named fields, in order. Throws UsageError naming an unknown field and
// listing the valid ones.
std::vector<const FieldDef*> resolve_fields(QueryGroup group, std::string_view list);

struct CsvOptions {
  bool header = true;
  bool units = true;
};
// "csv[,noheader][,nounits]"; throws UsageError otherwise.
CsvOptions parse_format(std::string_view format);

// The csv text (header line unless noheader, then one line per row) for the snapshot.
std::string render_query(QueryGroup group, const std::vector<const FieldDef*>& fields,
                         const Snapshot& snap, const CsvOptions& options);

// Every field of every group with its unit and description, for --help-query.
std::string help_query_text();

}  // namespace slipstream::smi
