// Where each parameter of a model lives in one flat buffer. Models keep all their weights (and,
// separately, all gradients and bf16 shadows) contiguous, so the templated model math addresses
// them by offset and the stage exposes each as a view (Parameter) of the flat tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::nn {

struct ParamSlot {
  std::string name;  // local to the stage, e.g. "layers.0.mixer.in_proj.weight"
  std::vector<int64_t> shape;
  size_t offset = 0;  // in elements of the flat buffer
  size_t numel = 0;
  bool weight_decay = true;
};

class ParamLayout {
 public:
  // Appends a parameter and returns its offset.
  size_t add(std::string name, std::vector<int64_t> shape, bool weight_decay) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    slots_.push_back({std::move(name), std::move(shape), total_, n, weight_decay});
    total_ += n;
    return slots_.back().offset;
  }
  const std::vector<ParamSlot>& slots() const { return slots_; }
  size_t total() const { return total_; }

 private:
  std::vector<ParamSlot> slots_;
  size_t total_ = 0;
};

// Deterministic uniform draws from a 64-bit seed (splitmix64), identical on every platform and
// standard library, so the same seed gives the same initial weights everywhere.
class InitRng {
 public:
  explicit InitRng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform01(); }

 private:
  uint64_t state_;
};

}  // namespace slipstream::nn
