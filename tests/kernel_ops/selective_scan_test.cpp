// The selective scan (kernels/selective_scan.h): the reference against a loop-by-loop form,
// float64 finite differences, parallel against serial and the recurrent step; the CUDA kernels
// against the reference on the emulator and on a device (tests/kernel_ops/kernel_test.h), fp32
// and bf16, both backward variants, and bit-identical reruns on hardware.

#include <tbb/global_control.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/selective_scan.h"
#include "tests/kernel_ops/kernel_test.h"

// ---- The CPU reference ----

#if SLIPSTREAM_REFERENCE_TESTS
namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

// Inputs of one scan problem, in double.
struct Scan {
  int B, L, D, N;
  bool use_z, use_D, use_bias, softplus;
  std::vector<double> u, delta, A, Bm, Cm, Dskip, z, bias;
  std::vector<double> h0;  // (B, D, N) initial state; empty: zero

  Scan(int B_, int L_, int D_, int N_, bool z_, bool d_, bool bias_, bool sp, uint64_t seed)
      : B(B_), L(L_), D(D_), N(N_), use_z(z_), use_D(d_), use_bias(bias_), softplus(sp) {
    std::mt19937_64 rng(seed);
    const size_t bld = size_t(B) * L * D, bln = size_t(B) * L * N;
    u = rand_vec(bld, rng);
    // With softplus any sign works; without it dt must be positive.
    delta = sp ? rand_vec(bld, rng) : test::rand_pos(bld, rng, 0.05, 0.8);
    A = test::rand_pos(size_t(D) * N, rng, 0.1, 1.0);
    for (auto& a : A) a = -a;  // stable decay, as mamba's A = -exp(A_log)
    Bm = rand_vec(bln, rng);
    Cm = rand_vec(bln, rng);
    Dskip = rand_vec(D, rng);
    z = rand_vec(bld, rng);
    bias = sp ? rand_vec(D, rng) : test::rand_pos(D, rng, 0.01, 0.2);
  }
  template <class T>
  void forward(const std::vector<T>& u_, const std::vector<T>& delta_, const std::vector<T>& A_,
               const std::vector<T>& Bm_, const std::vector<T>& Cm_, const std::vector<T>& D_,
               const std::vector<T>& z_, const std::vector<T>& bias_, std::vector<T>& out,
               T* last = nullptr) const {
    out.assign(size_t(B) * L * D, T(0));
    const std::vector<T> h0t = cast<T>(h0);
    selective_scan_forward<T>(u_.data(), delta_.data(), A_.data(), Bm_.data(), Cm_.data(),
                              use_D ? D_.data() : nullptr, use_z ? z_.data() : nullptr,
                              use_bias ? bias_.data() : nullptr, softplus,
                              h0.empty() ? nullptr : h0t.data(), out.data(), last, B, L, D, N);
  }
  // Steps [t0, t1) of every row as a problem of its own (no initial state).
  Scan steps(int t0, int t1) const {
    Scan p = *this;
    p.L = t1 - t0;
    p.h0.clear();
    auto cut = [&](const std::vector<double>& v, std::vector<double>& out, int C) {
      out.clear();
      for (int b = 0; b < B; ++b)
        out.insert(out.end(), v.begin() + (size_t(b) * L + t0) * C,
                   v.begin() + (size_t(b) * L + t1) * C);
    };
    cut(u, p.u, D), cut(delta, p.delta, D), cut(z, p.z, D), cut(Bm, p.Bm, N), cut(Cm, p.Cm, N);
    return p;
  }
  std::vector<double> forward() const {
    std::vector<double> out;
    forward(u, delta, A, Bm, Cm, Dskip, z, bias, out);
    return out;
  }
};

// selective_scan_ref transcribed loop by loop, layout (B, L, D), in double.
std::vector<double> reference(const Scan& s, std::vector<double>* last = nullptr) {
  const int B = s.B, L = s.L, D = s.D, N = s.N;
  std::vector<double> out(size_t(B) * L * D);
  if (last) last->assign(size_t(B) * D * N, 0.0);
  for (int b = 0; b < B; ++b)
    for (int d = 0; d < D; ++d) {
      std::vector<double> x(N, 0.0);
      for (int t = 0; t < L; ++t) {
        const size_t i = (size_t(b) * L + t) * D + d;
        double dt = s.delta[i] + (s.use_bias ? s.bias[d] : 0.0);
        if (s.softplus) dt = dt > 20.0 ? dt : std::log1p(std::exp(dt));
        double y = 0;
        for (int n = 0; n < N; ++n) {
          const double dA = std::exp(dt * s.A[d * N + n]);
          const double dBu = dt * s.Bm[(size_t(b) * L + t) * N + n] * s.u[i];
          x[n] = dA * x[n] + dBu;
          y += x[n] * s.Cm[(size_t(b) * L + t) * N + n];
        }
        if (s.use_D) y += s.u[i] * s.Dskip[d];
        if (s.use_z) y *= s.z[i] / (1.0 + std::exp(-s.z[i]));
        out[i] = y;
      }
      if (last)
        for (int n = 0; n < N; ++n) (*last)[(size_t(b) * D + d) * N + n] = x[n];
    }
  return out;
}

struct Grads {
  std::vector<double> du, ddelta, dA, dBm, dCm, dD, dz, dbias;
};

template <class T>
Grads backward(const Scan& s, const std::vector<double>& dout_d, int times = 1) {
  const size_t bld = size_t(s.B) * s.L * s.D, bln = size_t(s.B) * s.L * s.N;
  auto u = cast<T>(s.u), delta = cast<T>(s.delta), A = cast<T>(s.A), Bm = cast<T>(s.Bm),
       Cm = cast<T>(s.Cm), Dk = cast<T>(s.Dskip), z = cast<T>(s.z), bias = cast<T>(s.bias),
       dout = cast<T>(dout_d);
  std::vector<T> du(bld, T(9)), ddelta(bld, T(9)), dA(A.size(), T(0)), dBm(bln, T(9)),
      dCm(bln, T(9)), dD(s.D, T(0)), dz(bld, T(9)), dbias(s.D, T(0));
  std::vector<T> ws(selective_scan_backward_workspace_elems(s.B, s.L, s.D, s.N), T(-7));
  const std::vector<T> h0 = cast<T>(s.h0);
  for (int k = 0; k < times; ++k)
    selective_scan_backward<T>(
        u.data(), delta.data(), A.data(), Bm.data(), Cm.data(), s.use_D ? Dk.data() : nullptr,
        s.use_z ? z.data() : nullptr, s.use_bias ? bias.data() : nullptr, s.softplus,
        h0.empty() ? nullptr : h0.data(), dout.data(), du.data(), ddelta.data(), dA.data(),
        dBm.data(), dCm.data(), s.use_D ? dD.data() : nullptr, s.use_z ? dz.data() : nullptr,
        s.use_bias ? dbias.data() : nullptr, ws.data(), s.B, s.L, s.D, s.N);
  auto d = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
  return {d(du), d(ddelta), d(dA), d(dBm), d(dCm), d(dD), d(dz), d(dbias)};
}

void gradcheck(Scan& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto w = rand_vec(size_t(s.B) * s.L * s.D, rng);
  auto loss = [&] { return test::dot(w, s.forward()); };
  const Grads g = backward<double>(s, w);
  test::check_gradient("u", loss, s.u, g.du);
  test::check_gradient("delta", loss, s.delta, g.ddelta);
  test::check_gradient("A", loss, s.A, g.dA);
  test::check_gradient("B", loss, s.Bm, g.dBm);
  test::check_gradient("C", loss, s.Cm, g.dCm);
  if (s.use_D) test::check_gradient("D", loss, s.Dskip, g.dD);
  if (s.use_z) test::check_gradient("z", loss, s.z, g.dz);
  if (s.use_bias) test::check_gradient("delta_bias", loss, s.bias, g.dbias);
  // Accumulation: a second call overwrites input grads and doubles dA, dD, ddelta_bias.
  const Grads g2 = backward<double>(s, w, 2);
  EXPECT_EQ(g2.du, g.du);
  EXPECT_EQ(g2.dBm, g.dBm);
  EXPECT_EQ(g2.ddelta, g.ddelta);
  EXPECT_DOUBLED(g2.dA, g.dA);
  EXPECT_DOUBLED(g2.dD, g.dD);
  EXPECT_DOUBLED(g2.dbias, g.dbias);
  // Float path (AVX-512 where available) against double.
  const Grads gf = backward<float>(s, w);
  EXPECT_LT(test::rel_diff(g.du, gf.du), 1e-5);
  EXPECT_LT(test::rel_diff(g.ddelta, gf.ddelta), 1e-5);
  EXPECT_LT(test::rel_diff(g.dA, gf.dA), 1e-5);
  EXPECT_LT(test::rel_diff(g.dBm, gf.dBm), 1e-5);
  EXPECT_LT(test::rel_diff(g.dCm, gf.dCm), 1e-5);
  if (s.use_D) {
    EXPECT_LT(test::rel_diff(g.dD, gf.dD), 1e-5);
  }
  if (s.use_z) {
    EXPECT_LT(test::rel_diff(g.dz, gf.dz), 1e-5);
  }
  if (s.use_bias) {
    EXPECT_LT(test::rel_diff(g.dbias, gf.dbias), 1e-5);
  }
}

CPU_TEST(SelectiveScan, ForwardMatchesReference) {
  for (int variant = 0; variant < 2; ++variant) {
    // D = 37 leaves a partial channel block; N = 16 and 5 (a masked vector tail).
    for (int N : {16, 5}) {
      Scan s(3, 70, 37, N, variant == 0, variant == 0, variant == 0, variant == 0, 1 + N);
      std::vector<double> last_ref, last(size_t(s.B) * s.D * s.N);
      const auto ref = reference(s, &last_ref);
      std::vector<double> out;
      s.forward(s.u, s.delta, s.A, s.Bm, s.Cm, s.Dskip, s.z, s.bias, out, last.data());
      EXPECT_LT(test::rel_diff(ref, out), 1e-13) << variant << " " << N;
      EXPECT_LT(test::rel_diff(last_ref, last), 1e-13);
      std::vector<float> outf;
      s.forward(cast<float>(s.u), cast<float>(s.delta), cast<float>(s.A), cast<float>(s.Bm),
                cast<float>(s.Cm), cast<float>(s.Dskip), cast<float>(s.z), cast<float>(s.bias),
                outf);
      EXPECT_LT(test::rel_diff(ref, outf), 1e-5) << variant << " " << N;
    }
  }
}

CPU_TEST(SelectiveScan, GradCheckFull) {
  // z, D, delta_bias, softplus; d_state 16, L 64.
  Scan s(2, 64, 3, 16, true, true, true, true, 11);
  gradcheck(s, 12);
}

CPU_TEST(SelectiveScan, GradCheckPlain) {
  // no z, no D, no bias, no softplus; two channel blocks (D = 18), N not a multiple of 16.
  Scan s(1, 64, 18, 12, false, false, false, false, 21);
  gradcheck(s, 22);
}

// From a carried state: the gradients are still the forward's (the state is a constant), and
// the backward's recomputation starts from it (a zero start would shift dA and ddelta).
CPU_TEST(SelectiveScan, GradCheckFromInitialState) {
  Scan s(2, 40, 3, 16, true, true, true, true, 13);
  std::mt19937_64 rng(14);
  s.h0 = rand_vec(size_t(s.B) * s.D * s.N, rng);
  gradcheck(s, 15);
}

// A window that starts from the state the window before it left continues the sequence: the
// two halves' outputs and the second's last state are the whole sequence's.
CPU_TEST(SelectiveScan, InitialStateContinuesTheSequence) {
  for (int N : {16, 5}) {
    const Scan s(3, 50, 37, N, true, true, true, true, 17 + N);
    std::vector<double> out, last(size_t(s.B) * s.D * N), last1(last.size()), last2(last.size());
    s.forward(s.u, s.delta, s.A, s.Bm, s.Cm, s.Dskip, s.z, s.bias, out, last.data());
    Scan first = s.steps(0, 21), second = s.steps(21, 50);
    std::vector<double> out1, out2;
    first.forward(first.u, first.delta, first.A, first.Bm, first.Cm, first.Dskip, first.z,
                  first.bias, out1, last1.data());
    second.h0 = last1;
    second.forward(second.u, second.delta, second.A, second.Bm, second.Cm, second.Dskip, second.z,
                   second.bias, out2, last2.data());
    const Scan whole_second = s.steps(21, 50);
    std::vector<double> expect;
    for (int b = 0; b < s.B; ++b)
      expect.insert(expect.end(), out.begin() + (size_t(b) * s.L + 21) * s.D,
                    out.begin() + (size_t(b) * s.L + 50) * s.D);
    EXPECT_LT(test::rel_diff(expect, out2), 1e-13) << N;
    EXPECT_LT(test::rel_diff(last, last2), 1e-13) << N;
    // Without the carried state the second half differs: the test can tell.
    std::vector<double> cold;
    whole_second.forward(whole_second.u, whole_second.delta, whole_second.A, whole_second.Bm,
                         whole_second.Cm, whole_second.Dskip, whole_second.z, whole_second.bias,
                         cold);
    EXPECT_GT(test::rel_diff(expect, cold), 1e-3) << N;
  }
}

CPU_TEST(SelectiveScan, ParallelEqualsSerial) {
  Scan s(6, 30, 150, 16, true, true, true, true, 31);
  std::mt19937_64 rng(32);
  const auto w = rand_vec(size_t(s.B) * s.L * s.D, rng);
  auto run = [&] {
    std::vector<float> out;
    s.forward(cast<float>(s.u), cast<float>(s.delta), cast<float>(s.A), cast<float>(s.Bm),
              cast<float>(s.Cm), cast<float>(s.Dskip), cast<float>(s.z), cast<float>(s.bias), out);
    const Grads g = backward<float>(s, w);
    std::vector<double> all(out.begin(), out.end());
    for (const auto* v : {&g.du, &g.ddelta, &g.dA, &g.dBm, &g.dCm, &g.dD, &g.dz, &g.dbias})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const auto par = run();
  tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  EXPECT_EQ(par, run());
}

}  // namespace
}  // namespace slipstream::kernels

namespace slipstream::kernels {
namespace {

// A scan problem for the step form: random inputs (softplus on, z, D and a bias), the float64
// parallel form's outputs and last state, and the step form run frame by frame in T.
struct StepProblem {
  int B, L, D, N;
  std::vector<double> u, delta, z, Bm, Cm, A, Dskip, bias, out, last;
  StepProblem(int B_, int L_, int D_, int N_, uint64_t seed) : B(B_), L(L_), D(D_), N(N_) {
    std::mt19937_64 rng(seed);
    const size_t bld = size_t(B) * L * D, bln = size_t(B) * L * N;
    u = test::rand_vec(bld, rng), delta = test::rand_vec(bld, rng), z = test::rand_vec(bld, rng);
    Bm = test::rand_vec(bln, rng), Cm = test::rand_vec(bln, rng);
    A = test::rand_pos(size_t(D) * N, rng, 0.3, 2.0), Dskip = test::rand_vec(D, rng);
    bias = test::rand_vec(D, rng);
    for (double& a : A) a = -a;
    out.resize(bld), last.resize(size_t(B) * D * N);
    selective_scan_forward(u.data(), delta.data(), A.data(), Bm.data(), Cm.data(), Dskip.data(),
                           z.data(), bias.data(), true, static_cast<const double*>(nullptr),
                           out.data(), last.data(), B, L, D, N);
  }
  // The step form's outputs (B, L, D), and its state after the last frame into `state`.
  template <class T>
  std::vector<double> stepped(std::vector<double>& state) const {
    const auto At = cast<T>(A), Dt = cast<T>(Dskip), biast = cast<T>(bias);
    std::vector<T> st(size_t(B) * D * N, T(0));
    std::vector<double> all(out.size());
    for (int t = 0; t < L; ++t) {
      std::vector<T> ut, dt, zt, Bt, Ct, ot(size_t(B) * D);
      for (int b = 0; b < B; ++b) {
        for (int d = 0; d < D; ++d) {
          const size_t i = (size_t(b) * L + t) * D + d;
          ut.push_back(T(u[i])), dt.push_back(T(delta[i])), zt.push_back(T(z[i]));
        }
        for (int n = 0; n < N; ++n) {
          Bt.push_back(T(Bm[(size_t(b) * L + t) * N + n]));
          Ct.push_back(T(Cm[(size_t(b) * L + t) * N + n]));
        }
      }
      selective_scan_step(st.data(), ut.data(), dt.data(), At.data(), Bt.data(), Ct.data(),
                          Dt.data(), zt.data(), biast.data(), true, ot.data(), B, D, N);
      for (int b = 0; b < B; ++b)
        for (int d = 0; d < D; ++d) all[(size_t(b) * L + t) * D + d] = ot[size_t(b) * D + d];
    }
    state.assign(st.begin(), st.end());
    return all;
  }
};

// Frame by frame with a carried state, the step form gives the parallel form's outputs and
// final state.
CPU_TEST(SelectiveScan, StepEqualsParallelForm) {
  const StepProblem p(2, 23, 19, 5, 77);
  std::vector<double> state;
  const auto stepped = p.stepped<double>(state);
  for (size_t i = 0; i < stepped.size(); ++i) EXPECT_NEAR(stepped[i], p.out[i], 1e-12) << i;
  for (size_t i = 0; i < state.size(); ++i) EXPECT_NEAR(state[i], p.last[i], 1e-12);
}

// The float step (y's sums over the states by a shuffle tree at AVX2 and AVX-512 where N is a
// multiple of the vector's width, a sum a channel otherwise; ctest runs this at every level)
// frame by frame against the float64 parallel form: D 37 leaves a partial group of channels.
CPU_TEST(SelectiveScan, FloatStepEqualsParallelForm) {
  for (const int N : {16, 32, 8, 5}) {
    const StepProblem p(3, 9, 37, N, 78 + uint64_t(N));
    std::vector<double> state;
    EXPECT_LT(test::rel_diff(p.out, p.stepped<float>(state)), 1e-5) << "N " << N;
    EXPECT_LT(test::rel_diff(p.last, state), 1e-5) << "N " << N;
  }
}

}  // namespace
}  // namespace slipstream::kernels
#endif  // SLIPSTREAM_REFERENCE_TESTS

// ---- The CUDA kernels against the reference ----

namespace slipstream::kernels::test {

struct ScanShape {
  int B, L, D, N;
  bool z = true, dskip = true, bias = true, softplus = true;
  bool initial = false;  // start from a given state (a window that continues another)
};

inline std::string describe(const ScanShape& s) {
  return "B" + std::to_string(s.B) + " L" + std::to_string(s.L) + " D" + std::to_string(s.D) +
         " N" + std::to_string(s.N) + (s.z ? " z" : "") + (s.dskip ? " D" : "") +
         (s.bias ? " bias" : "") + (s.softplus ? " softplus" : "") +
         (s.initial ? " initial_state" : "");
}

// Inputs as float64, already rounded to what T (for the T-typed tensors) and fp32 (for A,
// Dskip, delta_bias) represent, so the reference sees exactly what the device sees.
template <class T>
struct ScanData {
  std::vector<double> u, delta, A, Bm, Cm, Dskip, z, bias, dout, h0;
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
    if (s.initial) h0 = round_trip<float>(rand_vec(size_t(s.B) * s.D * s.N, rng));
  }
};

inline const double* ptr(const std::vector<double>& v) {
  return v.empty() ? nullptr : v.data();
}

template <class Mem, class U>
const U* up(Mem& mem, const std::vector<double>& v) {
  return v.empty() ? nullptr : mem.upload(elems<U>(v));
}

// The float64 CPU forward: out (B, L, D) and the last state (B, D, N).
struct ScanReference {
  std::vector<double> out, last;
  template <class T>
  ScanReference(const ScanShape& s, const ScanData<T>& d)
      : out(size_t(s.B) * s.L * s.D), last(size_t(s.B) * s.D * s.N) {
    selective_scan_forward<double>(d.u.data(), d.delta.data(), d.A.data(), d.Bm.data(), d.Cm.data(),
                                   ptr(d.Dskip), ptr(d.z), ptr(d.bias), s.softplus, ptr(d.h0),
                                   out.data(), last.data(), s.B, s.L, s.D, s.N);
  }
};

template <class Kernels, class Mem, class T>
void check_scan_forward(const ScanShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ScanData<T> d(s, seed);
  const ScanReference ref(s, d);
  const size_t bld = ref.out.size(), bdn = ref.last.size();
  Mem mem;
  T* out = mem.template alloc<T>(bld);
  bfloat16* out_bf = mem.template alloc<bfloat16>(bld);
  float* last = mem.template alloc<float>(bdn);
  auto forward = [&](T* o, bfloat16* o_bf) {
    Kernels::template selective_scan_forward<T>(
        up<Mem, T>(mem, d.u), up<Mem, T>(mem, d.delta), up<Mem, float>(mem, d.A),
        up<Mem, T>(mem, d.Bm), up<Mem, T>(mem, d.Cm), up<Mem, float>(mem, d.Dskip),
        up<Mem, T>(mem, d.z), up<Mem, float>(mem, d.bias), s.softplus, up<Mem, float>(mem, d.h0), o,
        o_bf, last, nullptr, s.B, s.L, s.D, s.N, mem.stream());
  };
  forward(out, out_bf);
  mem.sync();
  const std::vector<T> out_dev = mem.download(out, bld);
  EXPECT_CLOSE(values(out_dev), ref.out, tolerance<T>(), "out");
  // The bf16 copy is out rounded as the cast rounds it, bit for bit.
  const std::vector<bfloat16> obf = mem.download(out_bf, bld);
  for (size_t i = 0; i < bld; ++i)
    ASSERT_EQ(obf[i].bits, fp32_to_bf16(float(value(out_dev[i])))) << "out_bf[" << i << "]";
  EXPECT_CLOSE(values(mem.download(last, bdn)), ref.last, 1e-5, "last_state");
  // The copy alone (out null, as the bf16 model on a device asks): the same bits; neither is
  // refused.
  bfloat16* out_bf_only = mem.template alloc<bfloat16>(bld);
  forward(nullptr, out_bf_only);
  mem.sync();
  const std::vector<bfloat16> obf_only = mem.download(out_bf_only, bld);
  for (size_t i = 0; i < bld; ++i)
    ASSERT_EQ(obf_only[i].bits, obf[i].bits) << "out_bf alone, " << i;
  EXPECT_THROW(forward(nullptr, nullptr), std::invalid_argument);
}

// The device backward's gradients on d (from the kernel forward's chunk states when
// forward_states, else finding them itself), downloaded as du, ddelta, dBm, dCm, dz, dA, dDskip,
// ddelta_bias; the accumulated three start from dA0, dD0, db0.
struct DeviceScanGrads {
  std::vector<double> du, ddelta, dB, dC, dz, dA, dD, db;
};
// Every gradient of two device backwards, bit for bit.
inline void expect_same_gradients(const DeviceScanGrads& a, const DeviceScanGrads& b,
                                  const std::string& what) {
  using G = DeviceScanGrads;
  for (auto [name, f] : {std::pair{"du", &G::du},
                         {"ddelta", &G::ddelta},
                         {"dBm", &G::dB},
                         {"dCm", &G::dC},
                         {"dz", &G::dz},
                         {"dA", &G::dA},
                         {"dDskip", &G::dD},
                         {"ddelta_bias", &G::db}})
    EXPECT_EQ(a.*f, b.*f) << name << what;
}

template <class Kernels, class Mem, class T>
DeviceScanGrads device_scan_backward(const ScanShape& s, const ScanData<T>& d,
                                     const std::vector<double>& dA0, const std::vector<double>& dD0,
                                     const std::vector<double>& db0, bool forward_states,
                                     int ldbc = 0, bool a_log = false, int z_ld = 0,
                                     std::vector<double>* forward_out = nullptr) {
  const size_t bld = size_t(s.B) * s.L * s.D, bln = size_t(s.B) * s.L * s.N;
  const size_t dn = size_t(s.D) * s.N;
  Mem mem;
  T *g_du = mem.template alloc<T>(bld), *g_ddelta = mem.template alloc<T>(bld);
  // With ldbc, dBm and dCm are written into rows ldbc apart (the alloc's 0xFF bytes between);
  // with z_ld, dz and its bf16 copy into rows z_ld apart.
  const size_t rows_bc = size_t(s.B) * s.L, wide_bc = ldbc ? rows_bc * size_t(ldbc) : bln;
  const size_t wide_z = z_ld ? rows_bc * size_t(z_ld) : bld;
  T *g_dB = mem.template alloc<T>(wide_bc), *g_dC = mem.template alloc<T>(wide_bc);
  T* g_dz = s.z ? mem.template alloc<T>(wide_z) : nullptr;
  float* g_dA = mem.upload(elems<float>(dA0));
  float* g_dD = mem.upload(elems<float>(dD0));
  float* g_db = mem.upload(elems<float>(db0));
  void* w = mem.alloc_bytes(Kernels::selective_scan_backward_workspace_bytes(s.B, s.L, s.D, s.N));
  const T *u = up<Mem, T>(mem, d.u), *delta = up<Mem, T>(mem, d.delta);
  // With ldbc, Bm and Cm rows ldbc apart, NaN between them: a read past a row's N poisons all;
  // z likewise with z_ld.
  auto rows = [&](const std::vector<double>& v, size_t cols, int ld) {
    if (ld == 0 || v.empty()) return up<Mem, T>(mem, v);
    return up<Mem, T>(mem, nan_between_rows(v, rows_bc, cols, size_t(ld)));
  };
  const T *Bm = rows(d.Bm, size_t(s.N), ldbc), *Cm = rows(d.Cm, size_t(s.N), ldbc);
  const T* z = rows(d.z, size_t(s.D), z_ld);
  const float *A = up<Mem, float>(mem, d.A), *Dskip = up<Mem, float>(mem, d.Dskip);
  const float *bias = up<Mem, float>(mem, d.bias), *h0 = up<Mem, float>(mem, d.h0);
  float* states = nullptr;
  if (forward_states || forward_out) {
    if (forward_states)
      states = static_cast<float*>(
          mem.alloc_bytes(Kernels::selective_scan_chunk_states_bytes(s.B, s.L, s.D, s.N)));
    T* out = mem.template alloc<T>(bld);
    Kernels::template selective_scan_forward<T>(u, delta, A, Bm, Cm, Dskip, z, bias, s.softplus, h0,
                                                out, nullptr, nullptr, states, s.B, s.L, s.D, s.N,
                                                mem.stream(), ldbc, z_ld, a_log);
    if (forward_out) *forward_out = values(mem.download(out, bld));
  }
  bfloat16* g_ddbf = mem.template alloc<bfloat16>(bld);
  bfloat16* g_dzbf = s.z ? mem.template alloc<bfloat16>(wide_z) : nullptr;
  Kernels::template selective_scan_backward<T>(
      u, delta, A, Bm, Cm, Dskip, z, bias, s.softplus, h0, states, up<Mem, T>(mem, d.dout), g_du,
      g_ddelta, g_dA, g_dB, g_dC, s.dskip ? g_dD : nullptr, g_dz, s.bias ? g_db : nullptr, g_ddbf,
      g_dzbf, w, s.B, s.L, s.D, s.N, mem.stream(), ldbc, a_log, z_ld);
  mem.sync();
  // The bf16 copies are ddelta and dz rounded as the cast rounds them, bit for bit.
  const std::vector<T> ddelta_dev = mem.download(g_ddelta, bld);
  const std::vector<bfloat16> ddbf = mem.download(g_ddbf, bld);
  for (size_t i = 0; i < bld; ++i) {
    EXPECT_EQ(ddbf[i].bits, fp32_to_bf16(float(value(ddelta_dev[i])))) << "ddelta_bf[" << i << "]";
    if (ddbf[i].bits != fp32_to_bf16(float(value(ddelta_dev[i])))) break;
  }
  std::vector<T> dz_dev;
  if (s.z) {
    dz_dev = packed_rows(mem, g_dz, rows_bc, size_t(s.D), z_ld);
    const std::vector<bfloat16> dzbf = packed_rows(mem, g_dzbf, rows_bc, size_t(s.D), z_ld);
    for (size_t i = 0; i < bld; ++i) {
      EXPECT_EQ(dzbf[i].bits, fp32_to_bf16(float(value(dz_dev[i])))) << "dz_bf[" << i << "]";
      if (dzbf[i].bits != fp32_to_bf16(float(value(dz_dev[i])))) break;
    }
    // dz's copy alone (dz null, as the bf16 model on a device asks): the same bits. Its own
    // accumulators, so the figures below are the first run's.
    bfloat16* g_dzbf_only = mem.template alloc<bfloat16>(wide_z);
    Kernels::template selective_scan_backward<T>(
        u, delta, A, Bm, Cm, Dskip, z, bias, s.softplus, h0, states, up<Mem, T>(mem, d.dout),
        mem.template alloc<T>(bld), mem.template alloc<T>(bld), mem.upload(elems<float>(dA0)),
        mem.template alloc<T>(wide_bc), mem.template alloc<T>(wide_bc),
        s.dskip ? mem.upload(elems<float>(dD0)) : nullptr, nullptr,
        s.bias ? mem.upload(elems<float>(db0)) : nullptr, nullptr, g_dzbf_only, w, s.B, s.L, s.D,
        s.N, mem.stream(), ldbc, a_log, z_ld);
    mem.sync();
    const std::vector<bfloat16> dzbf_only =
        packed_rows(mem, g_dzbf_only, rows_bc, size_t(s.D), z_ld);
    for (size_t i = 0; i < bld; ++i) {
      EXPECT_EQ(dzbf_only[i].bits, dzbf[i].bits) << "dz_bf alone, " << i;
      if (dzbf_only[i].bits != dzbf[i].bits) break;
    }
  }
  DeviceScanGrads g;
  g.du = values(mem.download(g_du, bld));
  g.ddelta = values(ddelta_dev);
  g.dB = values(packed_rows(mem, g_dB, rows_bc, size_t(s.N), ldbc));
  g.dC = values(packed_rows(mem, g_dC, rows_bc, size_t(s.N), ldbc));
  if (s.z) g.dz = values(dz_dev);
  g.dA = values(mem.download(g_dA, dn));
  g.dD = values(mem.download(g_dD, size_t(s.D)));
  g.db = values(mem.download(g_db, size_t(s.D)));
  return g;
}

template <class Kernels, class Mem, class T>
void check_scan_backward(const ScanShape& s, uint64_t seed, bool forward_states = false) {
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
  selective_scan_backward<double>(
      d.u.data(), d.delta.data(), d.A.data(), d.Bm.data(), d.Cm.data(), ptr(d.Dskip), ptr(d.z),
      ptr(d.bias), s.softplus, ptr(d.h0), d.dout.data(), du.data(), ddelta.data(), dA.data(),
      dB.data(), dC.data(), s.dskip ? dD.data() : nullptr, s.z ? dz.data() : nullptr,
      s.bias ? db.data() : nullptr, ws.data(), s.B, s.L, s.D, s.N);
  const DeviceScanGrads g =
      device_scan_backward<Kernels, Mem, T>(s, d, dA0, dD0, db0, forward_states);
  const double tol = tolerance<T>();
  EXPECT_CLOSE(g.du, du, tol, "du");
  EXPECT_CLOSE(g.ddelta, ddelta, tol, "ddelta");
  EXPECT_CLOSE(g.dB, dB, tol, "dBm");
  EXPECT_CLOSE(g.dC, dC, tol, "dCm");
  if (s.z) EXPECT_CLOSE(g.dz, dz, tol, "dz");
  // fp32 outputs from the same (rounded) inputs: fp32 accuracy whatever T is.
  EXPECT_CLOSE(g.dA, dA, 1e-5, "dA (+=)");
  EXPECT_CLOSE(g.dD, dD, 1e-5, "dDskip (+=)");
  EXPECT_CLOSE(g.db, db, 1e-5, "ddelta_bias (+=)");
}

// The stateful single step, frame after frame, equals the parallel forward on the same frames.
template <class Kernels, class Mem, class T>
void check_scan_step(const ScanShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ScanData<T> d(s, seed);
  const ScanReference ref(s, d);
  const size_t bld = ref.out.size(), bdn = ref.last.size();
  auto frame = [&](const std::vector<double>& v, int t, int C) {
    std::vector<double> f;
    if (v.empty()) return f;
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < C; ++c) f.push_back(v[(size_t(b) * s.L + t) * C + c]);
    return f;
  };
  Mem mem;
  float* state = mem.upload(d.h0.empty() ? std::vector<float>(bdn, 0.0f) : elems<float>(d.h0));
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
  EXPECT_CLOSE(got, ref.out, tolerance<T>(), "step outputs vs parallel forward");
  EXPECT_CLOSE(values(mem.download(state, bdn)), ref.last, 1e-5, "state after L steps");
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
      // dB and dC summed over 16 and 10 channel blocks' partials (the sums' register form, its
      // lanes holding one partial, or two: 10 is 8 lanes)
      {1, 5, 500, 32},
      {2, 3, 300, 32, true, true, false, true},
  };
}

// From a carried state: windows of one and of several backward chunks, one and two threads a
// channel, the default backward shape's padded second thread.
inline std::vector<ScanShape> initial_state_shapes() {
  return {
      {2, 37, 40, 16, true, true, true, true, true},
      {3, 3, 33, 5, true, true, false, false, true},
      {1, 33, 9, 32, true, true, true, true, true},
      {2, 21, 45, 12, true, true, true, true, true},
  };
}

}  // namespace slipstream::kernels::test

namespace slipstream::kernels::test {
namespace {

const ScanShape kGpuStandard{256, 60, 256, 16};

KERNEL_TEST(Scan, ForwardMatchesCpuFp32) {
  uint64_t seed = 1;
  for (const auto& s : scan_shapes()) check_scan_forward<Kernels, Mem, float>(s, seed++);
}
KERNEL_TEST(Scan, ForwardMatchesCpuBf16) {
  uint64_t seed = 11;
  for (const auto& s : scan_shapes()) check_scan_forward<Kernels, Mem, bfloat16>(s, seed++);
}
KERNEL_TEST(Scan, BackwardMatchesCpuFp32) {
  uint64_t seed = 21;
  for (const auto& s : scan_shapes()) check_scan_backward<Kernels, Mem, float>(s, seed++);
  // The default shape gives a thread 8 states: 8 + 4 pads the second thread of a channel.
  check_scan_backward<Kernels, Mem, float>({2, 21, 45, 12}, 90);
}
KERNEL_TEST(Scan, BackwardMatchesCpuBf16) {
  uint64_t seed = 31;
  for (const auto& s : scan_shapes()) check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
}
// The backward's other forms for d_state 9..32 (kernels/selective_scan.h), which the benchmarks
// compare with the default.
template <class Kernels, class Mem>
void check_backward_variant(typename Kernels::ScanBackwardVariant v, uint64_t seed) {
  const auto was = Kernels::scan_backward_variant();
  Kernels::set_scan_backward_variant(v);
  for (const auto& s : scan_shapes()) {
    check_scan_backward<Kernels, Mem, float>(s, seed++);
    check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
  check_scan_backward<Kernels, Mem, float>({2, 21, 45, 12}, seed++);
  for (const auto& s : initial_state_shapes()) {
    check_scan_backward<Kernels, Mem, float>(s, seed++);
    check_scan_backward<Kernels, Mem, float>(s, seed++, true);
  }
  Kernels::set_scan_backward_variant(was);
}
KERNEL_TEST(Scan, BackwardSharedSumsVariantMatchesCpu) {
  check_backward_variant<Kernels, Mem>(Kernels::ScanBackwardVariant::shared_sums, 231);
}
KERNEL_TEST(Scan, BackwardSharedWholeChunksVariantMatchesCpu) {
  check_backward_variant<Kernels, Mem>(Kernels::ScanBackwardVariant::shared_whole_chunks, 251);
}
KERNEL_TEST(Scan, BackwardSpreadStepsVariantMatchesCpu) {
  check_backward_variant<Kernels, Mem>(Kernels::ScanBackwardVariant::spread_steps, 271);
}
// spread_steps does each step's channel work (the loads, softplus and the gate, du, dΔ and dz)
// once, in one of the channel's threads, where the default does it in each: the same values
// computed the same way, so the default's gradients bit for bit, at every shape, in both
// precisions, from initial states and from a forward's chunk states.
template <class Kernels, class Mem, class T>
void expect_spread_steps_gives_the_defaults_gradients(uint64_t seed) {
  using V = typename Kernels::ScanBackwardVariant;
  struct Put {  // the variant put back however the test ends
    V was = Kernels::scan_backward_variant();
    ~Put() { Kernels::set_scan_backward_variant(was); }
  } put;
  std::vector<ScanShape> shapes = scan_shapes();
  for (const auto& s : initial_state_shapes()) shapes.push_back(s);
  shapes.push_back({2, 21, 45, 12});
  for (const auto& s : shapes) {
    if (s.N <= 8) continue;  // one thread a channel: the default's kernel
    SCOPED_TRACE(describe(s));
    const ScanData<T> d(s, seed++);
    const std::vector<double> dA0(size_t(s.D) * s.N, 0.25), dD0(size_t(s.D), -0.5),
        db0(size_t(s.D), 0.125);
    for (const bool kept : {false, true}) {
      Kernels::set_scan_backward_variant(V::split);
      const auto split = device_scan_backward<Kernels, Mem, T>(s, d, dA0, dD0, db0, kept);
      Kernels::set_scan_backward_variant(V::spread_steps);
      const auto spread = device_scan_backward<Kernels, Mem, T>(s, d, dA0, dD0, db0, kept);
      expect_same_gradients(split, spread, kept ? " (forward's states)" : "");
    }
  }
}
KERNEL_TEST(Scan, BackwardSpreadStepsGivesTheDefaultsGradients) {
  expect_spread_steps_gives_the_defaults_gradients<Kernels, Mem, float>(291);
  expect_spread_steps_gives_the_defaults_gradients<Kernels, Mem, bfloat16>(331);
}
// The backward from the chunk states a forward kept (kernels/selective_scan.h), every shape,
// both precisions, from an initial state, and d_state 12 (a channel's second thread half padding).
KERNEL_TEST(Scan, BackwardFromForwardStatesMatchesCpu) {
  uint64_t seed = 81;
  for (const auto& s : scan_shapes()) {
    check_scan_backward<Kernels, Mem, float>(s, seed++, true);
    check_scan_backward<Kernels, Mem, bfloat16>(s, seed++, true);
  }
  for (const auto& s : initial_state_shapes())
    check_scan_backward<Kernels, Mem, float>(s, seed++, true);
  check_scan_backward<Kernels, Mem, float>({2, 21, 45, 12}, seed++, true);
}
// At the three backward shapes, `more` and the initial-state shapes: the backward from the chunk
// states the forward kept gives the gradients of a backward finding its own, bit for bit.
template <class Kernels, class Mem>
void expect_kept_states_give_the_same_gradients(std::vector<ScanShape> shapes, uint64_t seed,
                                                const std::string& what) {
  for (const ScanShape& s :
       {ScanShape{2, 21, 45, 12}, ScanShape{3, 9, 70, 16}, ScanShape{2, 13, 20, 32}})
    shapes.push_back(s);
  for (const auto& s : initial_state_shapes()) shapes.push_back(s);
  for (const auto& s : shapes) {
    SCOPED_TRACE(describe(s));
    const ScanData<float> d(s, seed++);
    const std::vector<double> dA0(size_t(s.D) * s.N), dD0(size_t(s.D)), db0(size_t(s.D));
    const auto own = device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, false);
    const auto kept = device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, true);
    expect_same_gradients(own, kept, what);
  }
}
// The forward's states are the ones the backward's own first pass finds, bit for bit (the same
// recurrence, the same operations): the switch changes the time a step takes, not its results.
KERNEL_TEST(Scan, ForwardStatesGiveTheSameGradients) {
  expect_kept_states_give_the_same_gradients<Kernels, Mem>({}, 91, "");
}
// The forward's lean form (kernels/selective_scan.h, Kernels::set_scan_forward_lean): out against
// the CPU at every shape in both precisions and from initial states (other bits than the
// default's: y as four sums), and the chunk states it keeps those of the default, bit for bit: a
// backward from them gives the gradients of a backward finding its own.
KERNEL_TEST(Scan, ForwardLeanVariantMatchesCpu) {
  struct Lean {  // on for the test, put back however it ends
    bool was = Kernels::scan_forward_lean();
    Lean() { Kernels::set_scan_forward_lean(true); }
    ~Lean() { Kernels::set_scan_forward_lean(was); }
  } lean;
  uint64_t seed = 131;
  for (const auto& s : scan_shapes()) {
    check_scan_forward<Kernels, Mem, float>(s, seed++);
    check_scan_forward<Kernels, Mem, bfloat16>(s, seed++);
  }
  for (const auto& s : initial_state_shapes()) check_scan_forward<Kernels, Mem, float>(s, seed++);
  expect_kept_states_give_the_same_gradients<Kernels, Mem>({{1, 5, 500, 32}}, seed,
                                                           " (the lean forward's states)");
}
// The shapes of the wide-row checks: the three backward shapes (d_state 12, 16, 32).
inline std::vector<ScanShape> wide_row_shapes() {
  return {{2, 21, 45, 12}, {3, 9, 70, 16}, {2, 13, 20, 32}};
}
// Bm and Cm read from rows wider than N, dBm and dCm written into them (the model passes x_proj's
// output and its gradient, whose rows hold dt, Bm and Cm): the same gradients bit for bit, with
// the backward's own first pass and with the forward's chunk states, nothing written between.
KERNEL_TEST(Scan, ReadsBmAndCmFromWiderRows) {
  uint64_t seed = 97;
  for (const ScanShape& s : wide_row_shapes()) {
    SCOPED_TRACE(describe(s));
    const ScanData<float> d(s, seed++);
    const std::vector<double> dA0(size_t(s.D) * s.N), dD0(size_t(s.D)), db0(size_t(s.D));
    const auto own = device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, false);
    for (const bool kept : {false, true})
      expect_same_gradients(
          own, device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, kept, s.N + 7),
          kept ? " (forward's states)" : "");
  }
}
// z read from, and dz with its bf16 copy written to, rows z_ld apart (the model's in_proj output
// and its gradient, x and z side by side): the same forward and gradients bit for bit, nothing
// written between the rows.
KERNEL_TEST(Scan, ReadsZAndWritesDzInWiderRows) {
  uint64_t seed = 131;
  for (const ScanShape& s : wide_row_shapes()) {
    SCOPED_TRACE(describe(s));
    const ScanData<float> d(s, seed++);
    const std::vector<double> dA0(size_t(s.D) * s.N), dD0(size_t(s.D)), db0(size_t(s.D));
    std::vector<double> out, out_wide;
    const auto own =
        device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, false, 0, false, 0, &out);
    const auto wide = device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, false, 0,
                                                                false, 2 * s.D, &out_wide);
    EXPECT_EQ(out, out_wide) << "forward";
    expect_same_gradients(own, wide, " (z rows apart)");
  }
}
// Given A_log (a_log), the kernels make A = −exp(A_log) as the elementwise neg_exp makes it, and
// dA receives A_log's gradient: the forward and every other gradient are the bits of a scan given
// neg_exp's A, and dA_log = dA0 + (the sum) · A, as the model's dA_log += dA · A did with a zeroed
// dA and a separate product.
KERNEL_TEST(Scan, ALogMakesAAndAppliesTheChainRule) {
  const ScanShape s{2, 21, 45, 16};
  ScanData<float> d(s, 99);
  std::mt19937_64 rng(100);
  const size_t dn = size_t(s.D) * s.N;
  const std::vector<double> zeros(dn), dD0(size_t(s.D)), db0(size_t(s.D));
  const auto dA0 = round_trip<float>(rand_vec(dn, rng));
  const auto a_log = round_trip<float>(rand_vec(dn, rng, -1.0, 0.7));
  std::vector<double> a;  // neg_exp's A, as the model made it before
  {
    Mem mem;
    float* y = mem.template alloc<float>(dn);
    Kernels::neg_exp(mem.upload(elems<float>(a_log)), dn, y, 1, dn, mem.stream());
    a = values(mem.download(y, dn));
  }
  d.A = a;
  std::vector<double> out_a, out_log;
  const auto sum =
      device_scan_backward<Kernels, Mem, float>(s, d, zeros, dD0, db0, false, 0, false, 0, &out_a);
  d.A = a_log;
  const auto chained =
      device_scan_backward<Kernels, Mem, float>(s, d, dA0, dD0, db0, false, 0, true, 0, &out_log);
  EXPECT_EQ(out_a, out_log) << "the forward";
  for (size_t i = 0; i < dn; ++i) {
    const float want = float(dA0[i]) + float(sum.dA[i]) * float(a[i]);
    EXPECT_NEAR(chained.dA[i], want, 1e-6 * (1.0 + std::abs(want))) << "dA[" << i << "]";
  }
  auto others = [](DeviceScanGrads g) {
    g.dA.clear();
    return g;
  };
  expect_same_gradients(others(sum), others(chained), " (the other gradients, given A_log)");
}
// Given dt and dt_proj's weight (dt_w), the forward makes Δ itself (a forward no backward
// follows): out and the last state as the float64 reference given Δ = dt dt_wᵀ, with dt, Bm and
// Cm read from one row each (x_proj's output: dt, Bm, Cm side by side) and Δ's tensor not read;
// a rank past kScanMaxDtRank is refused.
KERNEL_TEST(Scan, ForwardMakesDeltaFromItsLowRankForm) {
  uint64_t seed = 171;
  for (const ScanShape& s : wide_row_shapes())
    for (const int R : {1, 8, Kernels::kScanMaxDtRank}) {
      SCOPED_TRACE(describe(s) + " rank " + std::to_string(R));
      ScanData<float> d(s, seed++);
      std::mt19937_64 rng(seed++);
      const size_t M = size_t(s.B) * s.L, P = size_t(R) + 2 * size_t(s.N);
      const auto dt = round_trip<float>(rand_vec(M * size_t(R), rng));
      const auto w = round_trip<float>(rand_vec(size_t(s.D) * size_t(R), rng, -0.5, 0.5));
      for (size_t m = 0; m < M; ++m)
        for (size_t c = 0; c < size_t(s.D); ++c) {
          double acc = 0;
          for (size_t r = 0; r < size_t(R); ++r)
            acc += dt[m * size_t(R) + r] * w[c * size_t(R) + r];
          d.delta[m * size_t(s.D) + c] = acc;
        }
      const ScanReference ref(s, d);
      std::vector<double> rows(M * P);
      for (size_t m = 0; m < M; ++m)
        for (size_t k = 0; k < P; ++k)
          rows[m * P + k] = k < size_t(R) ? dt[m * size_t(R) + k]
                            : k < size_t(R) + size_t(s.N)
                                ? d.Bm[m * size_t(s.N) + k - size_t(R)]
                                : d.Cm[m * size_t(s.N) + k - size_t(R) - size_t(s.N)];
      Mem mem;
      const float* g_rows = up<Mem, float>(mem, rows);
      float* out = mem.template alloc<float>(ref.out.size());
      float* last = mem.template alloc<float>(ref.last.size());
      Kernels::template selective_scan_forward<float>(
          up<Mem, float>(mem, d.u), nullptr, up<Mem, float>(mem, d.A), g_rows + R, g_rows + R + s.N,
          up<Mem, float>(mem, d.Dskip), up<Mem, float>(mem, d.z), up<Mem, float>(mem, d.bias),
          s.softplus, nullptr, out, nullptr, last, nullptr, s.B, s.L, s.D, s.N, mem.stream(),
          int(P), 0, false, g_rows, up<Mem, float>(mem, w), R);
      mem.sync();
      EXPECT_CLOSE(values(mem.download(out, ref.out.size())), ref.out, 1e-5, "out");
      EXPECT_CLOSE(values(mem.download(last, ref.last.size())), ref.last, 1e-5, "last_state");
    }
  Mem mem;
  float* y = mem.template alloc<float>(64);
  EXPECT_THROW(
      Kernels::template selective_scan_forward<float>(
          y, nullptr, y, y, y, nullptr, nullptr, nullptr, true, nullptr, y, nullptr, nullptr,
          nullptr, 1, 1, 1, 1, mem.stream(), 0, 0, false, y, y, Kernels::kScanMaxDtRank + 1),
      std::invalid_argument);
}
KERNEL_TEST(Scan, StepEqualsParallelForm) {
  uint64_t seed = 41;
  for (const auto& s : scan_shapes()) check_scan_step<Kernels, Mem, float>(s, seed++);
  for (const auto& s : initial_state_shapes()) check_scan_step<Kernels, Mem, float>(s, seed++);
}
KERNEL_TEST(Scan, FromInitialStateMatchesCpu) {
  uint64_t seed = 61;
  for (const auto& s : initial_state_shapes()) {
    check_scan_forward<Kernels, Mem, float>(s, seed++);
    check_scan_forward<Kernels, Mem, bfloat16>(s, seed++);
    check_scan_backward<Kernels, Mem, float>(s, seed++);
    check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
}
KERNEL_TEST(Scan, BadStateSizeNamesTheOp) {
  try {
    Kernels::selective_scan_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                           nullptr, nullptr, true, nullptr, nullptr, nullptr,
                                           nullptr, nullptr, 1, 1, 1, 64, nullptr);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("selective_scan_forward"), std::string::npos);
  }
}

DEVICE_TEST(Scan, GpuStandardShape) {
  check_scan_forward<Kernels, Mem, float>(kGpuStandard, 51);
  check_scan_backward<Kernels, Mem, bfloat16>(kGpuStandard, 55, true);
  const auto was = Kernels::scan_backward_variant();
  Kernels::set_scan_backward_variant(Kernels::ScanBackwardVariant::shared_whole_chunks);
  check_scan_backward<Kernels, Mem, float>(kGpuStandard, 54);
  Kernels::set_scan_backward_variant(was);
}
// The backward at gpu_standard's d_state is latency-bound: its time follows the waves of blocks
// (1,024 blocks at gpu_standard), so 4 blocks an SM (at most 128 registers) against 3 is a third
// fewer waves. A change that adds registers past 128 fails here, not unnoticed in a benchmark.
DEVICE_TEST(Scan, BackwardKeepsFourBlocksAnSm) {
  for (int n : {16, 32}) {  // gpu_standard's d_state and production's
    EXPECT_GE(Kernels::template selective_scan_backward_blocks_per_sm<float>(n), 4) << n;
    EXPECT_GE(Kernels::template selective_scan_backward_blocks_per_sm<bfloat16>(n), 4) << n;
  }
}
// Same inputs twice: bit-identical gradients (no atomics anywhere in the backward).
DEVICE_TEST(Scan, BackwardIsDeterministic) {
  const ScanShape s{8, 60, 256, 16};
  const ScanData<float> d(s, 61);
  const size_t bld = size_t(s.B) * s.L * s.D, bln = size_t(s.B) * s.L * s.N;
  Mem mem;
  auto run = [&] {
    std::vector<float> dA_init(size_t(s.D) * s.N, 0.0f);
    float* dA = mem.upload(dA_init);
    float* dD = mem.upload(std::vector<float>(size_t(s.D), 0.0f));
    float* db = mem.upload(std::vector<float>(size_t(s.D), 0.0f));
    float *du = mem.template alloc<float>(bld), *ddelta = mem.template alloc<float>(bld),
          *dz = mem.template alloc<float>(bld);
    float *dB = mem.template alloc<float>(bln), *dC = mem.template alloc<float>(bln);
    void* ws =
        mem.alloc_bytes(Kernels::selective_scan_backward_workspace_bytes(s.B, s.L, s.D, s.N));
    Kernels::selective_scan_backward<float>(
        up<Mem, float>(mem, d.u), up<Mem, float>(mem, d.delta), up<Mem, float>(mem, d.A),
        up<Mem, float>(mem, d.Bm), up<Mem, float>(mem, d.Cm), up<Mem, float>(mem, d.Dskip),
        up<Mem, float>(mem, d.z), up<Mem, float>(mem, d.bias), true, nullptr, nullptr,
        up<Mem, float>(mem, d.dout), du, ddelta, dA, dB, dC, dD, dz, db, nullptr, nullptr, ws, s.B,
        s.L, s.D, s.N, mem.stream());
    std::vector<float> all = mem.download(du, bld);
    for (auto [p, n] : {std::pair<float*, size_t>{ddelta, bld},
                        {dz, bld},
                        {dB, bln},
                        {dC, bln},
                        {dA, size_t(s.D) * s.N},
                        {dD, size_t(s.D)},
                        {db, size_t(s.D)}}) {
      const auto v = mem.download(p, n);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
}  // namespace slipstream::kernels::test
