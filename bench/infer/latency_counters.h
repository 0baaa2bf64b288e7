// Per-iteration latency quantiles as Google Benchmark counters (p50_us, p99_us).
#pragma once

#include <benchmark/benchmark.h>

#include <vector>

#include "engine/quantile.h"

inline void report_latency(benchmark::State& state, std::vector<double>& us) {
  if (us.empty()) return;
  state.counters["p50_us"] = slipstream::quantile(us, 0.50);
  state.counters["p99_us"] = slipstream::quantile(us, 0.99);
}
