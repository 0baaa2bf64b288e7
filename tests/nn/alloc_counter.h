// Counts calls of the global operator new in this test binary (alloc_counter.cpp replaces it).
#pragma once

#include <cstdint>

namespace slipstream::nn_test {
uint64_t allocations();
}
