// Checks of the CUDA causal conv1d against the CPU reference (float64; the fused SiLU against
// silu_forward / silu_backward), run by the emulated and the gpu tests.
#pragma once

#include <random>
#include <vector>

#include "kernels/activations.h"
#include "kernels/causal_conv1d.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

namespace slipstream::kernels::test {

struct ConvShape {
  int B, L, C, K;
  bool silu = true, bias = true;
};

inline std::string describe(const ConvShape& s) {
  return "B" + std::to_string(s.B) + " L" + std::to_string(s.L) + " C" + std::to_string(s.C) +
         " K" + std::to_string(s.K) + (s.silu ? " silu" : "") + (s.bias ? " bias" : "");
}

template <class T>
struct ConvData {
  std::vector<double> x, w, bias, dy;
  ConvData(const ConvShape& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const size_t n = size_t(s.B) * s.L * s.C;
    x = round_trip<T>(rand_vec(n, rng));
    w = round_trip<float>(rand_vec(size_t(s.C) * s.K, rng));
    if (s.bias) bias = round_trip<float>(rand_vec(size_t(s.C), rng));
    dy = round_trip<T>(rand_vec(n, rng));
  }
  const double* b() const { return bias.empty() ? nullptr : bias.data(); }
};

template <class Kernels, class Mem, class T>
void check_conv_forward(const ConvShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ConvData<T> d(s, seed);
  const size_t n = size_t(s.B) * s.L * s.C;
  std::vector<double> ref(n);
  causal_conv1d_forward<double>(d.x.data(), d.w.data(), d.b(), ref.data(), s.B, s.L, s.C, s.K);
  if (s.silu) silu_forward(ref.data(), ref.data(), n);
  Mem mem;
  T* y = mem.template alloc<T>(n);
  Kernels::template causal_conv1d_forward<T>(
      mem.upload(elems<T>(d.x)), mem.upload(elems<float>(d.w)),
      d.bias.empty() ? nullptr : mem.upload(elems<float>(d.bias)), y, s.B, s.L, s.C, s.K, s.silu,
      mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(y, n)), ref, tolerance<T>(), "y");
}

template <class Kernels, class Mem, class T>
void check_conv_backward(const ConvShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ConvData<T> d(s, seed);
  const size_t n = size_t(s.B) * s.L * s.C, ck = size_t(s.C) * s.K;
  std::mt19937_64 rng(seed ^ 0xc0);
  const std::vector<double> dw0 = round_trip<float>(rand_vec(ck, rng));
  const std::vector<double> db0 = round_trip<float>(rand_vec(size_t(s.C), rng));
  std::vector<double> dpre = d.dy, dx(n), dw = dw0, db = db0;
  if (s.silu) {
    std::vector<double> pre(n);
    causal_conv1d_forward<double>(d.x.data(), d.w.data(), d.b(), pre.data(), s.B, s.L, s.C, s.K);
    silu_backward(pre.data(), d.dy.data(), dpre.data(), n);
  }
  causal_conv1d_backward<double>(d.x.data(), d.w.data(), dpre.data(), dx.data(), dw.data(),
                                 s.bias ? db.data() : nullptr, s.B, s.L, s.C, s.K);
  Mem mem;
  T* g_dx = mem.template alloc<T>(n);
  float* g_dw = mem.upload(elems<float>(dw0));
  float* g_db = mem.upload(elems<float>(db0));
  void* ws =
      mem.alloc_bytes(Kernels::causal_conv1d_backward_workspace_bytes(s.B, s.L, s.C, s.K, s.silu));
  Kernels::template causal_conv1d_backward<T>(
      mem.upload(elems<T>(d.x)), mem.upload(elems<float>(d.w)),
      d.bias.empty() ? nullptr : mem.upload(elems<float>(d.bias)), mem.upload(elems<T>(d.dy)), g_dx,
      g_dw, s.bias ? g_db : nullptr, ws, s.B, s.L, s.C, s.K, s.silu, mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(g_dx, n)), dx, tolerance<T>(), "dx");
  EXPECT_CLOSE(values(mem.download(g_dw, ck)), dw, 1e-5, "dweight (+=)");
  EXPECT_CLOSE(values(mem.download(g_db, size_t(s.C))), db, 1e-5, "dbias (+=)");
}

template <class Kernels, class Mem, class T>
void check_conv_step(const ConvShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ConvData<T> d(s, seed);
  const size_t n = size_t(s.B) * s.L * s.C, bc = size_t(s.B) * s.C;
  std::vector<double> ref(n);
  causal_conv1d_forward<double>(d.x.data(), d.w.data(), d.b(), ref.data(), s.B, s.L, s.C, s.K);
  if (s.silu) silu_forward(ref.data(), ref.data(), n);
  Mem mem;
  T* state = mem.upload(elems<T>(std::vector<double>(size_t(s.B) * (s.K - 1) * s.C + 1, 0.0)));
  const float* w = mem.upload(elems<float>(d.w));
  const float* bias = d.bias.empty() ? nullptr : mem.upload(elems<float>(d.bias));
  std::vector<double> got(n);
  for (int t = 0; t < s.L; ++t) {
    std::vector<double> xt;
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < s.C; ++c) xt.push_back(d.x[(size_t(b) * s.L + t) * s.C + c]);
    T* y = mem.template alloc<T>(bc);
    Kernels::template causal_conv1d_step<T>(state, mem.upload(elems<T>(xt)), w, bias, y, s.B, s.C,
                                            s.K, s.silu, mem.stream());
    mem.sync();
    const std::vector<double> yt = values(mem.download(y, bc));
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < s.C; ++c) got[(size_t(b) * s.L + t) * s.C + c] = yt[size_t(b) * s.C + c];
  }
  EXPECT_CLOSE(got, ref, tolerance<T>(), "step outputs vs forward");
}

inline std::vector<ConvShape> conv_shapes() {
  return {
      {2, 37, 40, 4},                // the Mamba shape, odd sizes
      {1, 130, 33, 4, false, true},  // several time blocks; no SiLU
      {3, 3, 300, 5, true, false},   // L < K, > 256 channels, no bias
      {2, 9, 17, 1},                 // width 1
      {2, 21, 19, 3},                // width 3 (a sliding-window kernel), L past a time block
      {1, 5, 7, 2},                  // width 2
  };
}

}  // namespace slipstream::kernels::test
