// slipstream-smi: an nvidia-smi-style view of the GPUs and the running slipstream pipelines.
// Exit status: 0 ok; 1 runtime failure (e.g. -f FILE cannot be opened); 2 usage error (bad
// flag, unknown query field, GPU index not present); 3 output written but at least one stats
// record could not be read (malformed, truncated, other layout version; see stderr/table).
#include <dirent.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "fields.h"
#include "nvml.h"
#include "snapshot.h"
#include "views.h"

#ifndef SLIPSTREAM_VERSION
#define SLIPSTREAM_VERSION "unknown"
#endif

namespace slipstream::smi {
namespace {

constexpr int kExitOk = 0, kExitFailure = 1, kExitUsage = 2, kExitUnreadableRecord = 3;

// nvidia-smi spells some options in ways CLI11 does not parse: "-lms 500" (a multi-letter
// single-dash option), "-l" with no value (meaning 5 s), and "-l=5"/"-i=0". Rewrite those
// into the long forms before parsing.
std::vector<std::string> normalize_args(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-lms") {
      out.push_back("--loop-ms");
    } else if (a.rfind("-lms=", 0) == 0) {
      out.push_back("--loop-ms=" + a.substr(5));
    } else if (a == "-l" || a == "--loop") {
      out.push_back("--loop");
      bool has_value = i + 1 < argc && argv[i + 1][0] != '-';
      if (!has_value) out.push_back("5");
    } else if (a.size() > 3 && a[0] == '-' && a[1] != '-' && a[2] == '=') {
      out.push_back(a.substr(0, 2));
      out.push_back(a.substr(3));
    } else {
      out.push_back(a);
    }
  }
  return out;
}

std::vector<unsigned> parse_ids(const std::string& list) {
  std::vector<unsigned> ids;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string id = list.substr(start, comma - start);
    start = comma + 1;
    if (id.empty()) continue;
    if (id.find_first_not_of("0123456789") != std::string::npos || id.size() > 9)
      throw UsageError("-i takes GPU indices such as 0 or 0,1; got \"" + id + "\"");
    ids.push_back(static_cast<unsigned>(std::stoul(id)));
  }
  return ids;
}

struct Options {
  std::optional<int> loop_s;
  std::optional<int> loop_ms;
  std::string ids;
  std::string query_gpu, query_run, query_stage;
  std::string format;
  std::string output_file;
  std::string stats_dir;
  bool json = false;
  bool help_query = false;
  // dmon
  std::string dmon_groups{kDmonDefaultGroups};
  int dmon_count = 0;
  int dmon_delay_s = 1;
};

// Prints each record error once, however many intervals it persists.
struct ErrorReporter {
  std::set<std::string> seen;
  bool any = false;
  void report(const Snapshot& snap, bool to_stderr) {
    for (const auto& e : snap.errors) {
      any = true;
      if (to_stderr && seen.insert(e.message).second)
        std::fprintf(stderr, "slipstream-smi: error: %s\n", e.message.c_str());
    }
  }
};

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"slipstream-smi " SLIPSTREAM_VERSION
               ": GPUs and running slipstream pipelines, in the manner of nvidia-smi.\n"
               "Reads the pipelines' stats records from $SLIPSTREAM_STATS_DIR (default /dev/shm).",
               "slipstream-smi"};
  app.set_version_flag("--version", "slipstream-smi " SLIPSTREAM_VERSION);
  // Bounded ranges: CLI11's PositiveNumber would print the whole maximum double in its error.
  CLI::Option* loop =
      app.add_option("-l,--loop", o.loop_s, "Reprint every SEC seconds (5 when SEC is left out)")
          ->check(CLI::Range(1, 86400));
  app.add_option("--loop-ms", o.loop_ms, "Reprint every MS milliseconds (also spelled -lms)")
      ->check(CLI::Range(1, 86400000))
      ->excludes(loop);
  app.add_option("-i,--id", o.ids, "Show only these GPUs: index or comma-separated indices");
  app.add_option("--query-gpu", o.query_gpu, "GPU fields to print as csv (see --help-query)");
  app.add_option("--query-run", o.query_run, "Run fields to print as csv (see --help-query)");
  app.add_option("--query-stage", o.query_stage, "Stage fields to print as csv (see --help-query)");
  app.add_option("--format", o.format, "csv[,noheader][,nounits] for the --query-* options");
  app.add_option("-f,--filename", o.output_file, "Write the output to FILE instead of stdout");
  app.add_option("--stats-dir", o.stats_dir,
                 "Directory of the stats records (default $SLIPSTREAM_STATS_DIR or /dev/shm)");
  app.add_flag("--json", o.json,
               "Print the whole snapshot as JSON (one object per line when looping)");
  app.add_flag("--help-query", o.help_query, "List every query field with a description");

  auto* dmon = app.add_subcommand(
      "dmon", "One line per GPU and per run each interval, in the manner of nvidia-smi dmon");
  dmon->add_option("-s", o.dmon_groups,
                   "Column groups: p power/temp, u utilisation, m memory, c clocks, r run step "
                   "rate, s stage summary (default pucrs)");
  dmon->add_option("-c", o.dmon_count, "Stop after COUNT intervals (default: run until killed)")
      ->check(CLI::Range(1, 1 << 30));
  dmon->add_option("-d", o.dmon_delay_s, "Seconds between intervals (default 1)")
      ->check(CLI::Range(1, 86400));
  dmon->add_option("-i,--id", o.ids, "Show only these GPUs");
  dmon->add_option("-f,--filename", o.output_file, "Write the output to FILE instead of stdout");
  dmon->add_option("--stats-dir", o.stats_dir, "Directory of the stats records");

  std::vector<std::string> args = normalize_args(argc, argv);
  std::vector<char*> arg_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  if (o.help_query) {
    std::cout << help_query_text();
    return kExitOk;
  }

  try {
    const std::string stats_dir = o.stats_dir.empty() ? stats::default_dir() : o.stats_dir;
    // A folder that cannot be read would show "no pipelines" where there may be some.
    if (DIR* d = ::opendir(stats_dir.c_str())) {
      ::closedir(d);
    } else {
      std::fprintf(stderr, "slipstream-smi: cannot read the stats records' folder %s: %s\n",
                   stats_dir.c_str(), std::strerror(errno));
      return kExitFailure;
    }
    const std::vector<unsigned> ids = parse_ids(o.ids);
    const bool is_dmon = dmon->parsed();

    int queries = !o.query_gpu.empty() + !o.query_run.empty() + !o.query_stage.empty();
    if (queries > 1)
      throw UsageError("give one of --query-gpu, --query-run, --query-stage at a time");
    if (queries && o.json) throw UsageError("--json and --query-* are separate outputs; pick one");
    if (!o.format.empty() && !queries) throw UsageError("--format applies to --query-* only");
    QueryGroup group = !o.query_gpu.empty()   ? QueryGroup::gpu
                       : !o.query_run.empty() ? QueryGroup::run
                                              : QueryGroup::stage;
    std::vector<const FieldDef*> fields;
    CsvOptions csv;
    if (queries) {
      fields = resolve_fields(group, !o.query_gpu.empty()   ? o.query_gpu
                                     : !o.query_run.empty() ? o.query_run
                                                            : o.query_stage);
      csv = parse_format(o.format.empty() ? "csv" : o.format);
    }
    DmonGroups groups;
    if (is_dmon) groups = parse_dmon_groups(o.dmon_groups);

    // Runs and stages need no GPU readings: skip loading NVML for them.
    const bool needs_gpu = is_dmon ? groups.any_gpu() : !queries || group == QueryGroup::gpu;
    std::unique_ptr<Nvml> nvml;
    if (needs_gpu) {
      nvml = std::make_unique<Nvml>();
      unsigned count = nvml->device_count();
      for (unsigned id : ids) {
        if (count > 0 && id >= count)
          throw UsageError("GPU index " + std::to_string(id) + " not found; NVML reports " +
                           std::to_string(count) + " GPU(s)");
      }
    }

    std::ofstream file;
    if (!o.output_file.empty()) {
      file.open(o.output_file, std::ios::out | std::ios::trunc);
      if (!file) {
        std::fprintf(stderr, "slipstream-smi: cannot open %s for writing: %s\n",
                     o.output_file.c_str(), std::strerror(errno));
        return kExitFailure;
      }
    }
    std::ostream& out = file.is_open() ? static_cast<std::ostream&>(file) : std::cout;

    std::optional<std::chrono::milliseconds> interval;
    if (is_dmon)
      interval = std::chrono::seconds(o.dmon_delay_s);
    else if (o.loop_ms)
      interval = std::chrono::milliseconds(*o.loop_ms);
    else if (o.loop_s)
      interval = std::chrono::seconds(*o.loop_s);

    ErrorReporter errors;
    auto next = std::chrono::steady_clock::now();
    for (int iteration = 0;; ++iteration) {
      Snapshot snap = take_snapshot(nvml.get(), ids, stats_dir);
      if (is_dmon) {
        if (iteration == 0) out << dmon_header(groups);
        out << dmon_lines(groups, snap);
        errors.report(snap, true);
      } else if (queries) {
        CsvOptions this_csv = csv;
        this_csv.header = csv.header && iteration == 0;  // once, as nvidia-smi -l does
        out << render_query(group, fields, snap, this_csv);
        errors.report(snap, true);
        if (group == QueryGroup::gpu && !snap.gpu.available && iteration == 0)
          std::fprintf(stderr, "slipstream-smi: No NVIDIA GPU found: %s\n",
                       snap.gpu.unavailable_reason.c_str());
      } else if (o.json) {
        auto j = snapshot_json(snap, SLIPSTREAM_VERSION);
        // replace: a record's invalid UTF-8 must not fail the whole snapshot (type_error 316).
        out << j.dump(interval ? -1 : 2, ' ', false, nlohmann::json::error_handler_t::replace)
            << "\n";
        errors.report(snap, false);
      } else {
        out << render_table(snap, SLIPSTREAM_VERSION);
        if (interval) out << "\n";
        errors.report(snap, false);
      }
      out.flush();
      if (!interval) break;
      if (is_dmon && o.dmon_count > 0 && iteration + 1 >= o.dmon_count) break;
      next += *interval;
      std::this_thread::sleep_until(next);
    }
    return errors.any ? kExitUnreadableRecord : kExitOk;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "slipstream-smi: %s\n", e.what());
    return kExitUsage;
  }
}

}  // namespace
}  // namespace slipstream::smi

int main(int argc, char** argv) {
  try {
    return slipstream::smi::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slipstream-smi: %s\n", e.what());
    return 1;
  }
}
