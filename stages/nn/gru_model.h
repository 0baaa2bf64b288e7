// A stack of GRU layers (PyTorch nn.GRU, batch_first, zero initial state unless carried) over the
// ops of a backend, on raw pointers: CpuOps<T> (T = double for the finite-difference tests) or a
// device's ops; the `gru` stage wraps the float model of the run's backend. Layer 0 reads Din,
// later layers the previous layer's H outputs. Carried state (set_carry(true)), as MambaModel's:
// each batch row continues the sequence the same row of the previous batch ended, where carry()'s
// `continues` says so (1; 0 starts it afresh): every layer starts from that row's last state. The
// state is a constant to the backward (truncated backpropagation through time). Parameters in
// PyTorch's order and names: weight_ih_l{k} (3H, In), weight_hh_l{k} (3H, H), bias_ih_l{k} (3H),
// bias_hh_l{k} (3H), gate blocks r, z, n.
#pragma once

#include <functional>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/gru.h"
#include "stages/nn/model_flops.h"
#include "stages/nn/param_layout.h"
#include "stages/ops/cpu_ops.h"

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

// The stack over the ops of a backend (cpu_ops.h on the CPU, device_ops.h on a device): each
// layer is one ops.gru_forward / gru_backward, in FP32 or (given the bf16 shadow of the
// weights) the bf16 form; buffers come from ops.alloc, sized by resize().
template <class T, class Ops = ops::CpuOps<T>>
class GruModel {
  static_assert(std::is_same_v<T, typename Ops::Scalar>, "the ops compute in T");

 public:
  explicit GruModel(const GruConfig& c, Ops ops = Ops()) : c_(c), lay_(c), ops_(ops) {
    if (c.din < 1 || c.hidden < 1 || c.layers < 1)
      throw std::invalid_argument("gru: dimensions must be positive");
  }
  const GruConfig& config() const { return c_; }
  const GruLayout& layout() const { return lay_; }
  const Ops& ops() const { return ops_; }
  int batch() const { return B_; }
  int length() const { return L_; }

  // Carry each row's state from one forward to the next (see the top); before resize().
  void set_carry(bool on) {
    if (on != carry_) B_ = L_ = 0;  // resize() allocates (or drops) the state buffers
    carry_ = on;
  }
  bool carries() const { return carry_; }
  // The states the last forward left (layers, B, H), as the next carry() reads them: the buffer
  // itself, which a checkpoint saves and a resume writes back.
  const std::vector<Tensor>& carried() const { return carried_; }
  // Forgets every row's state (the next forward starts each row afresh whatever its
  // `continues`): around a validation pass, whose batches are other sequences.
  void clear_carry() {
    if (!carry_ || B_ <= 0) return;
    ops_.zero(h_last_, state_elems());
  }
  // carry() with every row continuing (a stream's frame in which no game restarts): the states
  // the last forward left, where they lie, are the ones the next starts from; the two buffers
  // trade places instead of a copy (the forward writes every row's last state).
  void carry_all() {
    if (!carry_ || B_ <= 0) throw std::logic_error("gru: carry_all() needs set_carry and resize");
    std::swap(h_first_, h_last_);
    std::swap(carried_, starting_);
  }
  // With a carried state, before each forward: the states it starts from, row by row, the one
  // the previous forward left where `continues` (B) is 1, zeros where it is 0.
  void carry(const T* continues) {
    if (!carry_ || B_ <= 0) throw std::logic_error("gru: carry() needs set_carry and resize");
    const size_t B = static_cast<size_t>(B_), H = static_cast<size_t>(c_.hidden);
    ops_.scale_rows(h_last_, continues, h_first_, static_cast<size_t>(c_.layers), B, H, nullptr,
                    nullptr, 0);
  }

  // Sizes every activation and scratch buffer for (B, L): the only allocating call. `bf16`
  // (T = float): the layers' bf16 form (kernels/gru.h), its workspace included.
  void resize(int B, int L, bool bf16 = false) {
    if (B == B_ && L == L_ && bf16 == bf16_) return;
    if (bf16 && !std::is_same_v<T, float>) throw std::logic_error("gru: bf16 needs T = float");
    B_ = B, L_ = L, bf16_ = bf16;
    const size_t nl = static_cast<size_t>(c_.layers), H = static_cast<size_t>(c_.hidden);
    const size_t M = static_cast<size_t>(B) * static_cast<size_t>(L);
    buffers_.clear();
    ys_ = buf((nl - 1) * M * H, "gru layer outputs");  // the last layer's go straight into y
    saved_ = buf(nl * kernels::gru_saved_elems(B, L, c_.hidden), "gru saved gates");
    dbuf_[0] = buf(M * H, "gru layer input gradient");
    dbuf_[1] = buf(M * H, "gru layer input gradient");
    size_t ws = 0;
    for (const auto& Lw : lay_.layers)
      ws = std::max(ws, ops_.gru_workspace_bytes(B, L, Lw.in, c_.hidden, bf16));
    buffers_.push_back(ops_.template alloc<uint8_t>(std::max<size_t>(ws, 1), "gru workspace"));
    ws_ = buffers_.back().raw();
    // The carried states: what the previous forward left (last) and what this one starts from.
    carried_.clear();
    starting_.clear();
    h_last_ = h_first_ = nullptr;
    if (carry_) {
      h_last_ = buf(state_elems(), "gru carried state");
      carried_.push_back(buffers_.back());
      h_first_ = buf(state_elems(), "gru carried state");  // alloc() zero-fills both
      starting_.push_back(buffers_.back());
    }
  }

  // x (B, L, Din) -> y (B, L, H), the last layer's states. `wb`: the bf16 shadow of `w` (same
  // layout) for the bf16 form, null for full precision (as resize() was told). With a carried
  // state, each row starts from the state carry() set and leaves its own for the next. The last
  // layer writes y itself (no copy): the backward reads it there, so y stays as it is until then.
  void forward(const T* x, const T* w, const uint16_t* wb, T* y) {
    check(wb);
    const T* in = x;
    const size_t H = static_cast<size_t>(c_.hidden), L = static_cast<size_t>(L_);
    for (int k = 0; k < c_.layers; ++k) {
      const auto& Lw = lay_.layers[static_cast<size_t>(k)];
      T* out = k + 1 == c_.layers ? y : layer_out(k);
      ops_.gru_forward(in, w + Lw.w_ih, w + Lw.w_hh, bf(wb, Lw.w_ih), bf(wb, Lw.w_hh), w + Lw.b_ih,
                       w + Lw.b_hh, first(k), out, layer_saved(k), ws_, B_, L_, Lw.in, c_.hidden);
      if (carry_)  // the layer's state after the window's last step: y[:, L-1, :]
        ops_.copy_cols(out + (L - 1) * H, L * H, h_last_ + static_cast<size_t>(k) * B_ * H, H,
                       static_cast<size_t>(B_), H);
      in = out;
    }
    y_ = y;
  }

  // dy (B, L, H) -> dx (=, may be null); parameter gradients accumulate (+=) into g.
  // `layer_done(k)`, when given, is called once layer k's parameter gradients are final.
  void backward(const T* x, const T* dy, const T* w, const uint16_t* wb, T* g, T* dx,
                const std::function<void(int)>* layer_done = nullptr) {
    check(wb);
    const T* dout = dy;
    for (int k = c_.layers - 1; k >= 0; --k) {
      const auto& Lw = lay_.layers[static_cast<size_t>(k)];
      const T* in = k == 0 ? x : layer_out(k - 1);
      T* din = k == 0 ? dx : dbuf_[static_cast<size_t>(k) & 1];
      const T* out = k + 1 == c_.layers ? y_ : layer_out(k);
      ops_.gru_backward(in, w + Lw.w_ih, w + Lw.w_hh, bf(wb, Lw.w_ih), bf(wb, Lw.w_hh), first(k),
                        out, layer_saved(k), dout, din, g + Lw.w_ih, g + Lw.w_hh, g + Lw.b_ih,
                        g + Lw.b_hh, ws_, B_, L_, Lw.in, c_.hidden);
      if (layer_done) (*layer_done)(k);
      dout = din;
    }
  }

 private:
  size_t elems() const {
    return static_cast<size_t>(B_) * static_cast<size_t>(L_) * static_cast<size_t>(c_.hidden);
  }
  T* layer_out(int k) const { return ys_ + static_cast<size_t>(k) * elems(); }
  // Layer k's initial state: carry()'s, or null (zero) without a carried state.
  const T* first(int k) const {
    return carry_ ? h_first_ + static_cast<size_t>(k) * B_ * static_cast<size_t>(c_.hidden)
                  : nullptr;
  }
  size_t state_elems() const {
    return static_cast<size_t>(c_.layers) * static_cast<size_t>(B_) *
           static_cast<size_t>(c_.hidden);
  }
  T* layer_saved(int k) const {
    return saved_ + static_cast<size_t>(k) * kernels::gru_saved_elems(B_, L_, c_.hidden);
  }
  void check(const uint16_t* wb) const {
    if (B_ <= 0) throw std::logic_error("gru: resize() before forward/backward");
    if ((wb != nullptr) != bf16_)
      throw std::logic_error("gru: bf16 shadow given/absent but buffers sized for the other");
  }
  static const uint16_t* bf(const uint16_t* wb, size_t off) { return wb ? wb + off : nullptr; }
  T* buf(size_t n, const char* what) {
    buffers_.push_back(ops_.template alloc<T>(std::max<size_t>(n, 1), what));
    return buffers_.back().template data<T>();
  }

  GruConfig c_;
  GruLayout lay_;
  Ops ops_;
  int B_ = 0, L_ = 0;
  bool bf16_ = false, carry_ = false;
  std::vector<Tensor> buffers_;
  std::vector<Tensor> carried_;   // a view of h_last_ (carried())
  std::vector<Tensor> starting_;  // and of h_first_ (carry_all swaps them)
  T *h_last_ = nullptr, *h_first_ = nullptr;
  T *ys_ = nullptr, *saved_ = nullptr;  // ys_: the outputs of every layer but the last
  const T* y_ = nullptr;                // the last forward's y: the last layer's outputs
  T* dbuf_[2] = {nullptr, nullptr};
  void* ws_ = nullptr;
};

}  // namespace slipstream::nn
