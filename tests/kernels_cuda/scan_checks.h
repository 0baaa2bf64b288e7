// Checks of the CUDA selective scan against the CPU reference (float64 instance), run by the
// emulated tests and the gpu tests. `Kernels` names the entry points (namespace cuda or
// cuda_emulated), `Mem` the memory backend (device_checks.h).
#pragma once

#include <random>
#include <vector>

#include "kernels/selective_scan.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

namespace slipstream::kernels::test {

struct ScanShape {
  int B, L, D, N;
  bool z = true, dskip = true, bias = true, softplus = true;
};

inline std::string describe(const ScanShape& s) {
  return "B" + std::to_string(s.B) + " L" + std::to_string(s.L) + " D" + std::to_string(s.D) +
         " N" + std::to_string(s.N) + (s.z ? " z" : "") + (s.dskip ? " D" : "") +
         (s.bias ? " bias" : "") + (s.softplus ? " softplus" : "");
}

// Inputs as float64, already rounded to what T (for the T-typed tensors) and fp32 (for A,
// Dskip, delta_bias) represent, so the reference sees exactly what the device sees.
template <class T>
struct ScanData {
  std::vector<double> u, delta, A, Bm, Cm, Dskip, z, bias, dout;
  ScanData(const ScanShape& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const size_t bld = size_t(s.B) * s.L * s.D, bln = size_t(s.B) * s.L * s.N;
    u = round_trip<T>(rand_vec(bld, rng));
    delta =
        round_trip<T>(s.softplus ? rand_vec(bld, rng, 0.1, 1.0) : rand_pos(bld, rng, 0.05, 0.5));
    A = round_trip<float>(rand_pos(size_t(s.D) * s.N, rng, 0.3, 2.0));
    for (double& a : A) a = -a;
    Bm = round_trip<T>(rand_vec(bln, rng));
    Cm = round_trip<T>(rand_vec(bln, rng));
    if (s.dskip) Dskip = round_trip<float>(rand_vec(size_t(s.D), rng));
    if (s.z) z = round_trip<T>(rand_vec(bld, rng, 0.1, 2.0));
    if (s.bias) bias = round_trip<float>(rand_vec(size_t(s.D), rng, 0.1, 0.5));
    dout = round_trip<T>(rand_vec(bld, rng));
  }
};

inline const double* ptr(const std::vector<double>& v) {
  return v.empty() ? nullptr : v.data();
}

template <class Mem, class U>
const U* up(Mem& mem, const std::vector<double>& v) {
  return v.empty() ? nullptr : mem.upload(elems<U>(v));
}

// The float64 CPU forward: out and the last state.
template <class T>
void scan_reference(const ScanShape& s, const ScanData<T>& d, std::vector<double>& out,
                    std::vector<double>& last) {
  selective_scan_forward<double>(d.u.data(), d.delta.data(), d.A.data(), d.Bm.data(), d.Cm.data(),
                                 ptr(d.Dskip), ptr(d.z), ptr(d.bias), s.softplus, out.data(),
                                 last.data(), s.B, s.L, s.D, s.N);
}

template <class Kernels, class Mem, class T>
void check_scan_forward(const ScanShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ScanData<T> d(s, seed);
  const size_t bld = size_t(s.B) * s.L * s.D, bdn = size_t(s.B) * s.D * s.N;
  std::vector<double> ref(bld), ref_last(bdn);
  scan_reference(s, d, ref, ref_last);
  Mem mem;
  T* out = mem.template alloc<T>(bld);
  float* last = mem.template alloc<float>(bdn);
  Kernels::template selective_scan_forward<T>(
      up<Mem, T>(mem, d.u), up<Mem, T>(mem, d.delta), up<Mem, float>(mem, d.A),
      up<Mem, T>(mem, d.Bm), up<Mem, T>(mem, d.Cm), up<Mem, float>(mem, d.Dskip),
      up<Mem, T>(mem, d.z), up<Mem, float>(mem, d.bias), s.softplus, out, last, s.B, s.L, s.D, s.N,
      mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(out, bld)), ref, tolerance<T>(), "out");
  EXPECT_CLOSE(values(mem.download(last, bdn)), ref_last, 1e-5, "last_state");
}

template <class Kernels, class Mem, class T>
void check_scan_backward(const ScanShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ScanData<T> d(s, seed);
  const size_t bld = size_t(s.B) * s.L * s.D, bln = size_t(s.B) * s.L * s.N;
  const size_t dn = size_t(s.D) * s.N;
  std::mt19937_64 rng(seed ^ 0x5ca9);
  // Accumulated gradients start from non-zero values: the kernel must add, not overwrite.
  const std::vector<double> dA0 = round_trip<float>(rand_vec(dn, rng));
  const std::vector<double> dD0 = round_trip<float>(rand_vec(size_t(s.D), rng));
  const std::vector<double> db0 = round_trip<float>(rand_vec(size_t(s.D), rng));
  std::vector<double> du(bld), ddelta(bld), dz(bld), dB(bln), dC(bln), dA = dA0, dD = dD0, db = db0;
  std::vector<double> ws(selective_scan_backward_workspace_elems(s.B, s.L, s.D, s.N));
  selective_scan_backward<double>(d.u.data(), d.delta.data(), d.A.data(), d.Bm.data(), d.Cm.data(),
                                  ptr(d.Dskip), ptr(d.z), ptr(d.bias), s.softplus, d.dout.data(),
                                  du.data(), ddelta.data(), dA.data(), dB.data(), dC.data(),
                                  s.dskip ? dD.data() : nullptr, s.z ? dz.data() : nullptr,
                                  s.bias ? db.data() : nullptr, ws.data(), s.B, s.L, s.D, s.N);
  Mem mem;
  T *g_du = mem.template alloc<T>(bld), *g_ddelta = mem.template alloc<T>(bld);
  T *g_dB = mem.template alloc<T>(bln), *g_dC = mem.template alloc<T>(bln);
  T* g_dz = s.z ? mem.template alloc<T>(bld) : nullptr;
  float* g_dA = mem.upload(elems<float>(dA0));
  float* g_dD = mem.upload(elems<float>(dD0));
  float* g_db = mem.upload(elems<float>(db0));
  void* w = mem.alloc_bytes(Kernels::selective_scan_backward_workspace_bytes(s.B, s.L, s.D, s.N));
  Kernels::template selective_scan_backward<T>(
      up<Mem, T>(mem, d.u), up<Mem, T>(mem, d.delta), up<Mem, float>(mem, d.A),
      up<Mem, T>(mem, d.Bm), up<Mem, T>(mem, d.Cm), up<Mem, float>(mem, d.Dskip),
      up<Mem, T>(mem, d.z), up<Mem, float>(mem, d.bias), s.softplus, up<Mem, T>(mem, d.dout), g_du,
      g_ddelta, g_dA, g_dB, g_dC, s.dskip ? g_dD : nullptr, g_dz, s.bias ? g_db : nullptr, w, s.B,
      s.L, s.D, s.N, mem.stream());
  mem.sync();
  const double tol = tolerance<T>();
  EXPECT_CLOSE(values(mem.download(g_du, bld)), du, tol, "du");
  EXPECT_CLOSE(values(mem.download(g_ddelta, bld)), ddelta, tol, "ddelta");
  EXPECT_CLOSE(values(mem.download(g_dB, bln)), dB, tol, "dBm");
  EXPECT_CLOSE(values(mem.download(g_dC, bln)), dC, tol, "dCm");
  if (s.z) EXPECT_CLOSE(values(mem.download(g_dz, bld)), dz, tol, "dz");
  // fp32 outputs from the same (rounded) inputs: fp32 accuracy whatever T is.
  EXPECT_CLOSE(values(mem.download(g_dA, dn)), dA, 1e-5, "dA (+=)");
  EXPECT_CLOSE(values(mem.download(g_dD, size_t(s.D))), dD, 1e-5, "dDskip (+=)");
  EXPECT_CLOSE(values(mem.download(g_db, size_t(s.D))), db, 1e-5, "ddelta_bias (+=)");
}

// The stateful single step, frame after frame, equals the parallel forward on the same frames.
template <class Kernels, class Mem, class T>
void check_scan_step(const ScanShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ScanData<T> d(s, seed);
  const size_t bld = size_t(s.B) * s.L * s.D, bdn = size_t(s.B) * s.D * s.N;
  std::vector<double> ref(bld), ref_last(bdn);
  scan_reference(s, d, ref, ref_last);
  auto frame = [&](const std::vector<double>& v, int t, int C) {
    std::vector<double> f;
    if (v.empty()) return f;
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < C; ++c) f.push_back(v[(size_t(b) * s.L + t) * C + c]);
    return f;
  };
  Mem mem;
  float* state = mem.upload(std::vector<float>(bdn, 0.0f));
  const float* A = up<Mem, float>(mem, d.A);
  const float* Dskip = up<Mem, float>(mem, d.Dskip);
  const float* bias = up<Mem, float>(mem, d.bias);
  std::vector<double> got(bld);
  for (int t = 0; t < s.L; ++t) {
    T* out = mem.template alloc<T>(size_t(s.B) * s.D);
    Kernels::template selective_scan_step<T>(
        state, up<Mem, T>(mem, frame(d.u, t, s.D)), up<Mem, T>(mem, frame(d.delta, t, s.D)), A,
        up<Mem, T>(mem, frame(d.Bm, t, s.N)), up<Mem, T>(mem, frame(d.Cm, t, s.N)), Dskip,
        up<Mem, T>(mem, frame(d.z, t, s.D)), bias, s.softplus, out, s.B, s.D, s.N, mem.stream());
    mem.sync();
    const std::vector<double> o = values(mem.download(out, size_t(s.B) * s.D));
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < s.D; ++c) got[(size_t(b) * s.L + t) * s.D + c] = o[size_t(b) * s.D + c];
  }
  EXPECT_CLOSE(got, ref, tolerance<T>(), "step outputs vs parallel forward");
  EXPECT_CLOSE(values(mem.download(state, bdn)), ref_last, 1e-5, "state after L steps");
}

inline std::vector<ScanShape> scan_shapes() {
  return {
      {2, 37, 40, 16},                          // window not a multiple of the chunk, odd D
      {1, 16, 16, 16, false, false, false},     // whole chunks; no z, D, bias
      {3, 5, 33, 5, true, true, false, false},  // N not a power of two; L below one chunk
      {1, 33, 9, 32},                           // production d_state: two threads a channel
      {2, 18, 70, 1, true, false, true, true},  // N = 1
      {2, 9, 150, 16},                          // two blocks of channels
      {1, 7, 70, 32, true, true, true, false},  // two blocks of channels, two threads each
  };
}

}  // namespace slipstream::kernels::test
