// A high-water mark shared by threads: raise `peak` to `value` unless it is already higher.
#pragma once

#include <atomic>

namespace slipstream {

template <class T>
void raise_to(std::atomic<T>& peak, T value, std::memory_order order = std::memory_order_relaxed) {
  T seen = peak.load(order);
  while (value > seen && !peak.compare_exchange_weak(seen, value, order)) {
  }
}

}  // namespace slipstream
