#include "fields.h"

#include <cmath>
#include <optional>

namespace slipstream::smi {
namespace {

using Opt = std::optional<std::string>;

FieldValue text(std::string s) {
  return {std::move(s), {}};
}
FieldValue with_unit(Opt s, std::string unit) {
  return {std::move(s), std::move(unit)};
}
template <class T>
Opt num(const std::optional<T>& v) {
  return v ? Opt(std::to_string(*v)) : std::nullopt;
}
Opt mw_to_w(const std::optional<unsigned>& mw) {
  return mw ? fixed(*mw / 1000.0, 2) : std::nullopt;
}
Opt mib(const std::optional<uint64_t>& bytes) {
  return bytes ? Opt(std::to_string(to_mib(*bytes))) : std::nullopt;
}
Opt percent(double fraction) {
  return plausible(fraction, kMaxFraction) ? fixed(fraction * 100.0, 1) : std::nullopt;
}
// A reading within [0, max] printed with `decimals`, else nothing ([N/A]).
Opt bounded(double v, double max, int decimals) {
  return plausible(v, max) ? fixed(v, decimals) : std::nullopt;
}
Opt pstate_text(const std::optional<int>& p) {
  return p ? Opt(pstate_name(*p)) : std::nullopt;
}
Opt unless_empty(const std::string& s) {
  return s.empty() ? std::nullopt : Opt(s);
}

// A loss to 6 significant digits; [N/A] when not finite (none yet).
FieldValue loss_value(double v) {
  if (!std::isfinite(v)) return FieldValue{};
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return text(buf);
}

const stats::StageCounters& stage_of(const RowContext& c) {
  return c.run->stages[c.stage];
}

std::vector<FieldDef> gpu_fields() {
  return {
      {"index", "", "Zero-based index of the GPU, as NVML enumerates it (the -i ID).",
       [](const RowContext& c) { return text(std::to_string(c.gpu->index)); }},
      {"name", "", "Product name of the GPU.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.gpu->name), {}};
       }},
      {"pci.bus_id", "", "PCI bus id as domain:bus:device.function.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.gpu->bus_id), {}};
       }},
      {"temperature.gpu", "", "Core GPU temperature in degrees C.",
       [](const RowContext& c) {
         return FieldValue{num(c.gpu->temperature_c), {}};
       }},
      {"fan.speed", "%", "Fan speed as a percent of its maximum.",
       [](const RowContext& c) { return with_unit(num(c.gpu->fan_percent), "%"); }},
      {"pstate", "", "Performance state, P0 (maximum) to P15 (minimum).",
       [](const RowContext& c) {
         return FieldValue{pstate_text(c.gpu->pstate), {}};
       }},
      {"power.draw", "W", "Power drawn by the whole board, in watts.",
       [](const RowContext& c) { return with_unit(mw_to_w(c.gpu->power_mw), "W"); }},
      {"power.limit", "W", "Power limit the driver enforces, in watts.",
       [](const RowContext& c) { return with_unit(mw_to_w(c.gpu->power_limit_mw), "W"); }},
      {"memory.used", "MiB", "Device memory allocated, in MiB.",
       [](const RowContext& c) { return with_unit(mib(c.gpu->memory_used_bytes), "MiB"); }},
      {"memory.total", "MiB", "Total device memory, in MiB.",
       [](const RowContext& c) { return with_unit(mib(c.gpu->memory_total_bytes), "MiB"); }},
      {"utilization.gpu", "%", "Percent of the last sample period a kernel was running.",
       [](const RowContext& c) { return with_unit(num(c.gpu->utilization_gpu_percent), "%"); }},
      {"utilization.memory", "%", "Percent of the last sample period memory was read or written.",
       [](const RowContext& c) { return with_unit(num(c.gpu->utilization_memory_percent), "%"); }},
      {"clocks.sm", "MHz", "Current SM clock.",
       [](const RowContext& c) { return with_unit(num(c.gpu->clock_sm_mhz), "MHz"); }},
      {"clocks.gr", "MHz", "Current graphics clock.",
       [](const RowContext& c) { return with_unit(num(c.gpu->clock_graphics_mhz), "MHz"); }},
      {"clocks.mem", "MHz", "Current memory clock.",
       [](const RowContext& c) { return with_unit(num(c.gpu->clock_memory_mhz), "MHz"); }},
      {"driver_version", "", "Version of the installed NVIDIA driver.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.report->driver_version), {}};
       }},
  };
}

std::vector<FieldDef> run_fields() {
  return {
      {"pid", "", "Process id of the running pipeline.",
       [](const RowContext& c) { return text(std::to_string(c.run->pid)); }},
      {"name", "", "Run name.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.run->run_name), {}};
       }},
      {"preset", "", "Preset the run was started from.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.run->preset), {}};
       }},
      {"device", "", "Device the run trains on (cpu, cuda:0, ...).",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.run->device), {}};
       }},
      {"state", "",
       "starting, running, finishing, done or failed; \"stale 83s\" for a run that has not "
       "published for that long (stopped or hung: its rates are from before).",
       [](const RowContext& c) { return text(run_state_text(*c.run, c.now_unix_s)); }},
      {"heartbeat_age", "s", "Seconds since the run last published its record.",
       [](const RowContext& c) {
         return with_unit(
             c.run->update_unix_ns ? fixed(heartbeat_age_s(*c.run, c.now_unix_s), 1) : std::nullopt,
             "s");
       }},
      {"step", "", "Training steps completed.",
       [](const RowContext& c) { return text(std::to_string(c.run->step)); }},
      {"total_steps", "", "Steps the run will take; [N/A] when unknown.",
       [](const RowContext& c) {
         return FieldValue{
             c.run->total_steps ? Opt(std::to_string(c.run->total_steps)) : std::nullopt, {}};
       }},
      {"samples", "",
       "Training samples this process consumed (a resumed run counts from its resume).",
       [](const RowContext& c) { return text(std::to_string(c.run->samples)); }},
      {"steps_per_s", "steps/s", "Recent training steps per second.",
       [](const RowContext& c) {
         return with_unit(bounded(c.run->steps_per_s, kMaxRate, 2), "steps/s");
       }},
      {"samples_per_s", "samples/s", "Recent training samples per second.",
       [](const RowContext& c) {
         return with_unit(bounded(c.run->samples_per_s, kMaxRate, 1), "samples/s");
       }},
      {"loss", "", "Latest training loss; [N/A] before the first.",
       [](const RowContext& c) { return loss_value(c.run->loss); }},
      {"eta", "s", "Seconds to total_steps at the recent rate; [N/A] when unknown.",
       [](const RowContext& c) { return with_unit(bounded(c.run->eta_s, kMaxSeconds, 0), "s"); }},
      {"cuda_graph", "%",
       "Share of the training batches replayed from a CUDA graph (run.cuda_graph); [N/A] when "
       "graph mode is off.",
       [](const RowContext& c) {
         const auto& r = *c.run;
         return with_unit(r.graph_batches
                              ? percent(double(r.graph_replayed) / double(r.graph_batches))
                              : std::nullopt,
                          "%");
       }},
      {"data_wait", "%",
       "Share of the recent time the trainable section waited for its next batch (the data "
       "path is the bottleneck when high); [N/A] before the first step.",
       [](const RowContext& c) { return with_unit(percent(c.run->data_wait_frac_recent), "%"); }},
      {"host_rss", "MiB", "Resident host memory of the run's process.",
       [](const RowContext& c) {
         return with_unit(c.run->host_rss_bytes ? mib(c.run->host_rss_bytes) : std::nullopt, "MiB");
       }},
      {"device_memory", "MiB", "Device memory the run's pools hold; [N/A] on the CPU.",
       [](const RowContext& c) {
         return with_unit(
             c.run->device_reserved_bytes ? mib(c.run->device_reserved_bytes) : std::nullopt,
             "MiB");
       }},
      {"validation_loss", "", "Latest validation loss; [N/A] before the first validation.",
       [](const RowContext& c) { return loss_value(c.run->validation_loss); }},
      {"best_validation_loss", "",
       "Lowest validation loss of the run so far (a resume carries it on); [N/A] before the first.",
       [](const RowContext& c) { return loss_value(c.run->best_validation_loss); }},
      {"uptime", "s", "Seconds since the run started.",
       [](const RowContext& c) {
         double start = static_cast<double>(c.run->start_unix_ns) / 1e9;
         return with_unit(c.run->start_unix_ns && c.now_unix_s >= start
                              ? fixed(c.now_unix_s - start, 0)
                              : std::nullopt,
                          "s");
       }},
      {"run_dir", "", "Directory the run writes its outputs to.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.run->run_dir), {}};
       }},
  };
}

std::vector<FieldDef> stage_fields() {
  return {
      {"pid", "", "Process id of the run the stage belongs to.",
       [](const RowContext& c) { return text(std::to_string(c.run->pid)); }},
      {"run", "", "Name of the run the stage belongs to.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(c.run->run_name), {}};
       }},
      {"index", "", "Position of the stage in the run's graph, from 0.",
       [](const RowContext& c) { return text(std::to_string(c.stage)); }},
      {"name", "", "Stage name from the graph.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(stage_of(c).name), {}};
       }},
      {"kind", "", "Stage kind.",
       [](const RowContext& c) {
         return FieldValue{unless_empty(stage_of(c).kind), {}};
       }},
      {"concurrency", "", "Worker slots (1 = serial).",
       [](const RowContext& c) { return text(std::to_string(stage_of(c).concurrency)); }},
      {"items_in", "", "Items started since the run began.",
       [](const RowContext& c) { return text(std::to_string(stage_of(c).items_in)); }},
      {"items_out", "", "Items finished since the run began.",
       [](const RowContext& c) { return text(std::to_string(stage_of(c).items_out)); }},
      {"busy", "%", "Recent busy time / (wall time x worker slots).",
       [](const RowContext& c) { return with_unit(percent(stage_of(c).busy_frac_recent), "%"); }},
      {"items_per_s", "items/s", "Recent items finished per second.",
       [](const RowContext& c) {
         return with_unit(bounded(stage_of(c).items_per_s_recent, kMaxRate, 1), "items/s");
       }},
      {"latency_ms", "ms", "Recent mean time in the stage body per item.",
       [](const RowContext& c) {
         return with_unit(bounded(stage_of(c).mean_latency_ms_recent, kMaxSeconds * 1e3, 3), "ms");
       }},
      {"wait_input", "%", "Recent percent of worker time idle with nothing queued (starved).",
       [](const RowContext& c) {
         return with_unit(percent(stage_of(c).wait_input_frac_recent), "%");
       }},
      {"blocked_output", "%", "Recent percent of time finished work waited for downstream room.",
       [](const RowContext& c) {
         return with_unit(percent(stage_of(c).blocked_output_frac_recent), "%");
       }},
      {"queue_depth", "", "Items queued in front of the stage now.",
       [](const RowContext& c) { return text(std::to_string(stage_of(c).queue_depth)); }},
      {"queue_capacity", "", "Bound on that queue; 0 = unbounded.",
       [](const RowContext& c) { return text(std::to_string(stage_of(c).queue_capacity)); }},
      {"bottleneck", "", "Yes for the run's bottleneck stage (see docs/smi.md), else No.",
       [](const RowContext& c) { return text(c.stage == c.bottleneck ? "Yes" : "No"); }},
  };
}

}  // namespace

const char* group_name(QueryGroup group) {
  switch (group) {
    case QueryGroup::gpu:
      return "gpu";
    case QueryGroup::run:
      return "run";
    case QueryGroup::stage:
      return "stage";
  }
  return "?";
}

const std::vector<FieldDef>& query_fields(QueryGroup group) {
  static const std::vector<FieldDef> gpu = gpu_fields(), run = run_fields(), stage = stage_fields();
  switch (group) {
    case QueryGroup::gpu:
      return gpu;
    case QueryGroup::run:
      return run;
    case QueryGroup::stage:
      return stage;
  }
  return gpu;
}

std::vector<const FieldDef*> resolve_fields(QueryGroup group, std::string_view list) {
  const auto& all = query_fields(group);
  std::vector<const FieldDef*> out;
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view name = trim(list.substr(start, comma - start));
    start = comma + 1;
    if (name.empty()) continue;
    const FieldDef* match = nullptr;
    for (const auto& f : all) {
      if (f.name == name) match = &f;
    }
    if (!match) {
      std::string valid;
      for (const auto& f : all) valid += (valid.empty() ? "" : ", ") + f.name;
      throw UsageError("unknown field \"" + std::string(name) + "\" in --query-" +
                       group_name(group) + "; valid fields: " + valid + " (see --help-query)");
    }
    out.push_back(match);
  }
  if (out.empty())
    throw UsageError(std::string("--query-") + group_name(group) + " needs at least one field");
  return out;
}

CsvOptions parse_format(std::string_view format) {
  CsvOptions o;
  bool csv = false;
  size_t start = 0;
  while (start <= format.size()) {
    size_t comma = format.find(',', start);
    if (comma == std::string_view::npos) comma = format.size();
    std::string_view opt = format.substr(start, comma - start);
    start = comma + 1;
    if (opt == "csv")
      csv = true;
    else if (opt == "noheader")
      o.header = false;
    else if (opt == "nounits")
      o.units = false;
    else if (!opt.empty())
      throw UsageError("unknown --format option \"" + std::string(opt) +
                       "\"; valid: csv, noheader, nounits");
  }
  if (!csv) throw UsageError("--format must include csv, e.g. --format=csv,noheader,nounits");
  return o;
}

std::string render_query(QueryGroup group, const std::vector<const FieldDef*>& fields,
                         const Snapshot& snap, const CsvOptions& options) {
  std::string out;
  if (options.header) {
    std::vector<std::string> cells;
    for (const auto* f : fields) cells.push_back(header_cell(f->name, f->unit));
    out += csv_join(cells) + "\n";
  }
  auto emit = [&](const RowContext& ctx) {
    std::vector<std::string> cells;
    // printable: names come from records anyone of the user can plant.
    for (const auto* f : fields)
      cells.push_back(printable(render_value(f->value(ctx), options.units)));
    out += csv_join(cells) + "\n";
  };
  RowContext ctx;
  ctx.report = &snap.gpu;
  ctx.now_unix_s = std::chrono::duration<double>(snap.taken.time_since_epoch()).count();
  switch (group) {
    case QueryGroup::gpu:
      for (const auto& g : snap.gpu.gpus) {
        ctx.gpu = &g;
        emit(ctx);
      }
      break;
    case QueryGroup::run:
      for (const auto& r : snap.runs) {
        ctx.run = &r;
        emit(ctx);
      }
      break;
    case QueryGroup::stage:
      for (const auto& r : snap.runs) {
        ctx.run = &r;
        ctx.bottleneck = bottleneck_stage(r);
        for (uint32_t i = 0; i < r.num_stages; ++i) {
          ctx.stage = static_cast<int>(i);
          emit(ctx);
        }
      }
      break;
  }
  return out;
}

std::string help_query_text() {
  std::string out =
      "Fields for --query-gpu, --query-run and --query-stage (comma-separated), printed with\n"
      "--format=csv[,noheader][,nounits]. The csv header names each field with its unit in\n"
      "brackets; nounits drops the units from the values. Unavailable values print [N/A].\n";
  for (QueryGroup g : {QueryGroup::gpu, QueryGroup::run, QueryGroup::stage}) {
    out += std::string("\n--query-") + group_name(g) + "=\n";
    for (const auto& f : query_fields(g)) {
      std::string name = "  " + header_cell(f.name, f.unit);
      if (name.size() < 30) name.append(30 - name.size(), ' ');
      out += name + " " + f.description + "\n";
    }
  }
  return out;
}

}  // namespace slipstream::smi
