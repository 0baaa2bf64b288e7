// Shared by the emulated tests (the CUDA kernels run on the CPU emulator, every build) and the
// gpu tests (the same kernels on a real device): element conversion, error measures and the
// device-memory interface the checks in *_checks.h are written against.
//
// Memory backends provide: upload(vector<T>) -> T*, alloc<T>(n) -> T* filled with 0xFF bytes
// (NaN for float and bf16, so an element the kernel forgot to write fails the check),
// alloc_bytes(n), download(p, n) -> vector<T>, sync(), stream().
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cuda_api.h"

namespace slipstream::kernels::test {

template <class T>
T elem(double x) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16{fp32_to_bf16(float(x))};
  } else {
    return T(x);
  }
}
template <class T>
double value(T x) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return bf16_to_fp32(x.bits);
  } else {
    return double(x);
  }
}
template <class T>
std::vector<T> elems(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = elem<T>(v[i]);
  return out;
}
template <class T>
std::vector<double> values(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = value(v[i]);
  return out;
}
// v as T represents it: the inputs the reference must see.
template <class T>
std::vector<double> round_trip(const std::vector<double>& v) {
  return values(elems<T>(v));
}

// Relative tolerance of a comparison with a float64 reference: fp32 arithmetic, or bf16
// operands and results.
template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, bfloat16> ? 1e-2 : 1e-5;
}

// ||out - ref|| / max(||ref||, tiny); NaN anywhere in out gives +inf.
inline double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

#define EXPECT_CLOSE(out, ref, tol, what)                                                  \
  do {                                                                                     \
    const double e_ = ::slipstream::kernels::test::rel_error(out, ref);                    \
    EXPECT_LT(e_, tol) << (what) << ": relative error " << e_ << " over " << (ref).size(); \
  } while (0)

// Device pointers are host pointers: the emulator runs kernels on the CPU.
class EmulatedMemory {
 public:
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <class T>
  T* alloc(size_t n) {
    return static_cast<T*>(alloc_bytes(n * sizeof(T)));
  }
  void* alloc_bytes(size_t bytes) {
    blocks_.push_back(std::make_unique<unsigned char[]>(bytes + 1));
    std::memset(blocks_.back().get(), 0xff, bytes + 1);
    return blocks_.back().get();
  }
  template <class T>
  std::vector<T> download(const T* p, size_t n) {
    return std::vector<T>(p, p + n);
  }
  void sync() {}
  cudaStream_t stream() const { return nullptr; }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
};

}  // namespace slipstream::kernels::test
