// The GRU layer (kernels/gru.h): the reference against nn.GRU's equations and float64 finite
// differences; the CUDA layer, fp32 and its bf16 form, against the reference on the emulator and
// on a device (tests/kernel_ops/kernel_test.h).

#include <cmath>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/gru.h"
#include "tests/kernel_ops/kernel_test.h"

// ---- The CPU reference ----

#if SLIPSTREAM_REFERENCE_TESTS
namespace slipstream::kernels {
namespace {
using test::cast;
using test::rand_vec;

struct Gru {
  int B, L, In, H;
  bool use_h0, use_bias;
  std::vector<double> x, h0, wih, whh, bih, bhh;
  Gru(int B_, int L_, int In_, int H_, bool h0_, bool bias_, uint64_t seed)
      : B(B_), L(L_), In(In_), H(H_), use_h0(h0_), use_bias(bias_) {
    std::mt19937_64 rng(seed);
    x = rand_vec(size_t(B) * L * In, rng);
    h0 = rand_vec(size_t(B) * H, rng);
    wih = rand_vec(size_t(3) * H * In, rng, 0.05, 0.6);
    whh = rand_vec(size_t(3) * H * H, rng, 0.05, 0.6);
    bih = rand_vec(3 * H, rng);
    bhh = rand_vec(3 * H, rng);
  }
  template <class T>
  std::vector<T> forward(const std::vector<T>& x_, const std::vector<T>& h0_,
                         const std::vector<T>& wih_, const std::vector<T>& whh_,
                         const std::vector<T>& bih_, const std::vector<T>& bhh_,
                         std::vector<T>* saved = nullptr) const {
    std::vector<T> y(size_t(B) * L * H), ws(gru_forward_workspace_elems(B, L, H));
    if (saved) saved->assign(gru_saved_elems(B, L, H), T(0));
    gru_forward<T>(x_.data(), use_h0 ? h0_.data() : nullptr, wih_.data(), whh_.data(),
                   use_bias ? bih_.data() : nullptr, use_bias ? bhh_.data() : nullptr, y.data(),
                   saved ? saved->data() : nullptr, ws.data(), B, L, In, H);
    return y;
  }
  std::vector<double> forward() const { return forward(x, h0, wih, whh, bih, bhh); }
};

// torch.nn.GRU equations, one step at a time.
std::vector<double> reference(const Gru& g) {
  const int H = g.H, In = g.In;
  std::vector<double> y(size_t(g.B) * g.L * H);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (int b = 0; b < g.B; ++b) {
    std::vector<double> h(H, 0.0);
    if (g.use_h0) h.assign(g.h0.begin() + b * H, g.h0.begin() + (b + 1) * H);
    for (int t = 0; t < g.L; ++t) {
      const double* xt = &g.x[(size_t(b) * g.L + t) * In];
      auto gate = [&](int k, int j, bool input) {
        double s = g.use_bias ? (input ? g.bih : g.bhh)[k * H + j] : 0.0;
        if (input) {
          for (int i = 0; i < In; ++i) s += g.wih[(k * H + j) * In + i] * xt[i];
        } else {
          for (int i = 0; i < H; ++i) s += g.whh[(k * H + j) * H + i] * h[i];
        }
        return s;
      };
      std::vector<double> hn(H);
      for (int j = 0; j < H; ++j) {
        const double r = sig(gate(0, j, true) + gate(0, j, false));
        const double z = sig(gate(1, j, true) + gate(1, j, false));
        const double n = std::tanh(gate(2, j, true) + r * gate(2, j, false));
        hn[j] = (1 - z) * n + z * h[j];
      }
      h = hn;
      std::copy(h.begin(), h.end(), y.begin() + (size_t(b) * g.L + t) * H);
    }
  }
  return y;
}

void run_gradcheck(Gru& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto w = rand_vec(size_t(g.B) * g.L * g.H, rng);
  const auto wlast = rand_vec(size_t(g.B) * g.H, rng);  // extra gradient on h_n
  auto loss = [&] {
    const auto y = g.forward();
    double s = test::dot(w, y);
    for (int b = 0; b < g.B; ++b)
      for (int j = 0; j < g.H; ++j)
        s += wlast[b * g.H + j] * y[(size_t(b) * g.L + g.L - 1) * g.H + j];
    return s;
  };
  EXPECT_LT(test::rel_diff(reference(g), g.forward()), 1e-14);
  std::vector<double> saved;
  const auto y = g.forward(g.x, g.h0, g.wih, g.whh, g.bih, g.bhh, &saved);
  std::vector<double> dx(g.x.size(), 5.0), dh0(g.h0.size(), 5.0), dwih(g.wih.size(), 0.0),
      dwhh(g.whh.size(), 0.0), dbih(g.bih.size(), 0.0), dbhh(g.bhh.size(), 0.0),
      ws(gru_backward_workspace_elems(g.B, g.L, g.H), -3.0);
  auto bwd = [&] {
    gru_backward<double>(g.x.data(), g.use_h0 ? g.h0.data() : nullptr, g.wih.data(), g.whh.data(),
                         y.data(), saved.data(), w.data(), wlast.data(), dx.data(),
                         g.use_h0 ? dh0.data() : nullptr, dwih.data(), dwhh.data(),
                         g.use_bias ? dbih.data() : nullptr, g.use_bias ? dbhh.data() : nullptr,
                         ws.data(), g.B, g.L, g.In, g.H);
  };
  bwd();
  test::check_gradient("x", loss, g.x, dx);
  if (g.use_h0) test::check_gradient("h0", loss, g.h0, dh0);
  test::check_gradient("weight_ih", loss, g.wih, dwih);
  test::check_gradient("weight_hh", loss, g.whh, dwhh);
  if (g.use_bias) {
    test::check_gradient("bias_ih", loss, g.bih, dbih);
    test::check_gradient("bias_hh", loss, g.bhh, dbhh);
  }
  const auto dx1 = dx, dh01 = dh0, dwih1 = dwih, dwhh1 = dwhh, dbih1 = dbih, dbhh1 = dbhh;
  bwd();
  EXPECT_EQ(dx, dx1);
  EXPECT_EQ(dh0, dh01);
  EXPECT_DOUBLED(dwih, dwih1);
  EXPECT_DOUBLED(dwhh, dwhh1);
  EXPECT_DOUBLED(dbih, dbih1);
  EXPECT_DOUBLED(dbhh, dbhh1);

  // float against double
  std::vector<float> savedf;
  auto xf = cast<float>(g.x), h0f = cast<float>(g.h0), wihf = cast<float>(g.wih),
       whhf = cast<float>(g.whh), bihf = cast<float>(g.bih), bhhf = cast<float>(g.bhh),
       wf = cast<float>(w), wlf = cast<float>(wlast);
  const auto yf = g.forward(xf, h0f, wihf, whhf, bihf, bhhf, &savedf);
  EXPECT_LT(test::rel_diff(y, yf), 1e-5);
  std::vector<float> dxf(xf.size()), dh0f(h0f.size()), dwihf(wihf.size(), 0.0f),
      dwhhf(whhf.size(), 0.0f), dbihf(bihf.size(), 0.0f), dbhhf(bhhf.size(), 0.0f),
      wsf(gru_backward_workspace_elems(g.B, g.L, g.H));
  gru_backward<float>(xf.data(), g.use_h0 ? h0f.data() : nullptr, wihf.data(), whhf.data(),
                      yf.data(), savedf.data(), wf.data(), wlf.data(), dxf.data(),
                      g.use_h0 ? dh0f.data() : nullptr, dwihf.data(), dwhhf.data(),
                      g.use_bias ? dbihf.data() : nullptr, g.use_bias ? dbhhf.data() : nullptr,
                      wsf.data(), g.B, g.L, g.In, g.H);
  EXPECT_LT(test::rel_diff(dx1, dxf), 1e-5);
  EXPECT_LT(test::rel_diff(dwih1, dwihf), 1e-5);
  EXPECT_LT(test::rel_diff(dwhh1, dwhhf), 1e-5);
  if (g.use_h0) {
    EXPECT_LT(test::rel_diff(dh01, dh0f), 1e-5);
  }
}

CPU_TEST(Gru, GradCheckWithH0AndBias) {
  Gru g(3, 7, 4, 5, true, true, 1);
  run_gradcheck(g, 2);
}

CPU_TEST(Gru, GradCheckZeroStateNoBias) {
  Gru g(2, 6, 3, 4, false, false, 3);
  run_gradcheck(g, 4);
}

double bf16_round(double v) {
  return bf16_to_fp32(fp32_to_bf16(float(v)));
}

// The bf16 form's forward in float64: torch.nn.GRU's equations with each product's operands
// rounded to bf16 — x and the weights, and every state (the initial one included) before W_hh
// multiplies it — and nothing else.
std::vector<double> reference_bf16(const Gru& g) {
  Gru r = g;
  for (auto* v : {&r.x, &r.wih, &r.whh})
    for (double& e : *v) e = bf16_round(e);
  const int H = g.H, In = g.In, G = 3 * H;
  std::vector<double> y(size_t(g.B) * g.L * H);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (int b = 0; b < g.B; ++b) {
    std::vector<double> h(H, 0.0), hr(H, 0.0);
    for (int j = 0; j < H && g.use_h0; ++j) {
      h[j] = float(g.h0[size_t(b) * H + j]);
      hr[j] = bf16_round(h[j]);
    }
    for (int t = 0; t < g.L; ++t) {
      const double* xt = &r.x[(size_t(b) * g.L + t) * In];
      std::vector<double> gi(G), gh(G);
      for (int k = 0; k < G; ++k) {
        gi[k] = g.use_bias ? g.bih[k] : 0.0;
        gh[k] = g.use_bias ? g.bhh[k] : 0.0;
        for (int i = 0; i < In; ++i) gi[k] += r.wih[size_t(k) * In + i] * xt[i];
        for (int i = 0; i < H; ++i) gh[k] += r.whh[size_t(k) * H + i] * hr[i];
      }
      for (int j = 0; j < H; ++j) {
        const double rg = sig(gi[j] + gh[j]), z = sig(gi[H + j] + gh[H + j]);
        const double n = std::tanh(gi[2 * H + j] + rg * gh[2 * H + j]);
        h[j] = (1 - z) * n + z * h[j];
        // The kernel rounds the FP32 state it stored.
        hr[j] = bf16_round(float(h[j]));
      }
      std::copy(h.begin(), h.end(), y.begin() + (size_t(b) * g.L + t) * H);
    }
  }
  return y;
}

// The bf16 form (precision bf16) rounds each product's operands and nothing else: its forward
// matches the float64 equations with that rounding to fp32 precision, and is visibly not the
// FP32 layer; its backward stays within bf16 precision of the FP32 backward, from a zero or a
// given initial state. The CUDA form is checked against this one (check_gru_bf16, below).
void check_bf16_form_rounding(bool use_h0, uint64_t seed) {
  SCOPED_TRACE(use_h0 ? "from h0" : "from zero");
  Gru g(3, 9, 6, 5, use_h0, true, seed);
  // Weights of nn.GRU's scale keep the recurrence from amplifying the rounding.
  for (double& w : g.wih) w /= 2;
  for (double& w : g.whh) w /= 2;
  const auto xf = cast<float>(g.x), wihf = cast<float>(g.wih), whhf = cast<float>(g.whh),
             bihf = cast<float>(g.bih), bhhf = cast<float>(g.bhh), h0f = cast<float>(g.h0);
  const float* h0 = use_h0 ? h0f.data() : nullptr;
  std::vector<uint16_t> wih_bf(wihf.size()), whh_bf(whhf.size());
  fp32_to_bf16(wihf.data(), wih_bf.data(), wihf.size());
  fp32_to_bf16(whhf.data(), whh_bf.data(), whhf.size());
  std::vector<uint8_t> bws(gru_bf16_workspace_bytes(g.B, g.L, g.In, g.H));
  const GruBf16 bf{wih_bf.data(), whh_bf.data(), bws.data()};
  const size_t M = size_t(g.B) * g.L, G = 3 * size_t(g.H);

  std::vector<float> y16(M * g.H), saved16(gru_saved_elems(g.B, g.L, g.H)),
      fws(gru_forward_workspace_elems(g.B, g.L, g.H));
  gru_forward<float>(xf.data(), h0, nullptr, nullptr, bihf.data(), bhhf.data(), y16.data(),
                     saved16.data(), fws.data(), g.B, g.L, g.In, g.H, &bf);
  std::vector<float> saved32;
  const auto y32 = g.forward(xf, h0f, wihf, whhf, bihf, bhhf, &saved32);
  EXPECT_LT(test::rel_diff(reference_bf16(g), y16), 1e-5);
  EXPECT_GT(test::rel_diff(std::vector<double>(y32.begin(), y32.end()), y16), 1e-4);
  EXPECT_LT(test::rel_diff(std::vector<double>(y32.begin(), y32.end()), y16), 2e-2);

  std::mt19937_64 rng(22);
  const auto dy = cast<float>(rand_vec(M * g.H, rng));
  struct Grads {
    std::vector<float> dx, dwih, dwhh, dbih, dbhh;
  };
  auto backward = [&](const std::vector<float>& y, const std::vector<float>& saved,
                      const GruBf16* form) {
    Grads d{std::vector<float>(M * g.In), std::vector<float>(G * g.In, 0.5f),
            std::vector<float>(G * g.H, 0.5f), std::vector<float>(G, 0.5f),
            std::vector<float>(G, 0.5f)};
    std::vector<float> ws(gru_backward_workspace_elems(g.B, g.L, g.H));
    gru_backward<float>(xf.data(), h0, wihf.data(), whhf.data(), y.data(), saved.data(), dy.data(),
                        nullptr, d.dx.data(), nullptr, d.dwih.data(), d.dwhh.data(), d.dbih.data(),
                        d.dbhh.data(), ws.data(), g.B, g.L, g.In, g.H, form);
    return d;
  };
  const Grads d32 = backward(y32, saved32, nullptr), d16 = backward(y16, saved16, &bf);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    const double e = test::rel_diff(std::vector<double>(a.begin(), a.end()), b);
    EXPECT_LT(e, 3e-2) << what;
    EXPECT_GT(e, 1e-5) << what;  // the bf16 form ran
  };
  close(d32.dx, d16.dx, "dx");
  close(d32.dwih, d16.dwih, "dw_ih");
  close(d32.dwhh, d16.dwhh, "dw_hh");
  close(d32.dbih, d16.dbih, "db_ih");
  close(d32.dbhh, d16.dbhh, "db_hh");

  // The bf16 form is float's.
  std::vector<double> yd(M * g.H), fwsd(gru_forward_workspace_elems(g.B, g.L, g.H));
  EXPECT_THROW(
      gru_forward<double>(g.x.data(), nullptr, g.wih.data(), g.whh.data(), nullptr, nullptr,
                          yd.data(), nullptr, fwsd.data(), g.B, g.L, g.In, g.H, &bf),
      std::invalid_argument);
}

CPU_TEST(Gru, Bf16FormRoundsEachProductsOperands) {
  check_bf16_form_rounding(false, 21);
  check_bf16_form_rounding(true, 23);
}

CPU_TEST(Gru, LargerBatchParallelGates) {
  // Big enough that the gate passes run as TBB tasks; still checked against the reference.
  Gru g(64, 5, 16, 48, true, true, 5);
  EXPECT_LT(test::rel_diff(reference(g), g.forward()), 1e-13);
}

}  // namespace
}  // namespace slipstream::kernels
#endif  // SLIPSTREAM_REFERENCE_TESTS

// ---- The CUDA kernels against the reference ----

namespace slipstream::kernels::test {

struct GruShape {
  int B, L, In, H;
};

inline std::string describe(const GruShape& s) {
  return "B" + std::to_string(s.B) + " L" + std::to_string(s.L) + " In" + std::to_string(s.In) +
         " H" + std::to_string(s.H);
}

// One step, odd sizes (not multiples of a warp or of the 256-thread block), a row of more than
// one block, and a longer sequence.
inline std::vector<GruShape> gru_shapes() {
  return {{1, 1, 3, 2}, {3, 5, 7, 4}, {2, 13, 6, 9}, {5, 4, 4, 70}, {2, 31, 5, 8}};
}

// Weights at nn.GRU's scale (1/sqrt(fan-in)): with magnitudes near 1 a wide layer's recurrence
// is chaotic, and over tens of steps float32 rounding alone moves it away from the float64
// reference.
struct GruData {
  std::vector<double> x, w_ih, w_hh, b_ih, b_hh, dy, h0;
  GruData(const GruShape& s, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const size_t G = 3 * size_t(s.H), M = size_t(s.B) * s.L;
    const auto scaled = [&rng](size_t n, int fan_in) {
      auto v = rand_vec(n, rng);
      for (double& e : v) e /= std::sqrt(double(fan_in));
      return round_trip<float>(v);
    };
    x = round_trip<float>(rand_vec(M * s.In, rng));
    w_ih = scaled(G * s.In, s.In);
    w_hh = scaled(G * s.H, s.H);
    b_ih = round_trip<float>(rand_vec(G, rng));
    b_hh = round_trip<float>(rand_vec(G, rng));
    dy = round_trip<float>(rand_vec(M * s.H, rng));
    h0 = round_trip<float>(rand_vec(size_t(s.B) * s.H, rng));
  }
};

// with_h0: from a given initial state (a carried one), else from zero.
template <class Kernels, class Mem>
void check_gru(const GruShape& s, uint64_t seed, bool with_h0 = false) {
  SCOPED_TRACE(describe(s) + (with_h0 ? " from h0" : ""));
  const GruData d(s, seed);
  const double* h0 = with_h0 ? d.h0.data() : nullptr;
  const size_t G = 3 * size_t(s.H), M = size_t(s.B) * s.L;
  // The reference: forward, then backward onto non-zero parameter-gradient starts.
  std::vector<double> y(M * s.H), saved(gru_saved_elems(s.B, s.L, s.H));
  std::vector<double> fws(gru_forward_workspace_elems(s.B, s.L, s.H));
  gru_forward<double>(d.x.data(), h0, d.w_ih.data(), d.w_hh.data(), d.b_ih.data(), d.b_hh.data(),
                      y.data(), saved.data(), fws.data(), s.B, s.L, s.In, s.H);
  std::mt19937_64 rng(seed ^ 0x9e);
  const auto dw_ih0 = round_trip<float>(rand_vec(G * s.In, rng));
  const auto dw_hh0 = round_trip<float>(rand_vec(G * s.H, rng));
  const auto db_ih0 = round_trip<float>(rand_vec(G, rng));
  const auto db_hh0 = round_trip<float>(rand_vec(G, rng));
  std::vector<double> dx(M * s.In), dw_ih = dw_ih0, dw_hh = dw_hh0, db_ih = db_ih0, db_hh = db_hh0;
  std::vector<double> bws(gru_backward_workspace_elems(s.B, s.L, s.H));
  gru_backward<double>(d.x.data(), h0, d.w_ih.data(), d.w_hh.data(), y.data(), saved.data(),
                       d.dy.data(), nullptr, dx.data(), nullptr, dw_ih.data(), dw_hh.data(),
                       db_ih.data(), db_hh.data(), bws.data(), s.B, s.L, s.In, s.H);

  Mem mem;
  const float* g_h0 = with_h0 ? mem.upload(elems<float>(d.h0)) : nullptr;
  const float* x = mem.upload(elems<float>(d.x));
  const float* w_ih = mem.upload(elems<float>(d.w_ih));
  const float* w_hh = mem.upload(elems<float>(d.w_hh));
  float* g_y = mem.template alloc<float>(M * s.H);
  float* g_saved = mem.template alloc<float>(saved.size());
  Kernels::gru_forward(
      mem.gemm_context(), x, w_ih, w_hh, nullptr, nullptr, mem.upload(elems<float>(d.b_ih)),
      mem.upload(elems<float>(d.b_hh)), g_h0, g_y, g_saved,
      mem.alloc_bytes(Kernels::gru_forward_workspace_bytes(s.B, s.L, s.In, s.H, false)), s.B, s.L,
      s.In, s.H, mem.stream());
  float* g_dx = mem.template alloc<float>(M * s.In);
  float* g_dw_ih = mem.upload(elems<float>(dw_ih0));
  float* g_dw_hh = mem.upload(elems<float>(dw_hh0));
  float* g_db_ih = mem.upload(elems<float>(db_ih0));
  float* g_db_hh = mem.upload(elems<float>(db_hh0));
  Kernels::gru_backward(
      mem.gemm_context(), x, w_ih, w_hh, nullptr, nullptr, g_h0, g_y, g_saved,
      mem.upload(elems<float>(d.dy)), g_dx, g_dw_ih, g_dw_hh, g_db_ih, g_db_hh,
      mem.alloc_bytes(Kernels::gru_backward_workspace_bytes(s.B, s.L, s.In, s.H, false)), s.B, s.L,
      s.In, s.H, mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(g_y, y.size())), y, 1e-5, "y");
  EXPECT_CLOSE(values(mem.download(g_saved, saved.size())), saved, 1e-5, "saved gates");
  EXPECT_CLOSE(values(mem.download(g_dx, dx.size())), dx, 1e-5, "dx");
  EXPECT_CLOSE(values(mem.download(g_dw_ih, dw_ih.size())), dw_ih, 1e-5, "dw_ih");
  EXPECT_CLOSE(values(mem.download(g_dw_hh, dw_hh.size())), dw_hh, 1e-5, "dw_hh");
  EXPECT_CLOSE(values(mem.download(g_db_ih, db_ih.size())), db_ih, 1e-5, "db_ih");
  EXPECT_CLOSE(values(mem.download(g_db_hh, db_hh.size())), db_hh, 1e-5, "db_hh");

  // dx is optional: the weight gradients do not depend on it.
  float* g_dw_ih2 = mem.upload(elems<float>(dw_ih0));
  Kernels::gru_backward(
      mem.gemm_context(), x, w_ih, w_hh, nullptr, nullptr, g_h0, g_y, g_saved,
      mem.upload(elems<float>(d.dy)), nullptr, g_dw_ih2, mem.upload(elems<float>(dw_hh0)), nullptr,
      nullptr, mem.alloc_bytes(Kernels::gru_backward_workspace_bytes(s.B, s.L, s.In, s.H, false)),
      s.B, s.L, s.In, s.H, mem.stream());
  mem.sync();
  EXPECT_CLOSE(values(mem.download(g_dw_ih2, dw_ih.size())), dw_ih, 1e-5, "dw_ih without dx");
}

// The bf16 form: the CUDA layer and the CPU's bf16 form round the same operands, so they differ
// only by FP32 summation order (and the rare state or gradient that order tips to the
// neighbouring bf16), far less than either differs from FP32 (checked to be so wherever they
// differ at all; one step's dw_hh is its start, h_{-1} being zero). A tipped state is carried
// through the rest of the window: over 60 steps an H200's cuBLAS (split-K kernels) came to
// 2.1e-4 on dx and dw_ih, hence 5e-4, still a tenth of the gap to FP32 or less.
template <class Kernels, class Mem>
void check_gru_bf16(const GruShape& s, uint64_t seed, bool with_h0 = false) {
  SCOPED_TRACE(describe(s) + " bf16" + (with_h0 ? " from h0" : ""));
  const GruData d(s, seed);
  const auto h0 = elems<float>(d.h0);
  const float* h0p = with_h0 ? h0.data() : nullptr;
  const size_t G = 3 * size_t(s.H), M = size_t(s.B) * s.L;
  const auto x = elems<float>(d.x), w_ih = elems<float>(d.w_ih), w_hh = elems<float>(d.w_hh),
             b_ih = elems<float>(d.b_ih), b_hh = elems<float>(d.b_hh), dy = elems<float>(d.dy);
  std::vector<uint16_t> w_ih_bf(w_ih.size()), w_hh_bf(w_hh.size());
  fp32_to_bf16(w_ih.data(), w_ih_bf.data(), w_ih.size());
  fp32_to_bf16(w_hh.data(), w_hh_bf.data(), w_hh.size());
  std::mt19937_64 rng(seed ^ 0x5a);
  const auto dw_ih0 = elems<float>(rand_vec(G * s.In, rng));
  const auto dw_hh0 = elems<float>(rand_vec(G * s.H, rng));
  const auto db0 = elems<float>(rand_vec(G, rng));

  // The CPU's bf16 form, and its FP32 layer for scale.
  struct Out {
    std::vector<float> y, saved, dx, dw_ih, dw_hh, db_ih, db_hh;
  };
  auto cpu = [&](bool bf16) {
    Out o{std::vector<float>(M * s.H),
          std::vector<float>(gru_saved_elems(s.B, s.L, s.H)),
          std::vector<float>(M * s.In),
          dw_ih0,
          dw_hh0,
          db0,
          db0};
    std::vector<uint8_t> bws(gru_bf16_workspace_bytes(s.B, s.L, s.In, s.H));
    const GruBf16 form{w_ih_bf.data(), w_hh_bf.data(), bws.data()};
    std::vector<float> fws(gru_forward_workspace_elems(s.B, s.L, s.H));
    gru_forward<float>(x.data(), h0p, w_ih.data(), w_hh.data(), b_ih.data(), b_hh.data(),
                       o.y.data(), o.saved.data(), fws.data(), s.B, s.L, s.In, s.H,
                       bf16 ? &form : nullptr);
    std::vector<float> ws(gru_backward_workspace_elems(s.B, s.L, s.H));
    gru_backward<float>(x.data(), h0p, w_ih.data(), w_hh.data(), o.y.data(), o.saved.data(),
                        dy.data(), nullptr, o.dx.data(), nullptr, o.dw_ih.data(), o.dw_hh.data(),
                        o.db_ih.data(), o.db_hh.data(), ws.data(), s.B, s.L, s.In, s.H,
                        bf16 ? &form : nullptr);
    return o;
  };
  const Out ref = cpu(true), fp32 = cpu(false);

  Mem mem;
  const auto* g_wih_bf = reinterpret_cast<const bfloat16*>(mem.upload(w_ih_bf));
  const auto* g_whh_bf = reinterpret_cast<const bfloat16*>(mem.upload(w_hh_bf));
  const float* g_x = mem.upload(x);
  const float* g_h0 = with_h0 ? mem.upload(h0) : nullptr;
  float* g_y = mem.template alloc<float>(M * s.H);
  float* g_saved = mem.template alloc<float>(ref.saved.size());
  const size_t ws_bytes =
      std::max(Kernels::gru_forward_workspace_bytes(s.B, s.L, s.In, s.H, true),
               Kernels::gru_backward_workspace_bytes(s.B, s.L, s.In, s.H, true));
  void* ws = mem.alloc_bytes(ws_bytes);
  // The FP32 weights are not read by the bf16 form: null proves it.
  Kernels::gru_forward(mem.gemm_context(), g_x, nullptr, nullptr, g_wih_bf, g_whh_bf,
                       mem.upload(b_ih), mem.upload(b_hh), g_h0, g_y, g_saved, ws, s.B, s.L, s.In,
                       s.H, mem.stream());
  float* g_dx = mem.template alloc<float>(M * s.In);
  float *g_dw_ih = mem.upload(dw_ih0), *g_dw_hh = mem.upload(dw_hh0);
  float *g_db_ih = mem.upload(db0), *g_db_hh = mem.upload(db0);
  Kernels::gru_backward(mem.gemm_context(), g_x, nullptr, nullptr, g_wih_bf, g_whh_bf, g_h0, g_y,
                        g_saved, mem.upload(dy), g_dx, g_dw_ih, g_dw_hh, g_db_ih, g_db_hh, ws, s.B,
                        s.L, s.In, s.H, mem.stream());
  mem.sync();
  const auto check = [&](float* got, const std::vector<float>& want, const std::vector<float>& f32,
                         const char* what) {
    const auto w = values(want);
    const double e = rel_error(values(mem.download(got, want.size())), w);
    const double gap = rel_error(values(f32), w);
    EXPECT_LT(e, 5e-4) << what << ": relative error " << e;
    if (e > 0) {
      EXPECT_GT(gap, 10 * e) << what << ": the bf16 form differs from FP32 by " << gap;
    }
  };
  // The outputs show the rounding (one step from a zero state included: x and W_ih are rounded).
  EXPECT_GT(rel_error(values(fp32.y), values(ref.y)), 0.0);
  check(g_y, ref.y, fp32.y, "y");
  check(g_saved, ref.saved, fp32.saved, "saved gates");
  check(g_dx, ref.dx, fp32.dx, "dx");
  check(g_dw_ih, ref.dw_ih, fp32.dw_ih, "dw_ih");
  check(g_dw_hh, ref.dw_hh, fp32.dw_hh, "dw_hh");
  check(g_db_ih, ref.db_ih, fp32.db_ih, "db_ih");
  check(g_db_hh, ref.db_hh, fp32.db_hh, "db_hh");
}

}  // namespace slipstream::kernels::test

namespace slipstream::kernels::test {
namespace {

KERNEL_TEST(Gru, LayerMatchesCpu) {
  uint64_t seed = 501;
  for (const auto& s : gru_shapes()) check_gru<Kernels, Mem>(s, seed++);
  check_gru<Kernels, Mem>({4, 60, 128, 128}, 511);  // gpu_standard's width and window, fewer rows
}
KERNEL_TEST(Gru, Bf16FormMatchesCpu) {
  uint64_t seed = 521;
  for (const auto& s : gru_shapes()) check_gru_bf16<Kernels, Mem>(s, seed++);
  check_gru_bf16<Kernels, Mem>({4, 60, 128, 128}, 531);
}
// From a given initial state (a carried one): the first step's recurrent GEMM, the gates and
// the backward's previous states read h0.
KERNEL_TEST(Gru, FromInitialStateMatchesCpu) {
  uint64_t seed = 541;
  for (const auto& s : gru_shapes()) {
    check_gru<Kernels, Mem>(s, seed, true);
    check_gru_bf16<Kernels, Mem>(s, seed++, true);
  }
}
DEVICE_TEST(Gru, GpuStandardShape) {
  check_gru<Kernels, Mem>({64, 60, 128, 128}, 512);
  check_gru_bf16<Kernels, Mem>({64, 60, 128, 128}, 532);
}

}  // namespace
}  // namespace slipstream::kernels::test
