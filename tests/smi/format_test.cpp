// slipstream-smi's formatting: csv escaping, units, [N/A], the bottleneck rule, table shape.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string_view>

#include <gtest/gtest.h>

#include "fields.h"
#include "format.h"
#include "nvml.h"
#include "snapshot.h"
#include "views.h"

namespace slipstream::smi {
namespace {

// Copies s into a fixed char array, cut to fit and NUL-terminated.
template <size_t N>
void set_text(char (&dst)[N], std::string_view s) {
  size_t n = std::min(s.size(), N - 1);
  s.copy(dst, n);
  dst[n] = '\0';
}

stats::RunRecord sample_run() {
  stats::RunRecord r;
  std::memset(&r, 0, sizeof r);
  r.magic = stats::kMagic;
  r.layout_version = stats::kLayoutVersion;
  r.record_size = sizeof r;
  r.pid = 4242;
  r.state = stats::RunState::running;
  set_text(r.run_name, "demo, \"quoted\"");
  set_text(r.preset, "cpu_quick");
  set_text(r.device, "cpu");
  r.step = 10;
  r.total_steps = 0;
  r.loss = std::nan("");
  r.steps_per_s = 2.5;
  r.samples_per_s = 80;
  r.eta_s = -1;
  r.num_stages = 2;
  set_text(r.stages[0].name, "read");
  set_text(r.stages[0].kind, "source");
  r.stages[0].busy_frac_recent = 0.5;
  set_text(r.stages[1].name, "train");
  set_text(r.stages[1].kind, "train");
  r.stages[1].busy_frac_recent = 0.9;
  r.stages[1].mean_latency_ms_recent = std::nan("");
  return r;
}

TEST(SmiFormat, CsvEscape) {
  EXPECT_EQ(csv_escape("plain"), "plain");
  EXPECT_EQ(csv_escape(""), "");
  EXPECT_EQ(csv_escape("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_escape("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_escape(" lead"), "\" lead\"");
  EXPECT_EQ(csv_escape("trail "), "\"trail \"");
  EXPECT_EQ(csv_escape("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_escape("inner space"), "inner space");
  EXPECT_EQ(csv_join({"a", "b,c", "[N/A]"}), "a, \"b,c\", [N/A]");
}

TEST(SmiFormat, UnitsAndNotAvailable) {
  EXPECT_EQ(render_value({std::string("1024"), "MiB"}, true), "1024 MiB");
  EXPECT_EQ(render_value({std::string("1024"), "MiB"}, false), "1024");
  EXPECT_EQ(render_value({std::string("35"), ""}, true), "35");
  EXPECT_EQ(render_value({std::nullopt, "MiB"}, true), "[N/A]");
  EXPECT_EQ(render_value({std::nullopt, "MiB"}, false), "[N/A]");
  EXPECT_EQ(header_cell("memory.used", "MiB"), "memory.used [MiB]");
  EXPECT_EQ(header_cell("name", ""), "name");
  EXPECT_EQ(fixed(1.23456, 2), "1.23");
  EXPECT_FALSE(fixed(std::nan(""), 2));
  EXPECT_FALSE(fixed(INFINITY, 2));
  EXPECT_EQ(fixed_or_na(std::nan(""), 1, "%"), "[N/A]");
  EXPECT_EQ(percent_text(0.955), "95.5%");
  EXPECT_EQ(percent_text(std::nan("")), "[N/A]");
}

TEST(SmiFormat, Numbers) {
  EXPECT_EQ(to_mib(81559ull << 20), 81559u);
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(human_bytes(3ull << 30), "3.00 GiB");
  EXPECT_EQ(human_bytes(20ull << 20), "20.0 MiB");
  EXPECT_EQ(compact_rate(12.345), "12.35");
  EXPECT_EQ(compact_rate(1600), "1600.0");
  EXPECT_EQ(compact_rate(123456), "123.5k");
  EXPECT_EQ(compact_rate(2.5e8), "250.0M");
  EXPECT_EQ(compact_rate(std::nan("")), "[N/A]");
  EXPECT_EQ(latency_text(0.0812), "0.081ms");
  EXPECT_EQ(latency_text(2.4), "2.40ms");
  EXPECT_EQ(latency_text(312.5), "312.5ms");
  EXPECT_EQ(latency_text(1250), "1.25s");
  EXPECT_EQ(duration_text(3723), "1:02:03");
  EXPECT_EQ(duration_text(0), "0:00:00");
  EXPECT_EQ(duration_text(90061), "1d 01:01:01");
  EXPECT_EQ(duration_text(-1), "[N/A]");
  EXPECT_EQ(duration_text(std::nan("")), "[N/A]");
  EXPECT_EQ(duration_text(INFINITY), "[N/A]");
}

TEST(SmiFormat, FitPadWrap) {
  EXPECT_EQ(fit("abcdef", 6), "abcdef");
  EXPECT_EQ(fit("abcdefg", 6), "abc...");
  EXPECT_EQ(pad_right("ab", 4), "ab  ");
  EXPECT_EQ(pad_left("ab", 4), "  ab");
  EXPECT_EQ(pad_left("abcdefgh", 5), "ab...");
  auto lines = wrap("one two three four", 9);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "one two");
  EXPECT_EQ(lines[1], "three");
  EXPECT_EQ(lines[2], "four");
}

TEST(SmiFormat, WrapNeverExceedsWidth) {
  for (const char* text : {"one two three four", "averyveryverylongword and more", ""}) {
    for (size_t w : {1u, 5u, 9u, 40u}) {
      for (const auto& l : wrap(text, w)) EXPECT_LE(l.size(), w) << text;
    }
  }
}

TEST(SmiFields, ResolveAndUnknownField) {
  auto f = resolve_fields(QueryGroup::run, "pid, name,steps_per_s");
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[1]->name, "name");
  EXPECT_EQ(f[2]->unit, "steps/s");
  try {
    resolve_fields(QueryGroup::stage, "name,bogus");
    FAIL();
  } catch (const UsageError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("unknown field \"bogus\" in --query-stage"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blocked_output"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bottleneck"), std::string::npos) << msg;
  }
  EXPECT_THROW(resolve_fields(QueryGroup::gpu, ""), UsageError);
  EXPECT_THROW(resolve_fields(QueryGroup::gpu, "memory.used,pid"), UsageError);
}

TEST(SmiFields, RequiredFieldsExist) {
  auto has = [](QueryGroup g, const std::string& name) {
    for (const auto& f : query_fields(g)) {
      if (f.name == name) return true;
    }
    return false;
  };
  for (const char* n :
       {"index", "name", "temperature.gpu", "power.draw", "power.limit", "memory.used",
        "memory.total", "utilization.gpu", "clocks.sm", "driver_version"})
    EXPECT_TRUE(has(QueryGroup::gpu, n)) << n;
  for (const char* n : {"pid", "name", "preset", "device", "step", "total_steps", "steps_per_s",
                        "samples_per_s", "loss", "eta", "state", "run_dir"})
    EXPECT_TRUE(has(QueryGroup::run, n)) << n;
  for (const char* n :
       {"pid", "run", "name", "kind", "busy", "items_per_s", "latency_ms", "wait_input",
        "blocked_output", "queue_depth", "queue_capacity", "bottleneck"})
    EXPECT_TRUE(has(QueryGroup::stage, n)) << n;
  std::string help = help_query_text();
  for (QueryGroup g : {QueryGroup::gpu, QueryGroup::run, QueryGroup::stage}) {
    for (const auto& f : query_fields(g)) {
      EXPECT_FALSE(f.description.empty()) << f.name;
      EXPECT_NE(help.find(header_cell(f.name, f.unit)), std::string::npos) << f.name;
    }
  }
}

TEST(SmiFields, ParseFormat) {
  CsvOptions o = parse_format("csv");
  EXPECT_TRUE(o.header && o.units);
  o = parse_format("csv,noheader,nounits");
  EXPECT_FALSE(o.header || o.units);
  o = parse_format("nounits,csv");
  EXPECT_TRUE(o.header);
  EXPECT_FALSE(o.units);
  EXPECT_THROW(parse_format("noheader"), UsageError);
  EXPECT_THROW(parse_format("csv,xml"), UsageError);
}

TEST(SmiFields, RenderQueryEscapesAndMarksNotAvailable) {
  Snapshot snap;
  snap.runs.push_back(sample_run());
  auto fields = resolve_fields(QueryGroup::run, "pid,name,total_steps,loss,eta,steps_per_s");
  EXPECT_EQ(render_query(QueryGroup::run, fields, snap, {}),
            "pid, name, total_steps, loss, eta [s], steps_per_s [steps/s]\n"
            "4242, \"demo, \"\"quoted\"\"\", [N/A], [N/A], [N/A], 2.50 steps/s\n");
  EXPECT_EQ(render_query(QueryGroup::run, fields, snap, {false, false}),
            "4242, \"demo, \"\"quoted\"\"\", [N/A], [N/A], [N/A], 2.50\n");
  auto stage = resolve_fields(QueryGroup::stage, "name,busy,latency_ms,bottleneck");
  EXPECT_EQ(render_query(QueryGroup::stage, stage, snap, {true, true}),
            "name, busy [%], latency_ms [ms], bottleneck\n"
            "read, 50.0 %, 0.000 ms, No\n"
            "train, 90.0 %, [N/A], Yes\n");
}

TEST(SmiFields, GpuValuesMissingPrintNotAvailable) {
  Snapshot snap;
  snap.gpu.available = true;
  GpuInfo g;
  g.index = 3;
  g.name = "Some GPU";
  g.memory_used_bytes = 2048ull << 20;
  g.power_mw = 71234;
  snap.gpu.gpus.push_back(g);
  auto f = resolve_fields(
      QueryGroup::gpu, "index,name,memory.used,memory.total,power.draw,fan.speed,driver_version");
  EXPECT_EQ(render_query(QueryGroup::gpu, f, snap, {false, true}),
            "3, Some GPU, 2048 MiB, [N/A], 71.23 W, [N/A], [N/A]\n");
}

TEST(SmiBottleneck, Rule) {
  stats::RunRecord r = sample_run();
  EXPECT_EQ(bottleneck_stage(r), 1);
  // The busiest stage is mostly blocked on output: held back downstream, so not the bottleneck.
  r.stages[1].busy_frac_recent = 0.99;
  r.stages[1].blocked_output_frac_recent = 0.6;
  EXPECT_EQ(bottleneck_stage(r), 0);
  // Exactly at the limit counts as mostly blocked.
  r.stages[0].blocked_output_frac_recent = kBlockedOutputLimit;
  EXPECT_EQ(bottleneck_stage(r), -1);
  // Ties go upstream.
  r = sample_run();
  r.stages[0].busy_frac_recent = r.stages[1].busy_frac_recent = 0.7;
  EXPECT_EQ(bottleneck_stage(r), 0);
  // An idle run has no bottleneck; neither does a run without stages or with NaN readings.
  r.stages[0].busy_frac_recent = r.stages[1].busy_frac_recent = 0;
  EXPECT_EQ(bottleneck_stage(r), -1);
  r.stages[0].busy_frac_recent = std::nan("");
  r.stages[1].blocked_output_frac_recent = std::nan("");
  r.stages[1].busy_frac_recent = 0.9;
  EXPECT_EQ(bottleneck_stage(r), -1);
  r.num_stages = 0;
  EXPECT_EQ(bottleneck_stage(r), -1);
}

// Every line of a box is exactly the table width, whatever the content.
void expect_box_lines_full_width(const std::string& table) {
  std::istringstream in(table);
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first) {  // the local time, as nvidia-smi prints it above the table
      first = false;
      continue;
    }
    if (line.empty() || line.rfind("No NVIDIA GPU found: ", 0) == 0) continue;
    EXPECT_EQ(line.size(), kTableWidth) << "\"" << line << "\"";
    EXPECT_TRUE(line.front() == '|' || line.front() == '+') << line;
    EXPECT_TRUE(line.back() == '|' || line.back() == '+') << line;
  }
}

TEST(SmiTable, NoGpuNoRuns) {
  Snapshot snap;
  snap.stats_dir = "/dev/shm";
  snap.gpu.unavailable_reason =
      "libnvidia-ml.so.1 not loadable (libnvidia-ml.so.1: cannot open "
      "shared object file: No such file or directory)";
  std::string t = render_table(snap, "9.9.9");
  EXPECT_NE(t.find("SLIPSTREAM-SMI 9.9.9"), std::string::npos);
  EXPECT_NE(t.find("Driver Version: N/A"), std::string::npos);
  // One plain line, whatever its length, as nvidia-smi prints "No devices were found".
  EXPECT_NE(t.find("\nNo NVIDIA GPU found: libnvidia-ml.so.1 not loadable (libnvidia-ml.so.1: "
                   "cannot open shared object file: No such file or directory)\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("No running slipstream pipelines found in /dev/shm"), std::string::npos);
  expect_box_lines_full_width(t);
}

TEST(SmiTable, RunsGpusPoolsAndErrorsKeepWidth) {
  Snapshot snap;
  snap.stats_dir = "/tmp";
  snap.gpu.available = true;
  snap.gpu.driver_version = "550.54.15";
  snap.gpu.cuda_version = "12.4";
  GpuInfo g;
  g.name = "A GPU with a very long product name that will not fit in the cell";
  g.bus_id = "00000000:18:00.0";
  g.temperature_c = 27;
  g.power_mw = 71000;
  g.power_limit_mw = 700000;
  g.memory_used_bytes = 1ull << 20;
  g.memory_total_bytes = 81559ull << 20;
  g.utilization_gpu_percent = 100;
  g.clock_sm_mhz = 1980;
  snap.gpu.gpus.push_back(g);
  stats::RunRecord r = sample_run();
  set_text(r.run_name, "a-run-name-that-is-much-longer-than-the-column-for-it-allows");
  set_text(r.stages[0].name, "a-stage-name-longer-than-the-column-has-room-for");
  r.stages[0].items_per_s_recent = 1e12;
  r.stages[0].queue_depth = 4000000000u;
  r.stages[0].queue_capacity = 4000000000u;
  r.num_pools = 1;
  set_text(r.pools[0].name, "device:cuda:0");
  r.pools[0].in_use_bytes = 3ull << 30;
  r.loss = 0.4321;
  r.eta_s = 304;
  r.total_steps = 5000;
  snap.runs.push_back(r);
  snap.errors.push_back({"/tmp/x",
                         "/tmp/x: stats record layout version 2, this slipstream-smi "
                         "reads version 1; use the slipstream-smi of the same build"});
  std::string t = render_table(snap, "0.1.0");
  expect_box_lines_full_width(t);
  EXPECT_NE(t.find("CUDA Version: 12.4"), std::string::npos);
  EXPECT_NE(t.find("71W /  700W"), std::string::npos) << t;
  EXPECT_NE(t.find("1MiB /  81559MiB"), std::string::npos) << t;
  EXPECT_NE(t.find("10 / 5000"), std::string::npos);
  EXPECT_NE(t.find("0:05:04"), std::string::npos);
  EXPECT_NE(t.find("0.4321"), std::string::npos);
  EXPECT_NE(t.find("3.00 GiB"), std::string::npos);
  EXPECT_NE(t.find("layout version 2"), std::string::npos);
  // The train stage is the bottleneck; its line carries the mark.
  std::istringstream in(t);
  std::string line;
  int marks = 0;
  while (std::getline(in, line)) {
    if (line.find(kBottleneckMark) != std::string::npos) {
      ++marks;
      EXPECT_NE(line.find(" train "), std::string::npos) << line;
    }
  }
  EXPECT_EQ(marks, 1);
}

TEST(SmiJson, NanBecomesNull) {
  Snapshot snap;
  snap.runs.push_back(sample_run());
  auto j = snapshot_json(snap, "1.2.3");
  EXPECT_EQ(j["slipstream_smi_version"], "1.2.3");
  EXPECT_TRUE(j["runs"][0]["loss"].is_null());
  EXPECT_TRUE(j["runs"][0]["total_steps"].is_null());
  EXPECT_TRUE(j["runs"][0]["eta_s"].is_null());
  EXPECT_EQ(j["runs"][0]["bottleneck"], "train");
  EXPECT_TRUE(j["runs"][0]["stages"][1]["bottleneck"].get<bool>());
  EXPECT_TRUE(j["runs"][0]["stages"][1]["latency_ms"].is_null());
  auto parsed = nlohmann::json::parse(j.dump());
  EXPECT_EQ(parsed["runs"][0]["bottleneck"], "train");
}

// Names come from records any process of the user can plant (issue 16).
TEST(SmiFormat, PrintableEscapesControlsAndInvalidBytes) {
  EXPECT_EQ(printable("plain name"), "plain name");
  EXPECT_EQ(printable("caf\xC3\xA9 \xE2\x82\xAC"), "caf\xC3\xA9 \xE2\x82\xAC");
  EXPECT_EQ(printable("\x1b[2Jx\ny\r\tz\x7f"), "\\x1b[2Jx\\ny\\r\\tz\\x7f");
  EXPECT_EQ(printable("\xC2\x9B"
                      "31m"),
            "\\x9b"
            "31m");                                                           // C1 CSI
  EXPECT_EQ(printable("ab\xE2\x82"), "ab\\xe2\\x82");                         // a cut character
  EXPECT_EQ(printable("\xC0\xAF\xED\xA0\x80"), "\\xc0\\xaf\\xed\\xa0\\x80");  // overlong, surrogate
  EXPECT_EQ(valid_utf8("ab\xE2\x82"), "ab\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");
  // fit counts columns, not bytes, and never cuts inside a character.
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(fit(euro + euro + euro, 8), euro + euro + euro);
  EXPECT_EQ(fit(euro + euro + euro, 2), euro + euro);
  EXPECT_EQ(fit(euro + euro + euro + euro + euro, 4), euro + "...");
  EXPECT_EQ(pad_right("\xC3\xBCn\xC3\xAF", 5), "\xC3\xBCn\xC3\xAF  ");  // "ünï": 3 columns
  EXPECT_EQ(pad_left("\xC3\xBC", 3), "  \xC3\xBC");
  // East Asian wide characters take two columns each.
  const std::string name = "\xE5\x90\x8D";  // 名
  EXPECT_EQ(display_width(name + name), 4u);
  EXPECT_EQ(fit(name + name + name + name, 5), name + "...");
  EXPECT_EQ(display_width(pad_right(name, 5)), 5u);
}

TEST(SmiFormat, AbsurdReadingsAreNotAvailable) {
  for (double v : {1e300, std::nan(""), -1.0, -HUGE_VAL, HUGE_VAL}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(duration_text(v), "[N/A]");
    EXPECT_EQ(compact_rate(v), "[N/A]");
    EXPECT_EQ(latency_text(v), "[N/A]");
    EXPECT_EQ(percent_text(v), "[N/A]");
  }
  EXPECT_EQ(compact_rate(1e13), "[N/A]");
  EXPECT_EQ(compact_rate(99e9), "99000.0M");
  EXPECT_EQ(percent_text(1.02), "102.0%");  // timing jitter past 1 is still a reading
}

stats::RunRecord hostile_run() {
  stats::RunRecord r = sample_run();
  set_text(r.run_name, std::string("evil\x1b[2J\nname,") + "\xE2\x82");
  set_text(r.preset, "p\rq");
  set_text(r.stages[0].name, "st\x1b]0;title\x07");
  set_text(r.stages[0].kind, "\xFF\xFE");
  r.eta_s = 1e300;
  r.steps_per_s = 1e300;
  r.samples_per_s = -5;
  r.loss = INFINITY;
  r.stages[0].busy_frac_recent = 1e300;
  r.stages[0].items_per_s_recent = -1;
  r.stages[0].mean_latency_ms_recent = 1e300;
  r.stages[1].wait_input_frac_recent = -0.5;
  r.data_wait_frac_recent = 1e300;
  r.host_rss_bytes = UINT64_MAX;
  r.device_reserved_bytes = UINT64_MAX;
  r.validation_loss = -INFINITY;
  r.best_validation_loss = NAN;
  r.num_pools = 1;
  set_text(r.pools[0].name, "pool\x1b[31m");
  return r;
}

TEST(SmiTable, PlantedNamesAndAbsurdValuesCannotDriveTheTerminal) {
  Snapshot snap;
  snap.runs.push_back(hostile_run());
  const std::string t = render_table(snap, "0.1.0");
  EXPECT_EQ(t.find('\x1b'), std::string::npos) << t;
  EXPECT_EQ(t.find('\r'), std::string::npos) << t;
  EXPECT_EQ(t.find('\x07'), std::string::npos) << t;
  EXPECT_NE(t.find("evil\\x1b[2J\\nname,\\xe2\\x82"), std::string::npos) << t;
  EXPECT_NE(t.find("st\\x1b]0;title\\x07"), std::string::npos) << t;
  expect_box_lines_full_width(t);  // also: no row was broken by a newline
  // The run rows: absurd rates, loss and ETA print [N/A], not digits.
  const std::string na_pair = "[N/A]" + std::string(12, ' ') + "[N/A]";
  std::istringstream in(t);
  std::string line;
  int run_rows = 0;
  while (std::getline(in, line)) {
    if (line.find("evil") != std::string::npos && line.find("running") != std::string::npos) {
      ++run_rows;
      EXPECT_NE(line.find(na_pair), std::string::npos) << line;  // steps/s, samples/s
    }
    if (line.find("p\\rq") != std::string::npos) {
      ++run_rows;
      EXPECT_NE(line.find(na_pair), std::string::npos) << line;  // loss, ETA
    }
    EXPECT_EQ(line.find("e+"), std::string::npos) << line;
    EXPECT_EQ(line.find("000000"), std::string::npos) << line;
  }
  EXPECT_EQ(run_rows, 2) << t;

  const std::string dmon = dmon_lines(parse_dmon_groups("rs"), snap);
  EXPECT_EQ(dmon.find('\x1b'), std::string::npos) << dmon;
  EXPECT_EQ(std::count(dmon.begin(), dmon.end(), '\n'), 1) << dmon;
}

TEST(SmiFields, CsvEscapesControlCharactersAndDropsAbsurdValues) {
  Snapshot snap;
  snap.runs.push_back(hostile_run());
  auto fields = resolve_fields(QueryGroup::run, "name,preset,eta,steps_per_s,samples_per_s,loss");
  EXPECT_EQ(render_query(QueryGroup::run, fields, snap, {false, false}),
            "\"evil\\x1b[2J\\nname,\\xe2\\x82\", p\\rq, [N/A], [N/A], [N/A], [N/A]\n");
  auto stage =
      resolve_fields(QueryGroup::stage, "name,kind,busy,items_per_s,latency_ms,wait_input");
  EXPECT_EQ(render_query(QueryGroup::stage, stage, snap, {false, false}),
            "st\\x1b]0;title\\x07, \\xff\\xfe, [N/A], [N/A], [N/A], 0.0\n"
            "train, train, 90.0, 0.0, [N/A], [N/A]\n");
}

TEST(SmiJson, InvalidUtf8AndAbsurdValuesStillDump) {
  Snapshot snap;
  snap.runs.push_back(hostile_run());
  const auto j = snapshot_json(snap, "1.2.3");
  std::string text;
  ASSERT_NO_THROW(text = j.dump(2));  // type_error 316 before: the whole snapshot failed
  const auto parsed = nlohmann::json::parse(text);
  const auto& run = parsed["runs"][0];
  EXPECT_EQ(run["name"], "evil\x1b[2J\nname,\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(run["stages"][0]["kind"], "\xEF\xBF\xBD\xEF\xBF\xBD");
  for (const char* k : {"eta_s", "steps_per_s", "samples_per_s", "loss"})
    EXPECT_TRUE(run[k].is_null()) << k << ": " << run[k];
  for (const char* k : {"busy_frac", "items_per_s", "latency_ms"})
    EXPECT_TRUE(run["stages"][0][k].is_null()) << k << ": " << run["stages"][0][k];
  EXPECT_TRUE(run["stages"][1]["wait_input_frac"].is_null());
  EXPECT_DOUBLE_EQ(run["stages"][1]["busy_frac"].get<double>(), 0.9);
}

TEST(SmiDmon, GroupsAndHeader) {
  EXPECT_THROW(parse_dmon_groups("px"), UsageError);
  EXPECT_THROW(parse_dmon_groups(""), UsageError);
  DmonGroups g = parse_dmon_groups("r");
  EXPECT_FALSE(g.any_gpu());
  std::string h = dmon_header(g);
  EXPECT_EQ(h.rfind("# ", 0), 0u);
  EXPECT_EQ(h.find("gpu"), std::string::npos);
  EXPECT_NE(h.find("stp/s"), std::string::npos);
  Snapshot snap;
  snap.runs.push_back(sample_run());
  std::string lines = dmon_lines(parse_dmon_groups("pucrs"), snap);
  // No GPUs: one line, for the run; GPU columns show "-".
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 1);
  EXPECT_NE(lines.find("4242"), std::string::npos);
  EXPECT_NE(lines.find("train"), std::string::npos);
}

TEST(SmiNvml, MissingLibraryIsReportedNotFatal) {
  Nvml nvml("/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(nvml.device_count(), 0u);
  GpuReport r = nvml.query({});
  EXPECT_FALSE(r.available);
  EXPECT_EQ(r.unavailable_reason.rfind("/nonexistent/libnvidia-ml.so.1 not loadable (", 0), 0u)
      << r.unavailable_reason;
  EXPECT_TRUE(r.gpus.empty());
}

}  // namespace
}  // namespace slipstream::smi
