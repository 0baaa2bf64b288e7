// A stack of GRU layers (PyTorch nn.GRU, batch_first, zero initial state) as plain math on raw
// pointers, templated on T so tests can finite-difference the double instance; the `gru` stage
// wraps the float one. Layer 0 reads Din, later layers the previous layer's H outputs.
// Parameters in PyTorch's order and names: weight_ih_l{k} (3H, In), weight_hh_l{k} (3H, H),
// bias_ih_l{k} (3H), bias_hh_l{k} (3H), gate blocks r, z, n.
#pragma once

#include <functional>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gru.h"
#include "stages/nn/model_flops.h"
#include "stages/nn/param_layout.h"

namespace slipstream::nn {

struct GruConfig {
  int din = 128;
  int hidden = 128;
  int layers = 1;
};

struct GruLayout {
  struct Layer {
    size_t w_ih, w_hh, b_ih, b_hh;
    int in;
  };
  ParamLayout params;
  std::vector<Layer> layers;

  explicit GruLayout(const GruConfig& c) {
    const int64_t H = c.hidden;
    for (int k = 0; k < c.layers; ++k) {
      const std::string s = "_l" + std::to_string(k);
      const int in = k == 0 ? c.din : c.hidden;
      Layer L{};
      L.in = in;
      L.w_ih = params.add("weight_ih" + s, {3 * H, in}, true);
      L.w_hh = params.add("weight_hh" + s, {3 * H, H}, true);
      L.b_ih = params.add("bias_ih" + s, {3 * H}, false);
      L.b_hh = params.add("bias_hh" + s, {3 * H}, false);
      layers.push_back(L);
    }
  }
};

// Floating-point operations of one forward and one backward over (B, L) positions (a
// multiply-add counts 2): per layer the input GEMM (3H x In) and the recurrent one (3H x H), the
// backward twice each (input and weight gradients); the gates by their per-element counts.
inline ModelFlops gru_flops(const GruConfig& c, int64_t B, int64_t L) {
  const double M = double(B) * double(L), H = c.hidden;
  ModelFlops f;
  for (int k = 0; k < c.layers; ++k) {
    const double in = k == 0 ? c.din : c.hidden;
    f.gemm_forward += M * 2 * 3 * H * (in + H);
  }
  f.gemm_backward = 2 * f.gemm_forward;
  f.other_forward = M * c.layers * 14 * H;  // two sigmoids, a tanh, the blend
  f.other_backward = M * c.layers * 24 * H;
  return f;
}

// PyTorch's nn.GRU initialisation: every weight and bias uniform in ±1/sqrt(H).
template <class T>
void gru_init(const GruConfig& c, const GruLayout& lay, T* p, uint64_t seed) {
  InitRng rng(seed);
  const double bound = 1.0 / std::sqrt(double(c.hidden));
  for (size_t i = 0; i < lay.params.total(); ++i) p[i] = T(rng.uniform(-bound, bound));
}

template <class T>
class GruModel {
 public:
  explicit GruModel(const GruConfig& c) : c_(c), lay_(c) {
    if (c.din < 1 || c.hidden < 1 || c.layers < 1)
      throw std::invalid_argument("gru: dimensions must be positive");
  }
  const GruConfig& config() const { return c_; }
  const GruLayout& layout() const { return lay_; }

  void resize(int B, int L) {
    if (B == B_ && L == L_) return;
    B_ = B, L_ = L;
    const size_t nl = static_cast<size_t>(c_.layers), H = static_cast<size_t>(c_.hidden);
    const size_t M = static_cast<size_t>(B) * static_cast<size_t>(L);
    ys_.assign(nl * M * H, T(0));
    saved_.assign(nl * kernels::gru_saved_elems(B, L, c_.hidden), T(0));
    fws_.assign(kernels::gru_forward_workspace_elems(B, L, c_.hidden), T(0));
    bws_.assign(kernels::gru_backward_workspace_elems(B, L, c_.hidden), T(0));
    dbuf_[0].assign(M * H, T(0));
    dbuf_[1].assign(M * H, T(0));
    dx0_.assign(M * static_cast<size_t>(c_.din), T(0));
  }

  // x (B, L, Din) -> y (B, L, H), the last layer's states.
  void forward(const T* x, const T* w, T* y) {
    check();
    const T* in = x;
    for (int k = 0; k < c_.layers; ++k) {
      const auto& Lw = lay_.layers[static_cast<size_t>(k)];
      T* out = layer_out(k);
      kernels::gru_forward(in, static_cast<const T*>(nullptr), w + Lw.w_ih, w + Lw.w_hh,
                           w + Lw.b_ih, w + Lw.b_hh, out, layer_saved(k), fws_.data(), B_, L_,
                           Lw.in, c_.hidden);
      in = out;
    }
    std::memcpy(y, layer_out(c_.layers - 1), elems() * sizeof(T));
  }

  // dy (B, L, H) -> dx (=, may be null); parameter gradients accumulate (+=) into g.
  // `layer_done(k)`, when given, is called once layer k's parameter gradients are final.
  void backward(const T* x, const T* dy, const T* w, T* g, T* dx,
                const std::function<void(int)>* layer_done = nullptr) {
    check();
    const T* dout = dy;
    for (int k = c_.layers - 1; k >= 0; --k) {
      const auto& Lw = lay_.layers[static_cast<size_t>(k)];
      const T* in = k == 0 ? x : layer_out(k - 1);
      // The kernel always writes dx; layer 0 writes the caller's buffer or scratch.
      T* din = k == 0 ? (dx ? dx : dx0_.data()) : dbuf_[static_cast<size_t>(k) & 1].data();
      kernels::gru_backward(in, static_cast<const T*>(nullptr), w + Lw.w_ih, w + Lw.w_hh,
                            layer_out(k), layer_saved(k), dout, static_cast<const T*>(nullptr), din,
                            static_cast<T*>(nullptr), g + Lw.w_ih, g + Lw.w_hh, g + Lw.b_ih,
                            g + Lw.b_hh, bws_.data(), B_, L_, Lw.in, c_.hidden);
      if (layer_done) (*layer_done)(k);
      dout = din;
    }
  }

 private:
  size_t elems() const {
    return static_cast<size_t>(B_) * static_cast<size_t>(L_) * static_cast<size_t>(c_.hidden);
  }
  T* layer_out(int k) { return ys_.data() + static_cast<size_t>(k) * elems(); }
  T* layer_saved(int k) {
    return saved_.data() + static_cast<size_t>(k) * kernels::gru_saved_elems(B_, L_, c_.hidden);
  }
  void check() const {
    if (B_ <= 0) throw std::logic_error("gru: resize() before forward/backward");
  }

  GruConfig c_;
  GruLayout lay_;
  int B_ = 0, L_ = 0;
  std::vector<T> ys_, saved_, fws_, bws_, dx0_;
  std::vector<T> dbuf_[2];
};

}  // namespace slipstream::nn
