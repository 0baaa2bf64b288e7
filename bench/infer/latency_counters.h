// Per-iteration latency quantiles as Google Benchmark counters (p50_us, p99_us).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

inline void report_latency(benchmark::State& state, std::vector<double>& us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  auto q = [&](double p) {
    return us[std::min(us.size() - 1, static_cast<size_t>(p * static_cast<double>(us.size())))];
  };
  state.counters["p50_us"] = q(0.50);
  state.counters["p99_us"] = q(0.99);
}
