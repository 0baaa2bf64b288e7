// Shared by the emulated tests (the CUDA kernels run on the CPU emulator, every build) and the
// gpu tests (the same kernels on a real device): element conversion, error measures and the
// device-memory interface the checks in *_checks.h are written against.
//
// Memory backends provide: upload(vector<T>) -> T*, alloc<T>(n) -> T* filled with 0xFF bytes
// (NaN for float and bf16, so an element the kernel forgot to write fails the check),
// alloc_bytes(n), download(p, n) -> vector<T>, sync(), stream().
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

// Rows of `cols` values (rows, cols) spread into rows `ld` apart with NaN between them: an input
// of a kernel that reads columns of a wider tensor (a read past a row's columns poisons the
// results).
inline std::vector<double> nan_between_rows(const std::vector<double>& v, size_t rows, size_t cols,
                                            size_t ld) {
  std::vector<double> wide(rows * ld, std::nan(""));
  for (size_t r = 0; r < rows; ++r) std::copy_n(v.data() + r * cols, cols, wide.data() + r * ld);
  return wide;
}

// Rows of `cols` out of rows `ld` apart on the device (0: packed), checking that nothing was
// written between them (alloc's 0xFF bytes stay): an output a kernel writes into columns of a
// wider tensor.
template <class Mem, class E>
std::vector<E> packed_rows(Mem& mem, const E* p, size_t rows, size_t cols, int ld) {
  const size_t step = ld ? size_t(ld) : cols;
  const std::vector<E> all = mem.download(p, rows * step);
  if (!ld) return all;
  std::vector<E> out;
  for (size_t r = 0; r < rows; ++r) {
    const E* row = all.data() + r * step;
    out.insert(out.end(), row, row + cols);
    for (size_t c = cols; c < step; ++c) {
      uint8_t bytes[sizeof(E)];
      std::memcpy(bytes, &row[c], sizeof(E));
      for (uint8_t b : bytes) EXPECT_EQ(b, 0xFF) << "row " << r << " column " << c << " written";
    }
  }
  return out;
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
