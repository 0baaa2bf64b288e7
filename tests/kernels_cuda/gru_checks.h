// Checks of the CUDA GRU layer against the CPU reference (kernels/gru.h in float64), run by the
// emulated and the gpu tests: the outputs and saved gates of the forward; dx, and the weight and
// bias gradients accumulated onto non-zero starts, of the backward. The bf16 form against the
// CPU's bf16 form (float, the same operands rounded at the same places).
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/gru.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

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
  std::vector<double> x, w_ih, w_hh, b_ih, b_hh, dy;
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
  }
};

template <class Kernels, class Mem>
void check_gru(const GruShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  const GruData d(s, seed);
  const size_t G = 3 * size_t(s.H), M = size_t(s.B) * s.L;
  // The reference: forward, then backward onto non-zero parameter-gradient starts.
  std::vector<double> y(M * s.H), saved(gru_saved_elems(s.B, s.L, s.H));
  std::vector<double> fws(gru_forward_workspace_elems(s.B, s.L, s.H));
  gru_forward<double>(d.x.data(), nullptr, d.w_ih.data(), d.w_hh.data(), d.b_ih.data(),
                      d.b_hh.data(), y.data(), saved.data(), fws.data(), s.B, s.L, s.In, s.H);
  std::mt19937_64 rng(seed ^ 0x9e);
  const auto dw_ih0 = round_trip<float>(rand_vec(G * s.In, rng));
  const auto dw_hh0 = round_trip<float>(rand_vec(G * s.H, rng));
  const auto db_ih0 = round_trip<float>(rand_vec(G, rng));
  const auto db_hh0 = round_trip<float>(rand_vec(G, rng));
  std::vector<double> dx(M * s.In), dw_ih = dw_ih0, dw_hh = dw_hh0, db_ih = db_ih0, db_hh = db_hh0;
  std::vector<double> bws(gru_backward_workspace_elems(s.B, s.L, s.H));
  gru_backward<double>(d.x.data(), nullptr, d.w_ih.data(), d.w_hh.data(), y.data(), saved.data(),
                       d.dy.data(), nullptr, dx.data(), nullptr, dw_ih.data(), dw_hh.data(),
                       db_ih.data(), db_hh.data(), bws.data(), s.B, s.L, s.In, s.H);

  Mem mem;
  const float* x = mem.upload(elems<float>(d.x));
  const float* w_ih = mem.upload(elems<float>(d.w_ih));
  const float* w_hh = mem.upload(elems<float>(d.w_hh));
  float* g_y = mem.template alloc<float>(M * s.H);
  float* g_saved = mem.template alloc<float>(saved.size());
  Kernels::gru_forward(
      mem.gemm_context(), x, w_ih, w_hh, nullptr, nullptr, mem.upload(elems<float>(d.b_ih)),
      mem.upload(elems<float>(d.b_hh)), g_y, g_saved,
      mem.alloc_bytes(Kernels::gru_forward_workspace_bytes(s.B, s.L, s.In, s.H, false)), s.B, s.L,
      s.In, s.H, mem.stream());
  float* g_dx = mem.template alloc<float>(M * s.In);
  float* g_dw_ih = mem.upload(elems<float>(dw_ih0));
  float* g_dw_hh = mem.upload(elems<float>(dw_hh0));
  float* g_db_ih = mem.upload(elems<float>(db_ih0));
  float* g_db_hh = mem.upload(elems<float>(db_hh0));
  Kernels::gru_backward(
      mem.gemm_context(), x, w_ih, w_hh, nullptr, nullptr, g_y, g_saved,
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
      mem.gemm_context(), x, w_ih, w_hh, nullptr, nullptr, g_y, g_saved,
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
void check_gru_bf16(const GruShape& s, uint64_t seed) {
  SCOPED_TRACE(describe(s) + " bf16");
  const GruData d(s, seed);
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
    gru_forward<float>(x.data(), nullptr, w_ih.data(), w_hh.data(), b_ih.data(), b_hh.data(),
                       o.y.data(), o.saved.data(), fws.data(), s.B, s.L, s.In, s.H,
                       bf16 ? &form : nullptr);
    std::vector<float> ws(gru_backward_workspace_elems(s.B, s.L, s.H));
    gru_backward<float>(x.data(), nullptr, w_ih.data(), w_hh.data(), o.y.data(), o.saved.data(),
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
  float* g_y = mem.template alloc<float>(M * s.H);
  float* g_saved = mem.template alloc<float>(ref.saved.size());
  const size_t ws_bytes =
      std::max(Kernels::gru_forward_workspace_bytes(s.B, s.L, s.In, s.H, true),
               Kernels::gru_backward_workspace_bytes(s.B, s.L, s.In, s.H, true));
  void* ws = mem.alloc_bytes(ws_bytes);
  // The FP32 weights are not read by the bf16 form: null proves it.
  Kernels::gru_forward(mem.gemm_context(), g_x, nullptr, nullptr, g_wih_bf, g_whh_bf,
                       mem.upload(b_ih), mem.upload(b_hh), g_y, g_saved, ws, s.B, s.L, s.In, s.H,
                       mem.stream());
  float* g_dx = mem.template alloc<float>(M * s.In);
  float *g_dw_ih = mem.upload(dw_ih0), *g_dw_hh = mem.upload(dw_hh0);
  float *g_db_ih = mem.upload(db0), *g_db_hh = mem.upload(db0);
  Kernels::gru_backward(mem.gemm_context(), g_x, nullptr, nullptr, g_wih_bf, g_whh_bf, g_y, g_saved,
                        mem.upload(dy), g_dx, g_dw_ih, g_dw_hh, g_db_ih, g_db_hh, ws, s.B, s.L,
                        s.In, s.H, mem.stream());
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
