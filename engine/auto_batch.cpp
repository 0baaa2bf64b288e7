#include "engine/auto_batch.h"

#include <cmath>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <streambuf>

#include "engine/launch.h"
#include "engine/memory_pool.h"
#include "engine/rank_reduce.h"
#include "engine/runner.h"

namespace slipstream {

namespace {

constexpr double kUse = 0.9;  // of the memory the run may use: room for fragmentation
constexpr int64_t kSmall = 8, kLarge = 32, kMultiple = 8;
constexpr int kRetries = 3;

std::string bytes_text(double bytes) {
  return format_bytes(static_cast<uint64_t>(std::max(0.0, bytes)));
}

// Two training steps of `base` at `batch` samples; the pool's peak meanwhile. Running out of
// memory is thrown as it is; another failure names the probe (`param`) and adds what the probe
// run said (its stages' lines among them: StageContext::log).
double probe_peak(const GraphPlan& base, size_t stage, const std::string& name, int64_t batch,
                  MemoryPool& pool, const std::string& param) {
  GraphPlan plan = base;
  plan.stages[stage].params.set(name, ParamValue(batch));
  plan.run.set("steps", ParamValue(int64_t{2}));
  plan.run.set("validate_every", ParamValue(int64_t{0}));
  std::ostringstream log;
  pool.reset_peak();
  RunOptions options = RunOptions::embedded(&log);
  options.single_process = true;  // in a multi-rank launch, each rank probes its own device
  try {
    Runner runner(std::move(plan), options);
    runner.run();
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string said = log.str();
    throw std::runtime_error(param + ": auto: the probe at " + std::to_string(batch) +
                             " samples failed: " + e.what() + (said.empty() ? "" : "\n" + said));
  }
  return static_cast<double>(pool.stats().peak_bytes);
}

}  // namespace

std::string AutoBatch::summary() const {
  return param + ": auto -> " + std::to_string(batch) +
         (ranks > 1 ? " (the smallest of " + std::to_string(ranks) + " ranks' choices)" : "") +
         " (peak " + bytes_text(peak_bytes) + " of " + bytes_text(budget_bytes) + " allowed; " +
         bytes_text(fixed_bytes) + " fixed + " + bytes_text(per_sample_bytes) + " a sample)";
}

std::vector<std::pair<size_t, const ParamSpec*>> batch_size_params(const GraphPlan& plan) {
  std::vector<std::pair<size_t, const ParamSpec*>> out;
  for (size_t k = 0; k < plan.stages.size(); ++k)
    for (const ParamSpec& p : plan.stages[k].schema->params())
      if (p.batch_size && plan.stages[k].params.has(p.name)) out.emplace_back(k, &p);
  return out;
}

std::optional<AutoBatch> resolve_auto_batch(GraphPlan& plan, const DeviceChoice& device,
                                            int world_size) {
  size_t stage = 0;
  const ParamSpec* spec = nullptr;
  for (const auto& [k, p] : batch_size_params(plan)) {
    if (plan.stages[k].params.integer(p->name) != kAutoBatchSize) continue;
    if (spec)
      throw std::runtime_error(plan.stages[stage].name + "." + spec->name + " and " +
                               plan.stages[k].name + "." + p->name +
                               " are both auto: give one of them a number");
    stage = k, spec = p;
  }
  if (!spec) return std::nullopt;
  AutoBatch out;
  out.param = plan.stages[stage].name + "." + spec->name;
  const std::string where = " (set by " + plan.stages[stage].params.mark(spec->name).str() + ")";
  if (device.device.is_cpu() && !device.emulate_cuda)
    throw std::runtime_error(out.param +
                             ": auto sizes a batch to a GPU's memory and this run is on the "
                             "CPU" +
                             where + ": give a number, e.g. --set " + out.param + "=64");
  RankReduceFn over_ranks;
  if (world_size > 1) {
    over_ranks = make_rank_reduce();
    if (!over_ranks)
      throw std::runtime_error(out.param + ": auto with " + std::to_string(world_size) +
                               " ranks needs MPI to agree on one size, and this build has none: "
                               "give a number" +
                               where);
  }
  const double device_gib = plan.run.number("device_memory");
  if (device_gib <= 0 && device.emulate_cuda)
    throw std::runtime_error(out.param +
                             ": auto on device emulated needs run.device_memory (GiB): an "
                             "emulated device has no memory of its own to measure" +
                             where);
  MemoryPool& pool = Pools::for_device(device.device);
  const double may_use =
      device_gib > 0 ? device_gib * double(1 << 30) : double(cuda_free_memory(device.device.index));
  out.budget_bytes = kUse * may_use;

  auto probe = [&](int64_t batch) {
    return probe_peak(plan, stage, spec->name, batch, pool, out.param);
  };
  // This rank's choice, checked by a probe at that size.
  auto choose = [&]() -> int64_t {
    double small = 0, large = 0;
    try {
      small = probe(kSmall);
      large = probe(kLarge);
    } catch (const OutOfMemoryError& e) {
      throw std::runtime_error(out.param +
                               ": auto: " + std::to_string(small > 0 ? kLarge : kSmall) +
                               " samples do not fit (" + e.what() + ")" + where);
    }
    out.per_sample_bytes = (large - small) / double(kLarge - kSmall);
    if (!(out.per_sample_bytes > 0))
      throw std::runtime_error(out.param + ": auto: the memory a sample takes could not be " +
                               "measured (peaks " + bytes_text(small) + " at " +
                               std::to_string(kSmall) + " samples, " + bytes_text(large) + " at " +
                               std::to_string(kLarge) + "): give a number" + where);
    out.fixed_bytes = std::max(0.0, small - double(kSmall) * out.per_sample_bytes);
    const auto max_batch = static_cast<int64_t>(spec->max.value_or(double(1 << 20)));
    int64_t batch = static_cast<int64_t>(
        std::floor((out.budget_bytes - out.fixed_bytes) / out.per_sample_bytes));
    batch = std::min(batch / kMultiple * kMultiple, max_batch);
    std::string tried;
    for (int attempt = 0;; ++attempt) {
      if (batch < kSmall)
        throw std::runtime_error(out.param + ": auto: not even " + std::to_string(kSmall) +
                                 " samples fit in " + bytes_text(out.budget_bytes) + " (" +
                                 bytes_text(out.fixed_bytes) + " fixed + " +
                                 bytes_text(out.per_sample_bytes) + " a sample" + tried +
                                 "): lower the model's sizes, or raise run.device_memory" + where);
      try {
        out.peak_bytes = probe(batch);
        if (out.peak_bytes <= out.budget_bytes) return batch;
        tried += "; " + std::to_string(batch) + " peaked at " + bytes_text(out.peak_bytes);
      } catch (const OutOfMemoryError&) {
        tried += "; " + std::to_string(batch) + " ran out of memory";
      }
      if (attempt + 1 == kRetries)
        throw std::runtime_error(out.param + ": auto: no batch checked out within " +
                                 bytes_text(out.budget_bytes) + tried + ": give a number" + where);
      batch = static_cast<int64_t>(std::floor(double(batch) * 0.85)) / kMultiple * kMultiple;
    }
  };
  if (!over_ranks) {
    out.batch = choose();
  } else {
    // Every rank takes the smallest rank's choice; a rank that could not choose offers 0, so
    // all stop together (each with its own words) rather than wait for it.
    std::string failure;
    double v = 0;
    try {
      v = static_cast<double>(choose());
    } catch (const std::exception& e) {
      failure = e.what();
    }
    over_ranks(std::span<double>(&v, 1), RankReduce::min, out.param + ": auto");
    if (v < double(kSmall))
      throw std::runtime_error(!failure.empty()
                                   ? failure
                                   : out.param +
                                         ": auto: another rank could not choose a size "
                                         "(its error says why)");
    out.ranks = world_size;
    out.batch = static_cast<int64_t>(v);
  }
  const int64_t batch = out.batch;
  plan.stages[stage].params.set(spec->name, ParamValue(batch),
                                plan.stages[stage].params.mark(spec->name));
  pool.release_cached();  // the run allocates its own, in the memory the probes measured
  return out;
}

void resolve_auto_batch(GraphPlan& plan, RunOptions& options) {
  bool any = false;
  for (const auto& [k, p] : batch_size_params(plan))
    any = any || plan.stages[k].params.integer(p->name) == kAutoBatchSize;
  if (!any) return;  // no device probe for a plan without auto
  const LaunchInfo launch = launch_info();
  const DeviceChoice dc = choose_device(plan.run.string("device"), launch.local_rank);
  if (auto chosen = resolve_auto_batch(plan, dc, options.single_process ? 1 : launch.world_size))
    options.notes.push_back(chosen->summary());
}

}  // namespace slipstream
