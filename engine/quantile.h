// The q-quantile of a sample (nearest rank on a sorted copy): latency percentiles for
// `slipstream bench`, `slipstream infer` and the inference benchmarks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace slipstream {

// 0 for an empty sample; q in [0, 1] (0.5: the median, 0.99: p99).
inline double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

}  // namespace slipstream
