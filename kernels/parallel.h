// Small TBB helpers shared by the CPU kernels: run a body over [0, n) in blocks, inline when
// the work is too small to be worth a task.
#pragma once

#include <cstddef>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace slipstream::kernels {

// Below this many scalar operations a kernel runs on the calling thread.
inline constexpr size_t kParallelMinWork = 1 << 15;

// body(begin, end) over [0, n); `work_per_item` estimates scalar ops per item so that small
// problems stay serial (TBB task overhead is a few microseconds).
template <class F>
void parallel_blocks(size_t n, size_t work_per_item, F&& body) {
  if (n == 0) return;
  if (n == 1 || n * work_per_item < kParallelMinWork) {
    body(size_t{0}, n);
    return;
  }
  size_t grain = kParallelMinWork / (work_per_item ? work_per_item : 1);
  if (grain < 1) grain = 1;
  tbb::parallel_for(tbb::blocked_range<size_t>(0, n, grain),
                    [&](const tbb::blocked_range<size_t>& r) { body(r.begin(), r.end()); });
}

}  // namespace slipstream::kernels
