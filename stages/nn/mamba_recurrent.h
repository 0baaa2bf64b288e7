// The Mamba model (mamba_model.h) one frame at a time, for inference on the CPU: B independent
// streams (e.g. one per game being played), each carrying its own state between calls. Frame
// after frame from reset() it computes MambaModel::forward over the same frames (the parallel
// forward starts from zero state); tests/nn/recurrent_test.cpp measures < 5e-7 in float, < 1e-15 in
// double.
//
// State per row and layer: the last d_conv - 1 conv inputs (B, K - 1, d_inner), oldest first
// (causal_conv1d_step's layout), and the SSM state h (B, d_inner, d_state). The frame's math:
//   h_0 = x W_inᵀ + b_in (only when din != d_model; else h_0 = x)
//   per layer: xn = RMSNorm(h); (xc, z) = split(xn W_in_projᵀ); u = SiLU(conv(xc) + b) with the
//   carried window; (dt, B, C) = u W_xᵀ; delta = dt W_dtᵀ; scan step with delta_bias =
//   dt_proj.bias, softplus, A = -exp(A_log), D skip and SiLU(z) gate; h += ys W_outᵀ
//   y = RMSNorm_f(h_L)
// Weights are the flat buffer of MambaLayout (fp32 or fp64 like T; no bf16 path). Every buffer is
// sized by the constructor or resize(); step() allocates nothing.
#pragma once

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/selective_scan.h"
#include "stages/nn/mamba_model.h"

namespace slipstream::nn {

template <class T>
class MambaRecurrent {
 public:
  MambaRecurrent(const MambaConfig& c, int batch) : c_(c), lay_(c) {
    if (c.d_model < 1 || c.din < 1 || c.layers < 1 || c.d_state < 1 || c.expand < 1)
      throw std::invalid_argument("mamba: dimensions must be positive");
    if (c.d_state > kernels::kScanMaxState)
      throw std::invalid_argument("mamba: d_state must be at most " +
                                  std::to_string(kernels::kScanMaxState));
    if (c.d_conv < 1 || c.d_conv > kernels::kConvMaxWidth)
      throw std::invalid_argument("mamba: d_conv must be in [1, " +
                                  std::to_string(kernels::kConvMaxWidth) + "]");
    resize(batch);
  }

  const MambaConfig& config() const { return c_; }
  const MambaLayout& layout() const { return lay_; }
  int batch() const { return B_; }

  // Sizes state and scratch for `batch` rows (the only allocating call); every row starts from
  // zero state.
  void resize(int batch) {
    if (batch < 1) throw std::invalid_argument("mamba: batch must be positive");
    B_ = batch;
    const size_t B = rows(), nl = static_cast<size_t>(c_.layers);
    conv_state_.assign(nl * B * conv_row(), T(0));
    ssm_state_.assign(nl * B * ssm_row(), T(0));
    h_.assign(B * dm(), T(0));
    xn_.assign(B * dm(), T(0));
    rstd_.assign(B, T(0));
    xz_.assign(B * 2 * di(), T(0));
    xc_.assign(B * di(), T(0));
    z_.assign(B * di(), T(0));
    u_.assign(B * di(), T(0));
    dbc_.assign(B * P(), T(0));
    delta_.assign(B * di(), T(0));
    Bm_.assign(B * N(), T(0));
    Cm_.assign(B * N(), T(0));
    ys_.assign(B * di(), T(0));
    A_.assign(static_cast<size_t>(c_.layers) * di() * N(), T(0));
    held_ = nullptr;
  }

  // A promise that the weights at `w` keep their values until the next hold_weights() or
  // resize() (e.g. a bot playing a fixed checkpoint): A = -exp(A_log) is computed once here
  // instead of in every step() given `w`, which at batch 1 is half of a step's exponentials.
  void hold_weights(const T* w) {
    for (size_t l = 0; l < static_cast<size_t>(c_.layers); ++l)
      kernels::neg_exp(w + lay_.layers[l].A_log, di() * N(), A_.data() + l * di() * N(), 1,
                       di() * N());
    held_ = w;
  }

  // Every row back to zero state: the next step is the first frame of a window.
  void reset() {
    std::fill(conv_state_.begin(), conv_state_.end(), T(0));
    std::fill(ssm_state_.begin(), ssm_state_.end(), T(0));
  }

  // One row back to zero state (a new game on that stream); the others keep theirs.
  void reset(int row) {
    if (row < 0 || row >= B_)
      throw std::out_of_range("mamba: row " + std::to_string(row) + " of a batch of " +
                              std::to_string(B_));
    const size_t r = static_cast<size_t>(row);
    for (size_t l = 0; l < static_cast<size_t>(c_.layers); ++l) {
      T* cs = conv_layer(l) + r * conv_row();
      std::fill(cs, cs + conv_row(), T(0));
      T* ss = ssm_layer(l) + r * ssm_row();
      std::fill(ss, ss + ssm_row(), T(0));
    }
  }

  // One frame: x (B, din) -> y (B, d_model), advancing every row's state. `w` holds the
  // weights in layout() order.
  void step(const T* x, const T* w, T* y) {
    const int B = B_, dmi = c_.d_model, dii = c_.d_inner(), Ni = c_.d_state, R = c_.rank();
    const int Pi = R + 2 * Ni;
    T* h = h_.data();
    if (c_.has_input_proj()) {
      kernels::gemm<T>(false, true, B, dmi, c_.din, T(1), x, c_.din, w + lay_.input_proj_w, c_.din,
                       T(0), h, dmi);
      kernels::add_bias_rows(h, w + lay_.input_proj_b, rows(), dm());
    } else {
      std::memcpy(h, x, rows() * dm() * sizeof(T));
    }
    for (size_t l = 0; l < static_cast<size_t>(c_.layers); ++l) {
      const auto& Lw = lay_.layers[l];
      kernels::rmsnorm_add_forward<T>(h, nullptr, w + Lw.norm, xn_.data(), nullptr, rstd_.data(),
                                      rows(), dm(), T(c_.eps));
      kernels::gemm<T>(false, true, B, 2 * dii, dmi, T(1), xn_.data(), dmi, w + Lw.in_proj, dmi,
                       T(0), xz_.data(), 2 * dii);
      // The step kernels read dense (B, d_inner) rows, so split (x, z) into their own buffers.
      kernels::copy_cols(xz_.data(), 2 * di(), xc_.data(), di(), rows(), di());
      kernels::copy_cols(xz_.data() + di(), 2 * di(), z_.data(), di(), rows(), di());
      kernels::causal_conv1d_step(conv_layer(l), xc_.data(), w + Lw.conv_w, w + Lw.conv_b,
                                  u_.data(), B, dii, c_.d_conv, true);
      kernels::gemm<T>(false, true, B, Pi, dii, T(1), u_.data(), dii, w + Lw.x_proj, dii, T(0),
                       dbc_.data(), Pi);
      kernels::gemm<T>(false, true, B, dii, R, T(1), dbc_.data(), Pi, w + Lw.dt_w, R, T(0),
                       delta_.data(), dii);
      kernels::copy_cols(dbc_.data() + R, P(), Bm_.data(), N(), rows(), N());
      kernels::copy_cols(dbc_.data() + R + Ni, P(), Cm_.data(), N(), rows(), N());
      // A from the weights given to this call (they may change between calls), unless held.
      T* A = A_.data() + (w == held_ ? l * di() * N() : 0);
      if (w != held_) kernels::neg_exp(w + Lw.A_log, di() * N(), A, 1, di() * N());
      kernels::selective_scan_step(ssm_layer(l), u_.data(), delta_.data(), A, Bm_.data(),
                                   Cm_.data(), w + Lw.D, z_.data(), w + Lw.dt_b, true, ys_.data(),
                                   B, dii, Ni);
      // Residual: out_proj accumulates onto the stream in place.
      kernels::gemm<T>(false, true, B, dmi, dii, T(1), ys_.data(), dii, w + Lw.out_proj, dii, T(1),
                       h, dmi);
    }
    kernels::rmsnorm_add_forward<T>(h, nullptr, w + lay_.norm_f, y, nullptr, rstd_.data(), rows(),
                                    dm(), T(c_.eps));
  }

 private:
  size_t rows() const { return static_cast<size_t>(B_); }
  size_t dm() const { return static_cast<size_t>(c_.d_model); }
  size_t di() const { return static_cast<size_t>(c_.d_inner()); }
  size_t N() const { return static_cast<size_t>(c_.d_state); }
  size_t P() const { return static_cast<size_t>(c_.rank() + 2 * c_.d_state); }
  size_t conv_row() const { return static_cast<size_t>(c_.d_conv - 1) * di(); }
  size_t ssm_row() const { return di() * N(); }
  T* conv_layer(size_t l) { return conv_state_.data() + l * rows() * conv_row(); }
  T* ssm_layer(size_t l) { return ssm_state_.data() + l * rows() * ssm_row(); }

  MambaConfig c_;
  MambaLayout lay_;
  int B_ = 0;
  std::vector<T> conv_state_;  // (layers, B, d_conv - 1, d_inner)
  std::vector<T> ssm_state_;   // (layers, B, d_inner, d_state)
  // One frame's activations.
  std::vector<T> h_, xn_, rstd_, xz_, xc_, z_, u_, dbc_, delta_, Bm_, Cm_, ys_;
  std::vector<T> A_;         // (layers, d_inner, d_state): every layer's when held, else layer 0's
  const T* held_ = nullptr;  // the weights hold_weights() computed A_ from
};

}  // namespace slipstream::nn
