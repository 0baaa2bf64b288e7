#include "kernels/selective_scan.h"

#include <gtest/gtest.h>

#include <tbb/global_control.h>

#include <cmath>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

// Inputs of one scan problem, in double.
struct Scan {
  int B, L, D, N;
  bool use_z, use_D, use_bias, softplus;
  std::vector<double> u, delta, A, Bm, Cm, Dskip, z, bias;

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
    selective_scan_forward<T>(u_.data(), delta_.data(), A_.data(), Bm_.data(), Cm_.data(),
                              use_D ? D_.data() : nullptr, use_z ? z_.data() : nullptr,
                              use_bias ? bias_.data() : nullptr, softplus, out.data(), last, B, L,
                              D, N);
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
  for (int k = 0; k < times; ++k)
    selective_scan_backward<T>(u.data(), delta.data(), A.data(), Bm.data(), Cm.data(),
                               s.use_D ? Dk.data() : nullptr, s.use_z ? z.data() : nullptr,
                               s.use_bias ? bias.data() : nullptr, s.softplus, dout.data(),
                               du.data(), ddelta.data(), dA.data(), dBm.data(), dCm.data(),
                               s.use_D ? dD.data() : nullptr, s.use_z ? dz.data() : nullptr,
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

TEST(SelectiveScan, ForwardMatchesReference) {
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

TEST(SelectiveScan, GradCheckFull) {
  // z, D, delta_bias, softplus; d_state 16, L 64.
  Scan s(2, 64, 3, 16, true, true, true, true, 11);
  gradcheck(s, 12);
}

TEST(SelectiveScan, GradCheckPlain) {
  // no z, no D, no bias, no softplus; two channel blocks (D = 18), N not a multiple of 16.
  Scan s(1, 64, 18, 12, false, false, false, false, 21);
  gradcheck(s, 22);
}

TEST(SelectiveScan, ParallelEqualsSerial) {
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

// Frame by frame with a carried state, the step form gives the parallel form's outputs and
// final state.
TEST(SelectiveScan, StepEqualsParallelForm) {
  std::mt19937_64 rng(77);
  const int B = 2, L = 23, D = 19, N = 5;
  const size_t bld = size_t(B) * L * D, bln = size_t(B) * L * N;
  auto u = test::rand_vec(bld, rng), delta = test::rand_vec(bld, rng), z = test::rand_vec(bld, rng);
  auto Bm = test::rand_vec(bln, rng), Cm = test::rand_vec(bln, rng);
  auto A = test::rand_pos(size_t(D) * N, rng, 0.3, 2.0), Dskip = test::rand_vec(D, rng);
  auto bias = test::rand_vec(D, rng);
  for (double& a : A) a = -a;
  std::vector<double> out(bld), last(size_t(B) * D * N);
  selective_scan_forward(u.data(), delta.data(), A.data(), Bm.data(), Cm.data(), Dskip.data(),
                         z.data(), bias.data(), true, out.data(), last.data(), B, L, D, N);
  std::vector<double> state(size_t(B) * D * N, 0.0);
  for (int t = 0; t < L; ++t) {
    std::vector<double> ut, dt, zt, Bt, Ct, ot(size_t(B) * D);
    for (int b = 0; b < B; ++b) {
      for (int d = 0; d < D; ++d) {
        const size_t i = (size_t(b) * L + t) * D + d;
        ut.push_back(u[i]), dt.push_back(delta[i]), zt.push_back(z[i]);
      }
      for (int n = 0; n < N; ++n) {
        Bt.push_back(Bm[(size_t(b) * L + t) * N + n]);
        Ct.push_back(Cm[(size_t(b) * L + t) * N + n]);
      }
    }
    selective_scan_step(state.data(), ut.data(), dt.data(), A.data(), Bt.data(), Ct.data(),
                        Dskip.data(), zt.data(), bias.data(), true, ot.data(), B, D, N);
    for (int b = 0; b < B; ++b)
      for (int d = 0; d < D; ++d)
        EXPECT_NEAR(ot[size_t(b) * D + d], out[(size_t(b) * L + t) * D + d], 1e-12) << t;
  }
  for (size_t i = 0; i < state.size(); ++i) EXPECT_NEAR(state[i], last[i], 1e-12);
}

}  // namespace
}  // namespace slipstream::kernels
