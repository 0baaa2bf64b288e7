// The Mamba-1 sequence model (mamba-ssm's MixerModel without the embedding) as plain math on raw
// pointers, templated on T so tests can finite-difference the double instance; the `mamba` stage
// wraps the float one.
//
//   h_0 = x W_inᵀ + b_in (only when Din != d_model; else h_0 = x)
//   h_{l+1} = h_l + Mixer_l(RMSNorm_l(h_l)),  y = RMSNorm_f(h_L)
//   Mixer: (x, z) = split(in_proj(h)); u = SiLU(conv1d(x) + b); (dt, B, C) = x_proj(u);
//          delta = dt_proj.weight dt; s = scan(u, delta, A = -exp(A_log), B, C, D, z,
//          delta_bias = dt_proj.bias, softplus); out_proj(s)
//
// Weights, gradients and bf16 shadows live in flat buffers addressed through layout() (names
// and shapes are mamba-ssm's). All activations and scratch are sized by resize(B, L); forward
// and backward allocate nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/activations.h"
#include "kernels/bf16.h"
#include "kernels/causal_conv1d.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/selective_scan.h"
#include "stages/nn/param_layout.h"

namespace slipstream::nn {

struct MambaConfig {
  int din = 128;
  int d_model = 128;
  int d_state = 16;
  int d_conv = 4;
  int expand = 2;
  int dt_rank = 0;  // 0: ceil(d_model / 16)
  int layers = 2;
  double eps = 1e-5;
  // mamba-ssm's dt_proj initialisation.
  double dt_min = 0.001, dt_max = 0.1, dt_init_floor = 1e-4, dt_scale = 1.0;

  int d_inner() const { return expand * d_model; }
  int rank() const { return dt_rank > 0 ? dt_rank : (d_model + 15) / 16; }
  bool has_input_proj() const { return din != d_model; }
};

// Offsets of every parameter in the flat buffers.
struct MambaLayout {
  struct Layer {
    size_t norm, in_proj, conv_w, conv_b, x_proj, dt_w, dt_b, A_log, D, out_proj;
  };
  ParamLayout params;
  size_t input_proj_w = 0, input_proj_b = 0;
  std::vector<Layer> layers;
  size_t norm_f = 0;

  explicit MambaLayout(const MambaConfig& c) {
    const int64_t dm = c.d_model, di = c.d_inner(), R = c.rank(), N = c.d_state;
    if (c.has_input_proj()) {
      input_proj_w = params.add("input_proj.weight", {dm, c.din}, true);
      input_proj_b = params.add("input_proj.bias", {dm}, false);
    }
    for (int l = 0; l < c.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      Layer L{};
      L.norm = params.add(p + "norm.weight", {dm}, false);
      L.in_proj = params.add(p + "mixer.in_proj.weight", {2 * di, dm}, true);
      L.conv_w = params.add(p + "mixer.conv1d.weight", {di, 1, c.d_conv}, true);
      L.conv_b = params.add(p + "mixer.conv1d.bias", {di}, false);
      L.x_proj = params.add(p + "mixer.x_proj.weight", {R + 2 * N, di}, true);
      L.dt_w = params.add(p + "mixer.dt_proj.weight", {di, R}, true);
      L.dt_b = params.add(p + "mixer.dt_proj.bias", {di}, false);
      L.A_log = params.add(p + "mixer.A_log", {di, N}, false);
      L.D = params.add(p + "mixer.D", {di}, false);
      L.out_proj = params.add(p + "mixer.out_proj.weight", {dm, di}, true);
      layers.push_back(L);
    }
    norm_f = params.add("norm_f.weight", {dm}, false);
  }
};

// mamba-ssm's initialisation (Mamba.__init__ plus MixerModel._init_weights without embedding):
// Linear weights kaiming-uniform (±1/sqrt(fan_in)), Linear biases zero, out_proj additionally
// divided by sqrt(layers), conv1d PyTorch default (±1/sqrt(d_conv) for weight and bias),
// dt_proj weight ±dt_rank^-0.5·dt_scale and bias = softplus⁻¹(dt), dt log-uniform in
// [dt_min, dt_max] floored at dt_init_floor, A_log = log(1..d_state), D = 1, norms 1.
template <class T>
void mamba_init(const MambaConfig& c, const MambaLayout& lay, T* p, uint64_t seed) {
  InitRng rng(seed);
  auto fill_uniform = [&](size_t off, size_t n, double bound) {
    for (size_t i = 0; i < n; ++i) p[off + i] = T(rng.uniform(-bound, bound));
  };
  auto fill = [&](size_t off, size_t n, double v) { std::fill(p + off, p + off + n, T(v)); };
  const size_t dm = static_cast<size_t>(c.d_model), di = static_cast<size_t>(c.d_inner());
  const size_t R = static_cast<size_t>(c.rank()), N = static_cast<size_t>(c.d_state);
  const size_t K = static_cast<size_t>(c.d_conv);
  if (c.has_input_proj()) {
    fill_uniform(lay.input_proj_w, dm * static_cast<size_t>(c.din), 1.0 / std::sqrt(double(c.din)));
    fill(lay.input_proj_b, dm, 0.0);
  }
  for (const auto& L : lay.layers) {
    fill(L.norm, dm, 1.0);
    fill_uniform(L.in_proj, 2 * di * dm, 1.0 / std::sqrt(double(dm)));
    fill_uniform(L.conv_w, di * K, 1.0 / std::sqrt(double(K)));
    fill_uniform(L.conv_b, di, 1.0 / std::sqrt(double(K)));
    fill_uniform(L.x_proj, (R + 2 * N) * di, 1.0 / std::sqrt(double(di)));
    fill_uniform(L.dt_w, di * R, c.dt_scale / std::sqrt(double(R)));
    for (size_t d = 0; d < di; ++d) {
      const double lo = std::log(c.dt_min), hi = std::log(c.dt_max);
      const double dt = std::max(std::exp(rng.uniform01() * (hi - lo) + lo), c.dt_init_floor);
      p[L.dt_b + d] = T(dt + std::log(-std::expm1(-dt)));  // inverse of softplus
    }
    for (size_t d = 0; d < di; ++d)
      for (size_t n = 0; n < N; ++n) p[L.A_log + d * N + n] = T(std::log(double(n + 1)));
    fill(L.D, di, 1.0);
    fill_uniform(L.out_proj, dm * di,
                 1.0 / std::sqrt(double(di)) / std::sqrt(double(std::max(1, c.layers))));
  }
  fill(lay.norm_f, dm, 1.0);
}

template <class T>
class MambaModel {
 public:
  explicit MambaModel(const MambaConfig& c) : c_(c), lay_(c) {
    if (c.d_model < 1 || c.din < 1 || c.layers < 1 || c.d_state < 1 || c.expand < 1)
      throw std::invalid_argument("mamba: dimensions must be positive");
    if (c.d_state > kernels::kScanMaxState)
      throw std::invalid_argument("mamba: d_state must be at most " +
                                  std::to_string(kernels::kScanMaxState));
    if (c.d_conv < 1 || c.d_conv > kernels::kConvMaxWidth)
      throw std::invalid_argument("mamba: d_conv must be in [1, " +
                                  std::to_string(kernels::kConvMaxWidth) + "]");
  }

  const MambaConfig& config() const { return c_; }
  const MambaLayout& layout() const { return lay_; }
  int batch() const { return B_; }
  int length() const { return L_; }

  // Sizes every activation and scratch buffer for (B, L). The only allocating call; bf16
  // buffers only when `bf16` (T = float).
  void resize(int B, int L, bool bf16) {
    if (B == B_ && L == L_ && bf16 == bf16_) return;
    if (bf16 && !std::is_same_v<T, float>) throw std::logic_error("mamba: bf16 needs T = float");
    B_ = B, L_ = L, bf16_ = bf16;
    const size_t M = static_cast<size_t>(B) * static_cast<size_t>(L);
    const size_t dm = dm_(), di = di_(), N = N_(), P = P_(), nl = static_cast<size_t>(c_.layers);
    h_.assign((nl + 1) * M * dm, T(0));
    rstd_.assign(nl * M, T(0));
    xn_.assign(nl * M * dm, T(0));
    xz_.assign(M * 2 * di, T(0));  // split into xc/z at once: no per-layer copy kept
    xc_.assign(nl * M * di, T(0));
    z_.assign(nl * M * di, T(0));
    conv_.assign(nl * M * di, T(0));
    u_.assign(nl * M * di, T(0));
    dbc_.assign(nl * M * P, T(0));
    delta_.assign(nl * M * di, T(0));
    Bm_.assign(nl * M * N, T(0));
    Cm_.assign(nl * M * N, T(0));
    ys_.assign(nl * M * di, T(0));
    A_.assign(nl * di * N, T(0));
    rstd_f_.assign(M, T(0));
    // Backward scratch.
    dh_.assign(M * dm, T(0));
    dxn_.assign(M * dm, T(0));
    dxz_.assign(M * 2 * di, T(0));
    dys_.assign(M * di, T(0));
    du_.assign(M * di, T(0));
    ddelta_.assign(M * di, T(0));
    dz_.assign(M * di, T(0));
    dconv_.assign(M * di, T(0));
    dxc_.assign(M * di, T(0));
    dBm_.assign(M * N, T(0));
    dCm_.assign(M * N, T(0));
    ddbc_.assign(M * P, T(0));
    dA_.assign(di * N, T(0));
    scan_ws_.assign(kernels::selective_scan_backward_workspace_elems(B, L, static_cast<int>(di),
                                                                     static_cast<int>(N)),
                    T(0));
    if (bf16) {
      const size_t din = static_cast<size_t>(c_.din);
      xin_bf_.assign(c_.has_input_proj() ? M * din : 0, 0);
      xn_bf_.assign(nl * M * dm, 0);
      u_bf_.assign(nl * M * di, 0);
      dbc_bf_.assign(nl * M * P, 0);
      ys_bf_.assign(nl * M * di, 0);
      dy_bf_.assign(M * std::max({2 * di, dm, P}), 0);
      // gemm_bf16 widens op(A) and op(B): the largest M·K + K·N over all products.
      size_t ws = 0;
      auto lin = [&](size_t in, size_t out) { ws = std::max(ws, M * (in + out) + in * out); };
      lin(din, dm);
      lin(dm, 2 * di);
      lin(di, P);
      lin(static_cast<size_t>(c_.rank()), di);
      lin(di, dm);
      gemm_ws_.assign(ws, 0.0f);
    } else {
      xin_bf_.clear(), xn_bf_.clear(), u_bf_.clear(), dbc_bf_.clear(), ys_bf_.clear();
      dy_bf_.clear(), gemm_ws_.clear();
    }
  }

  // x (B, L, din) -> y (B, L, d_model). `wb` is the bf16 shadow of `w` (same layout), used by
  // the GEMMs together with bf16-rounded activations; null for full precision.
  void forward(const T* x, const T* w, const uint16_t* wb, T* y) {
    check_precision(wb);
    const int M = B_ * L_, dm = c_.d_model, di = c_.d_inner(), N = c_.d_state, R = c_.rank();
    const int P = R + 2 * N;
    const size_t Ms = static_cast<size_t>(M);
    T* h0 = h_.data();
    if (c_.has_input_proj()) {
      const uint16_t* xb = round(x, xin_bf_.data(), Ms * static_cast<size_t>(c_.din), wb);
      mm(false, true, M, dm, c_.din, x, xb, c_.din, w + lay_.input_proj_w,
         bf(wb, lay_.input_proj_w), c_.din, T(0), h0, dm);
      add_bias_rows(h0, w + lay_.input_proj_b, Ms, static_cast<size_t>(dm));
    } else {
      std::memcpy(h0, x, Ms * dm_() * sizeof(T));
    }
    for (int l = 0; l < c_.layers; ++l) {
      const auto& Lw = lay_.layers[static_cast<size_t>(l)];
      const Act a = act(l);
      T* hn = a.h + Ms * dm_();
      kernels::rmsnorm_forward(a.h, w + Lw.norm, a.xn, a.rstd, Ms, dm_(), T(c_.eps));
      const uint16_t* xnb = round(a.xn, a.xn_bf, Ms * dm_(), wb);
      mm(false, true, M, 2 * di, dm, a.xn, xnb, dm, w + Lw.in_proj, bf(wb, Lw.in_proj), dm, T(0),
         xz_.data(), 2 * di);
      kernels::copy_cols(xz_.data(), 2 * di_(), a.xc, di_(), Ms, di_());
      kernels::copy_cols(xz_.data() + di, 2 * di_(), a.z, di_(), Ms, di_());
      kernels::causal_conv1d_forward(a.xc, w + Lw.conv_w, w + Lw.conv_b, a.conv, B_, L_, di,
                                     c_.d_conv);
      kernels::silu_forward(a.conv, a.u, Ms * di_());
      const uint16_t* ub = round(a.u, a.u_bf, Ms * di_(), wb);
      mm(false, true, M, P, di, a.u, ub, di, w + Lw.x_proj, bf(wb, Lw.x_proj), di, T(0), a.dbc, P);
      const uint16_t* dbcb = round(a.dbc, a.dbc_bf, Ms * P_(), wb);
      mm(false, true, M, di, R, a.dbc, dbcb, P, w + Lw.dt_w, bf(wb, Lw.dt_w), R, T(0), a.delta, di);
      kernels::copy_cols(a.dbc + R, P_(), a.Bm, N_(), Ms, N_());
      kernels::copy_cols(a.dbc + R + N, P_(), a.Cm, N_(), Ms, N_());
      const T* A_log = w + Lw.A_log;
      for (size_t i = 0; i < di_() * N_(); ++i) a.A[i] = -std::exp(A_log[i]);
      kernels::selective_scan_forward(a.u, a.delta, a.A, a.Bm, a.Cm, w + Lw.D, a.z, w + Lw.dt_b,
                                      true, a.ys, static_cast<T*>(nullptr), B_, L_, di, N);
      const uint16_t* ysb = round(a.ys, a.ys_bf, Ms * di_(), wb);
      std::memcpy(hn, a.h, Ms * dm_() * sizeof(T));  // residual; out_proj accumulates onto it
      mm(false, true, M, dm, di, a.ys, ysb, di, w + Lw.out_proj, bf(wb, Lw.out_proj), di, T(1), hn,
         dm);
    }
    kernels::rmsnorm_forward(h_.data() + static_cast<size_t>(c_.layers) * Ms * dm_(),
                             w + lay_.norm_f, y, rstd_f_.data(), Ms, dm_(), T(c_.eps));
  }

  // After forward on the same x: dy (B, L, d_model) -> dx (=, may be null when not wanted);
  // parameter gradients accumulate (+=) into g (the layout of w).
  void backward(const T* x, const T* dy, const T* w, const uint16_t* wb, T* g, T* dx) {
    check_precision(wb);
    const int M = B_ * L_, dm = c_.d_model, di = c_.d_inner(), N = c_.d_state, R = c_.rank();
    const int P = R + 2 * N;
    const size_t Ms = static_cast<size_t>(M);
    T* dh = dh_.data();
    kernels::rmsnorm_backward(h_.data() + static_cast<size_t>(c_.layers) * Ms * dm_(),
                              w + lay_.norm_f, rstd_f_.data(), dy, dh, g + lay_.norm_f, Ms, dm_());
    uint16_t* dyb = dy_bf_.empty() ? nullptr : dy_bf_.data();
    for (int l = c_.layers - 1; l >= 0; --l) {
      const auto& Lw = lay_.layers[static_cast<size_t>(l)];
      const Act a = act(l);
      // out_proj: hn = h + ys W_outᵀ; the residual passes dh through unchanged.
      const uint16_t* dhb = round(dh, dyb, Ms * dm_(), wb);
      mm(false, false, M, di, dm, dh, dhb, dm, w + Lw.out_proj, bf(wb, Lw.out_proj), di, T(0),
         dys_.data(), di);
      mm(true, false, dm, di, M, dh, dhb, dm, a.ys, a.ys_bf, di, T(1), g + Lw.out_proj, di);
      // Scan; dA is a fresh sum so the chain rule to A_log (dA_log = dA · A) is applied once.
      std::fill(dA_.begin(), dA_.end(), T(0));
      kernels::selective_scan_backward(a.u, a.delta, a.A, a.Bm, a.Cm, w + Lw.D, a.z, w + Lw.dt_b,
                                       true, dys_.data(), du_.data(), ddelta_.data(), dA_.data(),
                                       dBm_.data(), dCm_.data(), g + Lw.D, dz_.data(), g + Lw.dt_b,
                                       scan_ws_.data(), B_, L_, di, N);
      T* gA = g + Lw.A_log;
      for (size_t i = 0; i < di_() * N_(); ++i) gA[i] += dA_[i] * a.A[i];
      // dt_proj: delta = dt W_dtᵀ with dt the first R columns of dbc.
      const uint16_t* ddb = round(ddelta_.data(), dyb, Ms * di_(), wb);
      mm(false, false, M, R, di, ddelta_.data(), ddb, di, w + Lw.dt_w, bf(wb, Lw.dt_w), R, T(0),
         ddbc_.data(), P);
      mm(true, false, di, R, M, ddelta_.data(), ddb, di, a.dbc, a.dbc_bf, P, T(1), g + Lw.dt_w, R);
      kernels::copy_cols(dBm_.data(), N_(), ddbc_.data() + R, P_(), Ms, N_());
      kernels::copy_cols(dCm_.data(), N_(), ddbc_.data() + R + N, P_(), Ms, N_());
      // x_proj: dbc = u W_xᵀ; u also feeds the scan, so its gradient adds onto du.
      const uint16_t* dpb = round(ddbc_.data(), dyb, Ms * P_(), wb);
      mm(false, false, M, di, P, ddbc_.data(), dpb, P, w + Lw.x_proj, bf(wb, Lw.x_proj), di, T(1),
         du_.data(), di);
      mm(true, false, P, di, M, ddbc_.data(), dpb, P, a.u, a.u_bf, di, T(1), g + Lw.x_proj, di);
      kernels::silu_backward(a.conv, du_.data(), dconv_.data(), Ms * di_());
      kernels::causal_conv1d_backward(a.xc, w + Lw.conv_w, dconv_.data(), dxc_.data(),
                                      g + Lw.conv_w, g + Lw.conv_b, B_, L_, di, c_.d_conv);
      kernels::copy_cols(dxc_.data(), di_(), dxz_.data(), 2 * di_(), Ms, di_());
      kernels::copy_cols(dz_.data(), di_(), dxz_.data() + di, 2 * di_(), Ms, di_());
      // in_proj, then the block's RMSNorm; its input gradient joins the residual stream.
      const uint16_t* dxzb = round(dxz_.data(), dyb, Ms * 2 * di_(), wb);
      mm(false, false, M, dm, 2 * di, dxz_.data(), dxzb, 2 * di, w + Lw.in_proj, bf(wb, Lw.in_proj),
         dm, T(0), dxn_.data(), dm);
      mm(true, false, 2 * di, dm, M, dxz_.data(), dxzb, 2 * di, a.xn, a.xn_bf, dm, T(1),
         g + Lw.in_proj, dm);
      kernels::rmsnorm_backward(a.h, w + Lw.norm, a.rstd, dxn_.data(), dxn_.data(), g + Lw.norm, Ms,
                                dm_());
      kernels::add_inplace(dh, dxn_.data(), Ms * dm_());
    }
    if (c_.has_input_proj()) {
      const int din = c_.din;
      const uint16_t* dhb = round(dh, dyb, Ms * dm_(), wb);
      if (dx)
        mm(false, false, M, din, dm, dh, dhb, dm, w + lay_.input_proj_w, bf(wb, lay_.input_proj_w),
           din, T(0), dx, din);
      mm(true, false, dm, din, M, dh, dhb, dm, x, xin_bf_.empty() ? nullptr : xin_bf_.data(), din,
         T(1), g + lay_.input_proj_w, din);
      kernels::column_sum_accumulate(dh, g + lay_.input_proj_b, Ms, dm_());
    } else if (dx) {
      std::memcpy(dx, dh, Ms * dm_() * sizeof(T));
    }
  }

 private:
  // One layer's saved activations.
  struct Act {
    T *h, *rstd, *xn, *xc, *z, *conv, *u, *dbc, *delta, *Bm, *Cm, *ys, *A;
    uint16_t *xn_bf, *u_bf, *dbc_bf, *ys_bf;
  };
  Act act(int l) {
    const size_t M = static_cast<size_t>(B_) * static_cast<size_t>(L_), k = static_cast<size_t>(l);
    auto at = [&](std::vector<uint16_t>& v, size_t per) {
      return v.empty() ? nullptr : v.data() + k * per;
    };
    return {h_.data() + k * M * dm_(),    rstd_.data() + k * M,       xn_.data() + k * M * dm_(),
            xc_.data() + k * M * di_(),   z_.data() + k * M * di_(),  conv_.data() + k * M * di_(),
            u_.data() + k * M * di_(),    dbc_.data() + k * M * P_(), delta_.data() + k * M * di_(),
            Bm_.data() + k * M * N_(),    Cm_.data() + k * M * N_(),  ys_.data() + k * M * di_(),
            A_.data() + k * di_() * N_(), at(xn_bf_, M * dm_()),      at(u_bf_, M * di_()),
            at(dbc_bf_, M * P_()),        at(ys_bf_, M * di_())};
  }

  size_t dm_() const { return static_cast<size_t>(c_.d_model); }
  size_t di_() const { return static_cast<size_t>(c_.d_inner()); }
  size_t N_() const { return static_cast<size_t>(c_.d_state); }
  size_t P_() const { return static_cast<size_t>(c_.rank() + 2 * c_.d_state); }

  void check_precision(const uint16_t* wb) const {
    if (B_ <= 0) throw std::logic_error("mamba: resize() before forward/backward");
    if ((wb != nullptr) != bf16_)
      throw std::logic_error("mamba: bf16 shadow given/absent but buffers sized for the other");
  }

  static const uint16_t* bf(const uint16_t* wb, size_t off) { return wb ? wb + off : nullptr; }

  // The bf16 copy of an activation for the GEMMs (null in full precision).
  static const uint16_t* round(const T* src, uint16_t* dst, size_t n, const uint16_t* wb) {
    if constexpr (std::is_same_v<T, float>) {
      if (wb && dst) {
        kernels::fp32_to_bf16(src, dst, n);
        return dst;
      }
    }
    (void)src, (void)n, (void)wb;
    return nullptr;
  }

  // C = op(A) op(B) + beta C; with both bf16 copies present, the bf16 GEMM (FP32 accumulate).
  void mm(bool ta, bool tb, int M, int N, int K, const T* A, const uint16_t* Ab, int lda,
          const T* B, const uint16_t* Bb, int ldb, T beta, T* C, int ldc) {
    if constexpr (std::is_same_v<T, float>) {
      if (Ab && Bb) {
        kernels::gemm_bf16(ta, tb, M, N, K, 1.0f, Ab, lda, Bb, ldb, beta, C, ldc, gemm_ws_.data());
        return;
      }
    }
    kernels::gemm<T>(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
  }

  static void add_bias_rows(T* y, const T* b, size_t M, size_t N) {
    for (size_t r = 0; r < M; ++r)
      for (size_t j = 0; j < N; ++j) y[r * N + j] += b[j];
  }

  MambaConfig c_;
  MambaLayout lay_;
  int B_ = 0, L_ = 0;
  bool bf16_ = false;
  std::vector<T> h_, rstd_, xn_, xz_, xc_, z_, conv_, u_, dbc_, delta_, Bm_, Cm_, ys_, A_, rstd_f_;
  std::vector<T> dh_, dxn_, dxz_, dys_, du_, ddelta_, dz_, dconv_, dxc_, dBm_, dCm_, ddbc_, dA_;
  std::vector<T> scan_ws_;
  std::vector<uint16_t> xin_bf_, xn_bf_, u_bf_, dbc_bf_, ys_bf_, dy_bf_;
  std::vector<float> gemm_ws_;
};

}  // namespace slipstream::nn
