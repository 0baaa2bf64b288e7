// The causal depthwise convolution (kernels/causal_conv1d.h): the reference against float64
// finite differences and its recurrent step; the CUDA kernels (SiLU fused) against the reference
// on the emulator and on a device (tests/kernel_ops/kernel_test.h), fp32 and bf16.

#include <tbb/global_control.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/activations.h"
#include "kernels/causal_conv1d.h"
#include "tests/kernel_ops/kernel_test.h"

// ---- The CPU reference ----

#if SLIPSTREAM_REFERENCE_TESTS
namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

// Conv1d(C, C, K, groups=C, padding=K-1)(x)[..., :L] written out directly.
std::vector<double> ref_conv(const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& b, int B, int L, int C, int K) {
  std::vector<double> y(size_t(B) * L * C);
  for (int bb = 0; bb < B; ++bb)
    for (int t = 0; t < L; ++t)
      for (int c = 0; c < C; ++c) {
        double s = b[c];
        for (int k = 0; k < K; ++k) {
          const int src = t - (K - 1) + k;
          if (src >= 0) s += w[c * K + k] * x[(size_t(bb) * L + src) * C + c];
        }
        y[(size_t(bb) * L + t) * C + c] = s;
      }
  return y;
}

CPU_TEST(CausalConv1d, ForwardMatchesReference) {
  std::mt19937_64 rng(1);
  const int B = 3, L = 11, C = 37, K = 4;  // C spans a partial channel block
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  std::vector<double> y(x.size());
  causal_conv1d_forward(x.data(), static_cast<const double*>(nullptr), w.data(), b.data(), y.data(),
                        B, L, C, K);
  EXPECT_LT(test::rel_diff(ref_conv(x, w, b, B, L, C, K), y), 1e-15);
}

// The last K - 1 inputs of a window as the next window's prefix: the two windows' outputs are
// the whole sequence's.
CPU_TEST(CausalConv1d, PrefixContinuesTheSequence) {
  std::mt19937_64 rng(4);
  const int B = 3, L = 13, C = 37, K = 4, L1 = 5, L2 = L - L1;
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  const auto whole = ref_conv(x, w, b, B, L, C, K);
  auto rows = [&](const std::vector<double>& v, int t0, int t1) {
    std::vector<double> out;
    for (int bb = 0; bb < B; ++bb)
      out.insert(out.end(), v.begin() + (size_t(bb) * L + t0) * C,
                 v.begin() + (size_t(bb) * L + t1) * C);
    return out;
  };
  const auto x2 = rows(x, L1, L), prefix = rows(x, L1 - (K - 1), L1);
  std::vector<double> y2(x2.size()), cold(x2.size());
  causal_conv1d_forward(x2.data(), prefix.data(), w.data(), b.data(), y2.data(), B, L2, C, K);
  EXPECT_LT(test::rel_diff(rows(whole, L1, L), y2), 1e-15);
  causal_conv1d_forward(x2.data(), static_cast<const double*>(nullptr), w.data(), b.data(),
                        cold.data(), B, L2, C, K);
  EXPECT_GT(test::rel_diff(rows(whole, L1, L), cold), 1e-3);  // the prefix mattered
}

// The forward keeps its window's last K - 1 inputs as the next window's prefix: windows of 5, 1,
// 2 and 5 steps (two shorter than K - 1, whose prefix is partly the one before), each continuing
// from the `last` of the one before, are the whole sequence; the first window's prefix is zeros.
CPU_TEST(CausalConv1d, LastInputsContinueTheSequence) {
  std::mt19937_64 rng(6);
  const int B = 2, C = 19, K = 4;
  const int lengths[] = {5, 1, 2, 5};
  int L = 0;
  for (int n : lengths) L += n;
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  const auto whole = ref_conv(x, w, b, B, L, C, K);
  std::vector<double> prefix, last(size_t(B) * (K - 1) * C, -7.0);
  int t0 = 0;
  for (int n : lengths) {
    std::vector<double> xw, yw(size_t(B) * n * C), want;
    for (int bb = 0; bb < B; ++bb) {
      xw.insert(xw.end(), x.begin() + (size_t(bb) * L + t0) * C,
                x.begin() + (size_t(bb) * L + t0 + n) * C);
      want.insert(want.end(), whole.begin() + (size_t(bb) * L + t0) * C,
                  whole.begin() + (size_t(bb) * L + t0 + n) * C);
    }
    causal_conv1d_forward(xw.data(), prefix.empty() ? nullptr : prefix.data(), w.data(), b.data(),
                          yw.data(), B, n, C, K, last.data());
    EXPECT_LT(test::rel_diff(want, yw), 1e-15) << "window at " << t0;
    prefix = last;
    t0 += n;
  }
  // The last window's last inputs are the sequence's, bit for bit.
  for (int bb = 0; bb < B; ++bb)
    for (int j = 0; j < K - 1; ++j)
      for (int c = 0; c < C; ++c)
        ASSERT_EQ(last[(size_t(bb) * (K - 1) + j) * C + c],
                  x[(size_t(bb) * L + L - (K - 1) + j) * C + c]);
}

// The weight gradient takes the prefix's terms; no gradient flows into the prefix.
CPU_TEST(CausalConv1d, GradCheckWithPrefix) {
  std::mt19937_64 rng(5);
  const int B = 2, L = 6, C = 20, K = 4;
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  const auto prefix = rand_vec(size_t(B) * (K - 1) * C, rng);
  auto g = rand_vec(x.size(), rng);
  auto loss = [&] {
    std::vector<double> y(x.size());
    causal_conv1d_forward(x.data(), prefix.data(), w.data(), b.data(), y.data(), B, L, C, K);
    return test::dot(g, y);
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  causal_conv1d_backward(x.data(), prefix.data(), w.data(), g.data(), dx.data(), dw.data(),
                         db.data(), B, L, C, K);
  test::check_gradient("x", loss, x, dx);
  test::check_gradient("weight", loss, w, dw);
  test::check_gradient("bias", loss, b, db);
}

CPU_TEST(CausalConv1d, GradCheckAccumulationFloat) {
  std::mt19937_64 rng(2);
  const int B = 2, L = 9, C = 20, K = 4;
  auto x = rand_vec(size_t(B) * L * C, rng), w = rand_vec(C * K, rng), b = rand_vec(C, rng);
  auto g = rand_vec(x.size(), rng);
  auto loss = [&] {
    std::vector<double> y(x.size());
    causal_conv1d_forward(x.data(), static_cast<const double*>(nullptr), w.data(), b.data(),
                          y.data(), B, L, C, K);
    return test::dot(g, y);
  };
  std::vector<double> dx(x.size()), dw(w.size(), 0.0), db(b.size(), 0.0);
  causal_conv1d_backward(x.data(), static_cast<const double*>(nullptr), w.data(), g.data(),
                         dx.data(), dw.data(), db.data(), B, L, C, K);
  test::check_gradient("x", loss, x, dx);
  test::check_gradient("weight", loss, w, dw);
  test::check_gradient("bias", loss, b, db);
  auto dx1 = dx, dw1 = dw, db1 = db;
  causal_conv1d_backward(x.data(), static_cast<const double*>(nullptr), w.data(), g.data(),
                         dx.data(), dw.data(), db.data(), B, L, C, K);
  EXPECT_EQ(dx, dx1);
  EXPECT_DOUBLED(dw, dw1);
  EXPECT_DOUBLED(db, db1);
  auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b), gf = cast<float>(g);
  std::vector<float> yf(x.size()), dxf(x.size()), dwf(w.size(), 0.0f), dbf(C, 0.0f);
  const float* nf = nullptr;
  causal_conv1d_forward(xf.data(), nf, wf.data(), bf.data(), yf.data(), B, L, C, K);
  causal_conv1d_backward(xf.data(), nf, wf.data(), gf.data(), dxf.data(), dwf.data(), dbf.data(), B,
                         L, C, K);
  EXPECT_LT(test::rel_diff(ref_conv(x, w, b, B, L, C, K), yf), 1e-5);
  EXPECT_LT(test::rel_diff(dx1, dxf), 1e-5);
  EXPECT_LT(test::rel_diff(dw1, dwf), 1e-5);
}

CPU_TEST(CausalConv1d, ShortSequenceAndParallelEqualsSerial) {
  std::mt19937_64 rng(3);
  const int B = 8, L = 2, C = 300, K = 4;  // L < K - 1: only part of the window is in range
  auto x = cast<float>(rand_vec(size_t(B) * L * C, rng));
  auto w = cast<float>(rand_vec(C * K, rng)), g = cast<float>(rand_vec(x.size(), rng));
  auto run = [&] {
    std::vector<float> y(x.size()), dx(x.size()), dw(w.size(), 0.0f);
    const float* none = nullptr;
    causal_conv1d_forward(x.data(), none, w.data(), none, y.data(), B, L, C, K);
    causal_conv1d_backward(x.data(), none, w.data(), g.data(), dx.data(), dw.data(),
                           static_cast<float*>(nullptr), B, L, C, K);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  const auto par = run();
  tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  EXPECT_EQ(par, run());
  std::vector<double> zero(C, 0.0);
  auto yref = ref_conv(cast<double>(std::vector<double>(x.begin(), x.end())),
                       std::vector<double>(w.begin(), w.end()), zero, B, L, C, K);
  EXPECT_LT(test::rel_diff(yref, std::vector<float>(par.begin(), par.begin() + x.size())), 1e-6);
}

}  // namespace
}  // namespace slipstream::kernels

namespace slipstream::kernels {
namespace {

// The step frame after frame against the forward over the same frames (B 2, L 9, K 1, 2, 4), to
// `tol` relative: double; float (its channel loops vectorised, the vector SiLU of the CPU's
// level) over channels past a vector's width with a tail.
template <class T>
void check_step_equals_forward(int C, double tol, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int K : {1, 2, 4}) {
    const int B = 2, L = 9;
    const auto x = cast<T>(test::rand_vec(size_t(B) * L * C, rng));
    const auto w = cast<T>(test::rand_vec(size_t(C) * K, rng));
    const auto b = cast<T>(test::rand_vec(C, rng));
    std::vector<T> y(x.size());
    causal_conv1d_forward(x.data(), static_cast<const T*>(nullptr), w.data(), b.data(), y.data(), B,
                          L, C, K);
    silu_forward(y.data(), y.data(), y.size());
    std::vector<T> state(size_t(B) * (K - 1) * C + 1, T(0));
    for (int t = 0; t < L; ++t) {
      std::vector<T> xt, yt(size_t(B) * C);
      for (int bb = 0; bb < B; ++bb)
        for (int c = 0; c < C; ++c) xt.push_back(x[(size_t(bb) * L + t) * C + c]);
      causal_conv1d_step(state.data(), xt.data(), w.data(), b.data(), yt.data(), B, C, K, true);
      for (int bb = 0; bb < B; ++bb)
        for (int c = 0; c < C; ++c) {
          const double want = y[(size_t(bb) * L + t) * C + c];
          ASSERT_NEAR(yt[size_t(bb) * C + c], want, tol * (1.0 + std::abs(want)))
              << "K " << K << " t " << t << " row " << bb << " channel " << c;
        }
    }
  }
}

CPU_TEST(CausalConv1d, StepEqualsForward) {
  check_step_equals_forward<double>(7, 1e-12, 78);
}

CPU_TEST(CausalConv1d, FloatStepEqualsForward) {
  check_step_equals_forward<float>(37, 1e-6, 79);
}

}  // namespace
}  // namespace slipstream::kernels
#endif  // SLIPSTREAM_REFERENCE_TESTS

// ---- The CUDA kernels against the reference ----

namespace slipstream::kernels::test {

struct ConvShape {
  int B, L, C, K;
  bool silu = true, bias = true;
  bool prefix = false;  // the inputs before the window given (a window that continues another)
};

inline std::string describe(const ConvShape& s) {
  return "B" + std::to_string(s.B) + " L" + std::to_string(s.L) + " C" + std::to_string(s.C) +
         " K" + std::to_string(s.K) + (s.silu ? " silu" : "") + (s.bias ? " bias" : "") +
         (s.prefix ? " prefix" : "");
}

template <class T>
struct ConvData {
  std::vector<double> x, w, bias, dy, prefix;
  ConvData(const ConvShape& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const size_t n = size_t(s.B) * s.L * s.C;
    x = round_trip<T>(rand_vec(n, rng));
    w = round_trip<float>(rand_vec(size_t(s.C) * s.K, rng));
    if (s.bias) bias = round_trip<float>(rand_vec(size_t(s.C), rng));
    dy = round_trip<T>(rand_vec(n, rng));
    if (s.prefix) prefix = round_trip<T>(rand_vec(size_t(s.B) * (s.K - 1) * s.C, rng));
  }
  const double* b() const { return bias.empty() ? nullptr : bias.data(); }
  const double* pre() const { return prefix.empty() ? nullptr : prefix.data(); }
  template <class Mem>
  const T* pre_on(Mem& mem) const {
    return prefix.empty() ? nullptr : mem.upload(elems<T>(prefix));
  }
  // x on the device, rows `ld` apart with NaN between them (0: packed): a read past a row's C
  // channels poisons the results.
  template <class Mem>
  const T* x_on(Mem& mem, const ConvShape& s, int ld) const {
    if (ld == 0) return mem.upload(elems<T>(x));
    return mem.upload(elems<T>(nan_between_rows(x, size_t(s.B) * s.L, size_t(s.C), size_t(ld))));
  }
};

template <class Kernels, class Mem, class T>
void check_conv_forward(const ConvShape& s, uint64_t seed, int x_ld = 0) {
  SCOPED_TRACE(describe(s) + (x_ld ? " x_ld " + std::to_string(x_ld) : ""));
  const ConvData<T> d(s, seed);
  const size_t n = size_t(s.B) * s.L * s.C;
  const size_t nl = size_t(s.B) * (s.K - 1) * s.C;
  std::vector<double> ref(n), ref_last(nl);
  causal_conv1d_forward<double>(d.x.data(), d.pre(), d.w.data(), d.b(), ref.data(), s.B, s.L, s.C,
                                s.K, ref_last.data());
  if (s.silu) silu_forward(ref.data(), ref.data(), n);
  Mem mem;
  T* y = mem.template alloc<T>(n);
  bfloat16* ybf = mem.template alloc<bfloat16>(n);
  T* last = mem.template alloc<T>(nl);
  Kernels::template causal_conv1d_forward<T>(
      d.x_on(mem, s, x_ld), d.pre_on(mem), mem.upload(elems<float>(d.w)),
      d.bias.empty() ? nullptr : mem.upload(elems<float>(d.bias)), y, ybf, s.B, s.L, s.C, s.K,
      s.silu, mem.stream(), x_ld, last);
  mem.sync();
  const std::vector<T> y_dev = mem.download(y, n);
  EXPECT_CLOSE(values(y_dev), ref, tolerance<T>(), "y");
  // The window's last inputs (the next window's prefix) are copies: the reference's bits.
  const std::vector<double> last_dev = values(mem.download(last, nl));
  for (size_t i = 0; i < nl; ++i) ASSERT_EQ(last_dev[i], ref_last[i]) << "last[" << i << "]";
  // The bf16 copy is y rounded as the cast rounds it, bit for bit.
  const std::vector<bfloat16> y_bf = mem.download(ybf, n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(y_bf[i].bits, fp32_to_bf16(float(value(y_dev[i])))) << "y_bf[" << i << "]";
}

template <class Kernels, class Mem, class T>
void check_conv_backward(const ConvShape& s, uint64_t seed, int x_ld = 0) {
  SCOPED_TRACE(describe(s) + (x_ld ? " x_ld " + std::to_string(x_ld) : ""));
  const ConvData<T> d(s, seed);
  const size_t n = size_t(s.B) * s.L * s.C, ck = size_t(s.C) * s.K;
  std::mt19937_64 rng(seed ^ 0xc0);
  const std::vector<double> dw0 = round_trip<float>(rand_vec(ck, rng));
  const std::vector<double> db0 = round_trip<float>(rand_vec(size_t(s.C), rng));
  std::vector<double> dpre = d.dy, dx(n), dw = dw0, db = db0;
  if (s.silu) {
    std::vector<double> pre(n);
    causal_conv1d_forward<double>(d.x.data(), d.pre(), d.w.data(), d.b(), pre.data(), s.B, s.L, s.C,
                                  s.K);
    silu_backward(pre.data(), d.dy.data(), dpre.data(), n);
  }
  causal_conv1d_backward<double>(d.x.data(), d.pre(), d.w.data(), dpre.data(), dx.data(), dw.data(),
                                 s.bias ? db.data() : nullptr, s.B, s.L, s.C, s.K);
  Mem mem;
  // With x_ld, dx and its bf16 copy are written into rows x_ld apart, like x's.
  const size_t rows = size_t(s.B) * s.L, wide = x_ld ? rows * size_t(x_ld) : n;
  T* g_dx = mem.template alloc<T>(wide);
  bfloat16* g_dxbf = mem.template alloc<bfloat16>(wide);
  float* g_dw = mem.upload(elems<float>(dw0));
  float* g_db = mem.upload(elems<float>(db0));
  void* ws =
      mem.alloc_bytes(Kernels::causal_conv1d_backward_workspace_bytes(s.B, s.L, s.C, s.K, s.silu));
  Kernels::template causal_conv1d_backward<T>(
      d.x_on(mem, s, x_ld), d.pre_on(mem), mem.upload(elems<float>(d.w)),
      d.bias.empty() ? nullptr : mem.upload(elems<float>(d.bias)), mem.upload(elems<T>(d.dy)), g_dx,
      g_dxbf, g_dw, s.bias ? g_db : nullptr, ws, s.B, s.L, s.C, s.K, s.silu, mem.stream(), x_ld);
  mem.sync();
  const std::vector<T> dx_dev = packed_rows(mem, g_dx, rows, size_t(s.C), x_ld);
  EXPECT_CLOSE(values(dx_dev), dx, tolerance<T>(), "dx");
  // The bf16 copy is dx rounded as the cast rounds it, bit for bit.
  const std::vector<bfloat16> dxbf = packed_rows(mem, g_dxbf, rows, size_t(s.C), x_ld);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(dxbf[i].bits, fp32_to_bf16(float(value(dx_dev[i])))) << "dx_bf[" << i << "]";
  }
  EXPECT_CLOSE(values(mem.download(g_dw, ck)), dw, 1e-5, "dweight (+=)");
  EXPECT_CLOSE(values(mem.download(g_db, size_t(s.C))), db, 1e-5, "dbias (+=)");
  // The copy alone (dx null, as the bf16 model on a device asks): the same bits; neither is
  // refused.
  bfloat16* g_dxbf_only = mem.template alloc<bfloat16>(wide);
  const float* g_w = mem.upload(elems<float>(d.w));
  const float* g_b = d.bias.empty() ? nullptr : mem.upload(elems<float>(d.bias));
  const T* g_dy = mem.upload(elems<T>(d.dy));
  auto again = [&](bfloat16* dx_bf) {
    Kernels::template causal_conv1d_backward<T>(d.x_on(mem, s, x_ld), d.pre_on(mem), g_w, g_b, g_dy,
                                                nullptr, dx_bf, g_dw, s.bias ? g_db : nullptr, ws,
                                                s.B, s.L, s.C, s.K, s.silu, mem.stream(), x_ld);
  };
  again(g_dxbf_only);
  mem.sync();
  const std::vector<bfloat16> dxbf_only = packed_rows(mem, g_dxbf_only, rows, size_t(s.C), x_ld);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(dxbf_only[i].bits, dxbf[i].bits) << "dx_bf alone, " << i;
  EXPECT_THROW(again(nullptr), std::invalid_argument);
}

template <class Kernels, class Mem, class T>
void check_conv_step(const ConvShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const ConvData<T> d(s, seed);
  const size_t n = size_t(s.B) * s.L * s.C, bc = size_t(s.B) * s.C;
  std::vector<double> ref(n);
  causal_conv1d_forward<double>(d.x.data(), d.pre(), d.w.data(), d.b(), ref.data(), s.B, s.L, s.C,
                                s.K);
  if (s.silu) silu_forward(ref.data(), ref.data(), n);
  Mem mem;
  std::vector<double> state0 = d.prefix;  // the step's state is the prefix's layout
  state0.resize(size_t(s.B) * (s.K - 1) * s.C + 1, 0.0);
  T* state = mem.upload(elems<T>(state0));
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
      // Continuing windows: the generic and the sliding-window kernels, L below K - 1.
      {2, 37, 40, 4, true, true, true},
      {1, 21, 19, 5, false, true, true},
      {3, 2, 33, 3, true, false, true},
  };
}

}  // namespace slipstream::kernels::test

namespace slipstream::kernels::test {
namespace {

KERNEL_TEST(Conv, ForwardMatchesCpu) {
  uint64_t seed = 101;
  for (const auto& s : conv_shapes()) {
    check_conv_forward<Kernels, Mem, float>(s, seed++);
    check_conv_forward<Kernels, Mem, bfloat16>(s, seed++);
  }
}
KERNEL_TEST(Conv, BackwardMatchesCpu) {
  uint64_t seed = 111;
  for (const auto& s : conv_shapes()) {
    check_conv_backward<Kernels, Mem, float>(s, seed++);
    check_conv_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
}
// x read from, and dx with its bf16 copy written to, rows x_ld apart (the model's x beside z in
// in_proj's output, and their gradients): NaN between x's rows, nothing written between dx's.
KERNEL_TEST(Conv, ReadsXAndWritesDxInWiderRows) {
  uint64_t seed = 141;
  for (const auto& s : conv_shapes()) {
    check_conv_forward<Kernels, Mem, float>(s, seed++, 2 * s.C);
    check_conv_backward<Kernels, Mem, float>(s, seed++, 2 * s.C + 3);
    check_conv_backward<Kernels, Mem, bfloat16>(s, seed++, 2 * s.C);
  }
}
KERNEL_TEST(Conv, StepEqualsForward) {
  uint64_t seed = 121;
  for (const auto& s : conv_shapes()) check_conv_step<Kernels, Mem, float>(s, seed++);
}
DEVICE_TEST(Conv, GpuStandardShape) {
  check_conv_backward<Kernels, Mem, float>({256, 60, 256, 4}, 131);
}

}  // namespace
}  // namespace slipstream::kernels::test
