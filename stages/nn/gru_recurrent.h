// The GRU stack (gru_model.h) one frame at a time, for inference on the CPU: B independent
// streams, each carrying its per-layer hidden state between calls. Frame after frame from
// reset() it equals GruModel::forward over the same frames (PyTorch nn.GRU, zero initial state).
// Each layer's frame is kernels::gru_forward over one step with the carried state as h0, so the
// gate math (r, z, n; reset applied to W_hn h + b_hn) is the model's own. step() allocates
// nothing; the constructor and resize() size every buffer.
#pragma once

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/gru.h"
#include "stages/nn/gru_model.h"

namespace slipstream::nn {

template <class T>
class GruRecurrent {
 public:
  GruRecurrent(const GruConfig& c, int batch) : c_(c), lay_(c) {
    if (c.din < 1 || c.hidden < 1 || c.layers < 1)
      throw std::invalid_argument("gru: dimensions must be positive");
    resize(batch);
  }

  const GruConfig& config() const { return c_; }
  const GruLayout& layout() const { return lay_; }
  int batch() const { return B_; }

  // Sizes state and scratch for `batch` rows (the only allocating call); every row starts from
  // zero state.
  void resize(int batch) {
    if (batch < 1) throw std::invalid_argument("gru: batch must be positive");
    B_ = batch;
    state_.assign(static_cast<size_t>(c_.layers) * row_elems(), T(0));
    out_.assign(row_elems(), T(0));
    ws_.assign(kernels::gru_forward_workspace_elems(B_, 1, c_.hidden), T(0));
  }

  // Every row back to zero state.
  void reset() { std::fill(state_.begin(), state_.end(), T(0)); }

  // One row back to zero state; the others keep theirs.
  void reset(int row) {
    if (row < 0 || row >= B_)
      throw std::out_of_range("gru: row " + std::to_string(row) + " of a batch of " +
                              std::to_string(B_));
    const size_t H = static_cast<size_t>(c_.hidden);
    for (int k = 0; k < c_.layers; ++k) {
      T* s = layer_state(k) + static_cast<size_t>(row) * H;
      std::fill(s, s + H, T(0));
    }
  }

  // One frame: x (B, din) -> y (B, hidden), the last layer's new state.
  void step(const T* x, const T* w, T* y) {
    const T* in = x;
    for (int k = 0; k < c_.layers; ++k) {
      const auto& Lw = lay_.layers[static_cast<size_t>(k)];
      T* h = layer_state(k);
      // The kernel reads h0 in its recurrent GEMM before writing y; a separate output keeps
      // that independent of its internals.
      kernels::gru_forward(in, static_cast<const T*>(h), w + Lw.w_ih, w + Lw.w_hh, w + Lw.b_ih,
                           w + Lw.b_hh, out_.data(), static_cast<T*>(nullptr), ws_.data(), B_, 1,
                           Lw.in, c_.hidden);
      std::memcpy(h, out_.data(), row_elems() * sizeof(T));
      in = h;
    }
    std::memcpy(y, layer_state(c_.layers - 1), row_elems() * sizeof(T));
  }

 private:
  size_t row_elems() const { return static_cast<size_t>(B_) * static_cast<size_t>(c_.hidden); }
  T* layer_state(int k) { return state_.data() + static_cast<size_t>(k) * row_elems(); }

  GruConfig c_;
  GruLayout lay_;
  int B_ = 0;
  std::vector<T> state_;  // (layers, B, hidden)
  std::vector<T> out_;    // one layer's new state before it replaces the old
  std::vector<T> ws_;     // gru_forward's scratch for one step
};

}  // namespace slipstream::nn
