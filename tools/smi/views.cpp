#include "views.h"

#include <cmath>
#include <ctime>

#include "fields.h"
#include "format.h"

namespace slipstream::smi {
namespace {

using stats::RunRecord;
using stats::StageCounters;

constexpr size_t kInner = kTableWidth - 4;  // between "| " and " |"
// The three cells of the GPU and pipeline rows, as nvidia-smi splits its rows.
constexpr size_t kCell1 = 42, kCell2 = 28, kCell3 = 30;
static_assert(kCell1 + kCell2 + kCell3 + 10 == kTableWidth);
// The third cell holds two right-aligned readings.
constexpr size_t kSub1 = 13, kSub2 = 17;
static_assert(kSub1 + kSub2 == kCell3);

std::string rule(char fill = '-', char edge = '+') {
  return edge + std::string(kTableWidth - 2, fill) + edge + "\n";
}
std::string cell_rule(char fill = '-', char edge = '+', char join = '+') {
  return edge + std::string(kCell1 + 2, fill) + join + std::string(kCell2 + 2, fill) + join +
         std::string(kCell3 + 2, fill) + edge + "\n";
}
std::string row(std::string_view text) {
  return cat("| ", pad_right(text, kInner), " |\n");
}
std::string rows_wrapped(std::string_view text) {
  std::string out;
  for (const auto& l : wrap(text, kInner)) out += row(l);
  return out;
}
std::string cells(std::string_view a, std::string_view b, std::string_view c) {
  return cat("| ", pad_right(a, kCell1), " | ", pad_right(b, kCell2), " | ", pad_right(c, kCell3),
             " |\n");
}

std::string or_na(const std::string& s) {
  return s.empty() ? "N/A" : s;
}
template <class T>
std::string opt_text(const std::optional<T>& v, std::string_view suffix) {
  return v ? std::to_string(*v) + std::string(suffix) : std::string("N/A");
}

std::string local_time(std::chrono::system_clock::time_point t, const char* format) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string gpu_section(const Snapshot& snap) {
  // Like nvidia-smi's "No devices were found": one plain line under the header box.
  if (!snap.gpu.available)
    return cat(rule(), "No NVIDIA GPU found: ", snap.gpu.unavailable_reason, "\n");
  std::string out = cell_rule();
  out += cells("GPU  Name", pad_left("Bus-Id", kCell2),
               pad_left("GPU-Util", kSub1) + pad_left("Mem-Util", kSub2));
  out += cells(cat("Fan  Temp   Perf", pad_left("Pwr:Usage/Cap", kCell1 - 16)),
               pad_left("Memory-Usage", kCell2),
               pad_left("SM Clock", kSub1) + pad_left("Mem Clock", kSub2));
  out += cell_rule('=', '|', '+');
  if (snap.gpu.gpus.empty()) return out + row("No GPU matches the -i selection") + rule();
  for (const auto& g : snap.gpu.gpus) {
    const auto& gp = g;
    std::string power =
        pad_left(gp.power_mw ? std::to_string((*gp.power_mw + 500) / 1000) + "W" : "N/A", 5) +
        " / " +
        pad_left(
            gp.power_limit_mw ? std::to_string((*gp.power_limit_mw + 500) / 1000) + "W" : "N/A", 5);
    std::string line2 = pad_left(opt_text(gp.fan_percent, "%"), 3) + "  " +
                        pad_left(opt_text(gp.temperature_c, "C"), 4) + "    " +
                        pad_right(gp.pstate ? pstate_name(*gp.pstate) : std::string("N/A"), 3);
    line2 += pad_left(power, kCell1 - line2.size());
    std::string memory =
        (gp.memory_used_bytes ? std::to_string(to_mib(*gp.memory_used_bytes)) + "MiB" : "N/A") +
        " / " +
        pad_left(
            gp.memory_total_bytes ? std::to_string(to_mib(*gp.memory_total_bytes)) + "MiB" : "N/A",
            9);
    out += cells(pad_left(std::to_string(g.index), 3) + "  " +
                     fit(g.name.empty() ? "N/A" : g.name, kCell1 - 5),
                 pad_left(or_na(g.bus_id), kCell2),
                 pad_left(opt_text(g.utilization_gpu_percent, "%"), kSub1) +
                     pad_left(opt_text(g.utilization_memory_percent, "%"), kSub2));
    out += cells(line2, pad_left(memory, kCell2),
                 pad_left(opt_text(g.clock_sm_mhz, "MHz"), kSub1) +
                     pad_left(opt_text(g.clock_memory_mhz, "MHz"), kSub2));
    out += cell_rule();
  }
  return out;
}

std::string step_text(const RunRecord& r) {
  return std::to_string(r.step) + " / " + (r.total_steps ? std::to_string(r.total_steps) : "?");
}
std::string loss_text(double loss) {
  if (!std::isfinite(loss)) return std::string(kNotAvailable);
  char buf[32];
  const bool plain = loss == 0 || (std::fabs(loss) >= 1e-3 && std::fabs(loss) < 1e5);
  std::snprintf(buf, sizeof buf, plain ? "%.4f" : "%.3e", loss);
  return buf;
}

std::string runs_section(const Snapshot& snap) {
  std::string out = cat("\n", rule());
  out += row("Pipelines:");
  out += cell_rule('-', '|', '+');
  out += cells("    PID  Run", pad_left("State", kCell2),
               pad_left("Steps/s", kSub1) + pad_left("Samples/s", kSub2));
  out += cells("         Preset                 Device", pad_left("Step / Total", kCell2),
               pad_left("Loss", kSub1) + pad_left("ETA", kSub2));
  out += cells("         Data-Wait     Host-RSS", pad_left("Device-Mem", kCell2),
               pad_left("Val-Loss", kSub1) + pad_left("Best-Val", kSub2));
  out += cell_rule('=', '|', '+');
  if (snap.runs.empty()) {
    out += row(cat("No running slipstream pipelines found in ", snap.stats_dir));
    return out + rule();
  }
  const double now = std::chrono::duration<double>(snap.taken.time_since_epoch()).count();
  for (const auto& r : snap.runs) {
    out += cells(pad_left(std::to_string(r.pid), 7) + "  " + fit(printable(r.run_name), kCell1 - 9),
                 pad_left(run_state_text(r, now), kCell2),
                 pad_left(compact_rate(r.steps_per_s), kSub1) +
                     pad_left(compact_rate(r.samples_per_s), kSub2));
    out += cells(cat("         ", pad_right(printable(r.preset), 22), " ",
                     fit(printable(r.device), kCell1 - 32)),
                 pad_left(step_text(r), kCell2),
                 pad_left(loss_text(r.loss), kSub1) + pad_left(duration_text(r.eta_s), kSub2));
    out += cells(
        cat("         ", pad_left(percent_text(r.data_wait_frac_recent), 9), "   ",
            pad_left(r.host_rss_bytes ? human_bytes(r.host_rss_bytes) : std::string(kNotAvailable),
                     10)),
        pad_left(r.device_reserved_bytes ? human_bytes(r.device_reserved_bytes)
                                         : std::string(kNotAvailable),
                 kCell2),
        pad_left(loss_text(r.validation_loss), kSub1) +
            pad_left(loss_text(r.best_validation_loss), kSub2));
    out += cell_rule();
  }
  return out;
}

// Stage table columns: name, kind, busy, items/s, latency, wait-in, blocked, queue.
constexpr size_t kName = 22, kKind = 10, kBusy = 6, kRate = 9, kLat = 9, kPct = 8, kQueue = 11;

std::string stage_line(std::string_view name, std::string_view kind, std::string_view busy,
                       std::string_view rate, std::string_view latency, std::string_view wait,
                       std::string_view blocked, std::string_view queue, std::string_view mark) {
  std::string l = " ";
  for (const std::string& cell :
       {pad_right(name, kName), pad_right(kind, kKind), pad_left(busy, kBusy),
        pad_left(rate, kRate), pad_left(latency, kLat), pad_left(wait, kPct),
        pad_left(blocked, kPct), pad_left(queue, kQueue)}) {
    l += cell;
    l += ' ';
  }
  if (!mark.empty()) {
    l += ' ';
    l += mark;
  }
  return l;
}

std::string pct_or_na(double f) {
  std::string s = percent_text(f);
  return s == kNotAvailable ? "N/A" : s;
}

std::string run_detail(const RunRecord& r) {
  std::string out = cat("\n", rule());
  out += row(cat("Stages of ", std::to_string(r.pid), " ", printable(r.run_name), ":"));
  out += row(
      stage_line("Stage", "Kind", "Busy", "Items/s", "Latency", "Wait-In", "Blocked", "Queue", ""));
  out += rule('=', '|');
  if (r.num_stages == 0) out += row(" (no stages published yet)");
  const int bottleneck = bottleneck_stage(r);
  for (uint32_t i = 0; i < r.num_stages; ++i) {
    const StageCounters& s = r.stages[i];
    std::string rate = compact_rate(s.items_per_s_recent);
    std::string latency = latency_text(s.mean_latency_ms_recent);
    std::string queue = std::to_string(s.queue_depth) + "/" +
                        (s.queue_capacity ? std::to_string(s.queue_capacity) : std::string("-"));
    out += row(
        stage_line(printable(s.name), printable(s.kind), pct_or_na(s.busy_frac_recent),
                   rate == kNotAvailable ? "N/A" : rate, latency == kNotAvailable ? "N/A" : latency,
                   pct_or_na(s.wait_input_frac_recent), pct_or_na(s.blocked_output_frac_recent),
                   queue, static_cast<int>(i) == bottleneck ? kBottleneckMark : ""));
  }
  if (r.num_pools > 0) {
    out += rule('-', '|');
    out += row(cat(" ", pad_right("Memory pool", kName), " ", pad_left("In use", 12),
                   pad_left("Reserved", 12), pad_left("Peak", 12), pad_left("Allocs", 12),
                   pad_left("Failures", 10)));
    for (uint32_t i = 0; i < r.num_pools; ++i) {
      const auto& p = r.pools[i];
      out += row(cat(
          " ", pad_right(printable(p.name), kName), " ", pad_left(human_bytes(p.in_use_bytes), 12),
          pad_left(human_bytes(p.reserved_bytes), 12), pad_left(human_bytes(p.peak_bytes), 12),
          pad_left(std::to_string(p.allocations), 12), pad_left(std::to_string(p.failures), 10)));
    }
  }
  return out + rule();
}

nlohmann::json num_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}
// Absurd readings (see plausible) are null, not numbers nobody can use.
nlohmann::json bounded_or_null(double v, double max) {
  return plausible(v, max) ? nlohmann::json(v) : nlohmann::json();
}
// Record text as a JSON string: dump() throws on invalid UTF-8, so bad bytes become U+FFFD.
nlohmann::json text_json(std::string_view s) {
  return valid_utf8(s);
}
template <class T>
nlohmann::json opt_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

// dmon: one column of the interval lines.
struct DmonColumn {
  std::string name, unit;
  size_t width;
};

std::vector<DmonColumn> dmon_columns(const DmonGroups& g) {
  std::vector<DmonColumn> cols;
  if (g.any_gpu()) cols.push_back({"gpu", "Idx", 3});
  if (g.any_run()) cols.push_back({"pid", "#", 7});
  if (g.power) {
    cols.push_back({"pwr", "W", 5});
    cols.push_back({"gtemp", "C", 5});
  }
  if (g.utilization) {
    cols.push_back({"sm", "%", 4});
    cols.push_back({"mem", "%", 4});
  }
  if (g.memory) cols.push_back({"fb", "MB", 7});
  if (g.clocks) {
    cols.push_back({"mclk", "MHz", 5});
    cols.push_back({"pclk", "MHz", 5});
  }
  if (g.run_rate) {
    cols.push_back({"step", "#", 9});
    cols.push_back({"stp/s", "1/s", 8});
    cols.push_back({"smp/s", "1/s", 8});
    cols.push_back({"loss", "-", 10});
    cols.push_back({"eta", "s", 8});
  }
  if (g.stages) {
    cols.push_back({"bneck", "name", 16});
    cols.push_back({"busy", "%", 5});
    cols.push_back({"it/s", "1/s", 8});
  }
  return cols;
}

std::string dmon_join(const std::vector<DmonColumn>& cols, const std::vector<std::string>& values,
                      std::string_view lead) {
  std::string out(lead);
  for (size_t i = 0; i < cols.size(); ++i) {
    std::string v = values[i];
    for (char& c : v) {
      if (c == ' ') c = '_';  // keep columns splittable on whitespace
    }
    if (i) out += ' ';
    out += cols[i].name == "bneck" ? pad_right(v, cols[i].width) : pad_left(v, cols[i].width);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out + "\n";
}

}  // namespace

std::string render_table(const Snapshot& snap, std::string_view version) {
  std::string out = local_time(snap.taken, "%a %b %e %H:%M:%S %Y") + "\n";
  out += rule();
  std::string head = cat(pad_right(cat("SLIPSTREAM-SMI ", version), 36),
                         pad_right(cat("Driver Version: ", or_na(snap.gpu.driver_version)), 40),
                         "CUDA Version: ", or_na(snap.gpu.cuda_version));
  out += row(head);
  out += gpu_section(snap);
  out += runs_section(snap);
  for (const auto& r : snap.runs) out += run_detail(r);
  if (!snap.errors.empty()) {
    out += cat("\n", rule());
    out += row("Unreadable stats records:");
    out += rule('=', '|');
    for (const auto& e : snap.errors) out += rows_wrapped(cat("error: ", printable(e.message)));
    out += rule();
  }
  return out;
}

nlohmann::json snapshot_json(const Snapshot& snap, std::string_view version) {
  using nlohmann::json;
  json j;
  j["slipstream_smi_version"] = std::string(version);
  j["timestamp"] = local_time(snap.taken, "%Y-%m-%dT%H:%M:%S%z");
  j["unix_time"] = std::chrono::duration<double>(snap.taken.time_since_epoch()).count();
  j["stats_dir"] = snap.stats_dir;
  j["driver_version"] = snap.gpu.driver_version.empty() ? json() : json(snap.gpu.driver_version);
  j["cuda_version"] = snap.gpu.cuda_version.empty() ? json() : json(snap.gpu.cuda_version);
  j["gpu_unavailable"] = snap.gpu.available ? json() : json(snap.gpu.unavailable_reason);
  j["gpus"] = json::array();
  for (const auto& g : snap.gpu.gpus) {
    json o;
    o["index"] = g.index;
    o["name"] = g.name;
    o["pci_bus_id"] = g.bus_id.empty() ? json() : json(g.bus_id);
    o["temperature_gpu_c"] = opt_json(g.temperature_c);
    o["fan_speed_percent"] = opt_json(g.fan_percent);
    o["pstate"] = g.pstate ? json(pstate_name(*g.pstate)) : json();
    o["power_draw_w"] = g.power_mw ? json(*g.power_mw / 1000.0) : json();
    o["power_limit_w"] = g.power_limit_mw ? json(*g.power_limit_mw / 1000.0) : json();
    o["memory_used_mib"] = g.memory_used_bytes ? json(to_mib(*g.memory_used_bytes)) : json();
    o["memory_total_mib"] = g.memory_total_bytes ? json(to_mib(*g.memory_total_bytes)) : json();
    o["utilization_gpu_percent"] = opt_json(g.utilization_gpu_percent);
    o["utilization_memory_percent"] = opt_json(g.utilization_memory_percent);
    o["clocks_sm_mhz"] = opt_json(g.clock_sm_mhz);
    o["clocks_gr_mhz"] = opt_json(g.clock_graphics_mhz);
    o["clocks_mem_mhz"] = opt_json(g.clock_memory_mhz);
    j["gpus"].push_back(std::move(o));
  }
  j["runs"] = json::array();
  const double now = std::chrono::duration<double>(snap.taken.time_since_epoch()).count();
  for (const auto& r : snap.runs) {
    const int bottleneck = bottleneck_stage(r);
    json o;
    o["pid"] = r.pid;
    o["uid"] = r.uid;
    o["name"] = text_json(r.run_name);
    o["preset"] = text_json(r.preset);
    o["device"] = text_json(r.device);
    o["state"] = run_state_text(r, now);
    o["heartbeat_age_s"] = r.update_unix_ns ? json(heartbeat_age_s(r, now)) : json();
    o["run_dir"] = text_json(r.run_dir);
    o["start_unix_ns"] = r.start_unix_ns;
    o["update_unix_ns"] = r.update_unix_ns;
    o["step"] = r.step;
    o["total_steps"] = r.total_steps ? json(r.total_steps) : json();
    o["samples"] = r.samples;
    o["loss"] = num_or_null(r.loss);
    o["steps_per_s"] = bounded_or_null(r.steps_per_s, kMaxRate);
    o["samples_per_s"] = bounded_or_null(r.samples_per_s, kMaxRate);
    o["eta_s"] = bounded_or_null(r.eta_s, kMaxSeconds);
    o["data_wait_frac"] = bounded_or_null(r.data_wait_frac_recent, kMaxFraction);
    o["host_rss_bytes"] = r.host_rss_bytes ? json(r.host_rss_bytes) : json();
    o["device_reserved_bytes"] = r.device_reserved_bytes ? json(r.device_reserved_bytes) : json();
    o["validation_loss"] = num_or_null(r.validation_loss);
    o["best_validation_loss"] = num_or_null(r.best_validation_loss);
    o["cuda_graph_replayed_pct"] =
        r.graph_batches ? json(100.0 * double(r.graph_replayed) / double(r.graph_batches)) : json();
    o["bottleneck"] = bottleneck >= 0 ? text_json(r.stages[bottleneck].name) : json();
    o["stages"] = json::array();
    for (uint32_t i = 0; i < r.num_stages; ++i) {
      const auto& s = r.stages[i];
      json st;
      st["index"] = i;
      st["name"] = text_json(s.name);
      st["kind"] = text_json(s.kind);
      st["flags"] = s.flags;
      st["source"] = (s.flags & stats::kStageSource) != 0;
      st["trainable"] = (s.flags & stats::kStageTrainable) != 0;
      st["loss"] = (s.flags & stats::kStageLoss) != 0;
      st["on_device"] = (s.flags & stats::kStageDevice) != 0;
      st["concurrency"] = s.concurrency;
      st["items_in"] = s.items_in;
      st["items_out"] = s.items_out;
      st["busy_ns"] = s.busy_ns;
      st["wait_input_ns"] = s.wait_input_ns;
      st["blocked_output_ns"] = s.blocked_output_ns;
      st["queue_depth"] = s.queue_depth;
      st["queue_capacity"] = s.queue_capacity;
      st["items_per_s"] = bounded_or_null(s.items_per_s_recent, kMaxRate);
      st["busy_frac"] = bounded_or_null(s.busy_frac_recent, kMaxFraction);
      st["wait_input_frac"] = bounded_or_null(s.wait_input_frac_recent, kMaxFraction);
      st["blocked_output_frac"] = bounded_or_null(s.blocked_output_frac_recent, kMaxFraction);
      st["latency_ms"] = bounded_or_null(s.mean_latency_ms_recent, kMaxSeconds * 1e3);
      st["bottleneck"] = static_cast<int>(i) == bottleneck;
      o["stages"].push_back(std::move(st));
    }
    o["pools"] = json::array();
    for (uint32_t i = 0; i < r.num_pools; ++i) {
      const auto& p = r.pools[i];
      o["pools"].push_back({{"name", text_json(p.name)},
                            {"in_use_bytes", p.in_use_bytes},
                            {"reserved_bytes", p.reserved_bytes},
                            {"peak_bytes", p.peak_bytes},
                            {"allocations", p.allocations},
                            {"failures", p.failures}});
    }
    j["runs"].push_back(std::move(o));
  }
  j["errors"] = json::array();
  for (const auto& e : snap.errors)
    j["errors"].push_back({{"path", text_json(e.path)}, {"error", text_json(e.message)}});
  return j;
}

DmonGroups parse_dmon_groups(std::string_view letters) {
  DmonGroups g;
  for (char c : letters) {
    switch (c) {
      case 'p':
        g.power = true;
        break;
      case 'u':
        g.utilization = true;
        break;
      case 'm':
        g.memory = true;
        break;
      case 'c':
        g.clocks = true;
        break;
      case 'r':
        g.run_rate = true;
        break;
      case 's':
        g.stages = true;
        break;
      default:
        throw UsageError(std::string("unknown dmon group '") + c +
                         "' in -s; valid: p (power/temp), u (utilisation), m (memory), c (clocks), "
                         "r (run step rate), s (stage summary)");
    }
  }
  if (!g.any_gpu() && !g.any_run()) throw UsageError("-s needs at least one group letter");
  return g;
}

std::string dmon_header(const DmonGroups& groups) {
  auto cols = dmon_columns(groups);
  std::vector<std::string> names, units;
  for (const auto& c : cols) {
    names.push_back(c.name);
    units.push_back(c.unit);
  }
  return dmon_join(cols, names, "# ") + dmon_join(cols, units, "# ");
}

std::string dmon_lines(const DmonGroups& groups, const Snapshot& snap) {
  auto cols = dmon_columns(groups);
  const std::string dash = "-";
  std::string out;
  auto u = [&](const std::optional<unsigned>& v) { return v ? std::to_string(*v) : dash; };
  if (groups.any_gpu()) {
    for (const auto& g : snap.gpu.gpus) {
      std::vector<std::string> v;
      for (const auto& c : cols) {
        if (c.name == "gpu")
          v.push_back(std::to_string(g.index));
        else if (c.name == "pwr")
          v.push_back(g.power_mw ? std::to_string((*g.power_mw + 500) / 1000) : dash);
        else if (c.name == "gtemp")
          v.push_back(u(g.temperature_c));
        else if (c.name == "sm")
          v.push_back(u(g.utilization_gpu_percent));
        else if (c.name == "mem")
          v.push_back(u(g.utilization_memory_percent));
        else if (c.name == "fb")
          v.push_back(g.memory_used_bytes ? std::to_string(to_mib(*g.memory_used_bytes)) : dash);
        else if (c.name == "mclk")
          v.push_back(u(g.clock_memory_mhz));
        else if (c.name == "pclk")
          v.push_back(u(g.clock_graphics_mhz));
        else
          v.push_back(dash);
      }
      out += dmon_join(cols, v, "  ");
    }
  }
  if (groups.any_run()) {
    const double now = std::chrono::duration<double>(snap.taken.time_since_epoch()).count();
    for (const auto& r : snap.runs) {
      const int b = bottleneck_stage(r);
      // A stale run's rates and ETA are from before it stopped: not shown as if it ran.
      const bool stale = is_stale(r, now);
      std::vector<std::string> v;
      for (const auto& c : cols) {
        auto na = [&](const std::string& s) { return stale || s == kNotAvailable ? dash : s; };
        if (c.name == "pid")
          v.push_back(std::to_string(r.pid));
        else if (c.name == "step")
          v.push_back(std::to_string(r.step));
        else if (c.name == "stp/s")
          v.push_back(na(compact_rate(r.steps_per_s)));
        else if (c.name == "smp/s")
          v.push_back(na(compact_rate(r.samples_per_s)));
        else if (c.name == "loss")
          v.push_back(std::isfinite(r.loss) ? loss_text(r.loss) : dash);
        else if (c.name == "eta")
          v.push_back(!stale && plausible(r.eta_s, kMaxSeconds) ? fixed_or_na(r.eta_s, 0) : dash);
        else if (c.name == "bneck")
          v.push_back(b >= 0 ? printable(r.stages[b].name) : dash);
        else if (c.name == "busy")
          v.push_back(b >= 0 && !stale && plausible(r.stages[b].busy_frac_recent, kMaxFraction)
                          ? fixed_or_na(r.stages[b].busy_frac_recent * 100, 1)
                          : dash);
        else if (c.name == "it/s")
          v.push_back(b >= 0 ? na(compact_rate(r.stages[b].items_per_s_recent)) : dash);
        else
          v.push_back(dash);
      }
      out += dmon_join(cols, v, "  ");
    }
  }
  return out;
}

}  // namespace slipstream::smi
