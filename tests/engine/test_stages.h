// Stage kinds used only by the engine's tests (registered in the test binary).
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

namespace slipstream::testing {

// What the recorder saw, in order: the first element of `x` of each batch.
struct Recorded {
  std::mutex mu;
  std::vector<int32_t> values;
  std::vector<uint64_t> indices;
  std::atomic<int> finished{0};
  std::atomic<int> validation_passes{0};
  // test_bf16_reader, a batch each: 1 where the tensor's bf16 copy came and holds its rounding
  // bit for bit, 0 where none came, -1 where one came with other bits.
  std::vector<int> bf16_copies;
};
Recorded& recorded();
// Clears what the test stages recorded, between runs of one test.
void reset_recorded();

}  // namespace slipstream::testing
