// Deterministic parallel sum: fixed blocks, fixed combination order, so results do not depend
// on the number of threads or on scheduling.
#pragma once

#include <cstddef>

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

namespace slipstream::kernels {

// Sum of body(begin, end) -> V over [0, n), in blocks of `grain`. V needs + and V{}.
template <class V, class F>
V deterministic_sum(size_t n, size_t grain, F&& body) {
  if (n <= grain) return n ? body(size_t{0}, n) : V{};
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<size_t>(0, n, grain), V{},
      [&](const tbb::blocked_range<size_t>& r, V acc) { return acc + body(r.begin(), r.end()); },
      [](V a, const V& b) { return a + b; }, tbb::simple_partitioner());
}

}  // namespace slipstream::kernels
