// The Mamba-1 sequence model (mamba-ssm's MixerModel without the embedding) as math on raw
// pointers over a set of ops (stages/ops/cpu_ops.h): CpuOps<T> runs it on the CPU, T = double for
// the finite-difference tests and float for the stage; DeviceOps (device_ops.h) runs the same code
// on a CUDA device, every op enqueued on one stream.
//
//   h_0 = x W_inᵀ + b_in (only when Din != d_model; else h_0 = x)
//   h_{l+1} = h_l + Mixer_l(RMSNorm_l(h_l)),  y = RMSNorm_f(h_L)
//   Mixer: (x, z) = split(in_proj(h)); u = SiLU(conv1d(x) + b); (dt, B, C) = x_proj(u);
//          delta = dt_proj.weight dt; s = scan(u, delta, A = -exp(A_log), B, C, D, z,
//          delta_bias = dt_proj.bias, softplus); out_proj(s)
//
// Weights, gradients and bf16 shadows live in flat buffers addressed through layout() (names
// and shapes are mamba-ssm's), on the ops' device. All activations and scratch are sized by
// resize(B, L) from the device's pool; forward and backward allocate nothing and never wait
// for the device.
//
// Carried state (set_carry(true)): each batch row continues the sequence the same row of the
// previous batch ended, when forward's `continues` says so (1; 0 starts it afresh): every
// layer's conv starts from that row's last d_conv - 1 inputs and its scan from that row's last
// state. The state is a constant to the backward (truncated backpropagation through time: no
// gradient flows into the previous window).
#pragma once

#include <functional>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/tensor.h"
#include "kernels/gemm.h"
#include "stages/nn/model_flops.h"
#include "stages/nn/param_layout.h"
#include "stages/ops/cpu_ops.h"

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
  // Elements from one layer's parameters to the next's (every layer has the same shapes, added
  // in the same order): a parameter of every layer is one strided pass.
  size_t layer_stride = 0;

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
    layer_stride = layers.size() > 1 ? layers[1].norm - layers[0].norm : 0;
  }
};

// Floating-point operations of one forward and one backward over (B, L) positions. The GEMMs
// are counted as forward()/backward() issue them (a test holds the two together); the scan,
// convolution, norms and gates by their per-element operation counts, an estimate.
inline ModelFlops mamba_flops(const MambaConfig& c, int64_t B, int64_t L, bool input_grad) {
  const double M = double(B) * double(L), dm = c.d_model, di = c.d_inner(), N = c.d_state;
  const double R = c.rank(), P = R + 2 * N, K = c.d_conv, nl = c.layers;
  ModelFlops f;
  // Per position and layer: in_proj, x_proj, dt_proj, out_proj; the backward has the input and
  // the weight gradient of each.
  const double layer_gemm = 2 * (dm * 2 * di + di * P + R * di + di * dm);
  f.gemm_forward = M * nl * layer_gemm;
  f.gemm_backward = 2 * f.gemm_forward;
  if (c.has_input_proj()) {
    f.gemm_forward += M * 2 * c.din * dm;
    f.gemm_backward += M * 2 * c.din * dm * (input_grad ? 2 : 1);
  }
  // Scan per (channel, state): exp(delta A), delta B u, h = a h + b, y += C h; per channel the
  // softplus, D skip and SiLU(z) gate. The backward recomputes the states, then runs the
  // reverse recurrence and the gradients of delta, A, B, C.
  const double scan_f = di * N * 7 + di * 12, scan_b = di * N * 17 + di * 20;
  const double conv_f = di * (2 * K + 5), conv_b = di * (4 * K + 10);
  const double norm_f = 4 * dm, norm_b = 8 * dm;
  f.other_forward = M * (nl * (scan_f + conv_f + norm_f + dm) + norm_f);
  f.other_backward = M * (nl * (scan_b + conv_b + norm_b + dm) + norm_b);
  return f;
}

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

template <class T, class Ops = ops::CpuOps<T>>
class MambaModel {
  static_assert(std::is_same_v<T, typename Ops::Scalar>, "the ops compute in T");

 public:
  explicit MambaModel(const MambaConfig& c, Ops ops = Ops()) : c_(c), lay_(c), ops_(ops) {
    if (c.d_model < 1 || c.din < 1 || c.layers < 1 || c.d_state < 1 || c.expand < 1)
      throw std::invalid_argument("mamba: dimensions must be positive");
    if (c.d_state > Ops::kMaxState)
      throw std::invalid_argument("mamba: d_state must be at most " +
                                  std::to_string(Ops::kMaxState) + " on " + ops.device().str() +
                                  ", got " + std::to_string(c.d_state));
    if (c.d_conv < 1 || c.d_conv > kernels::kConvMaxWidth)
      throw std::invalid_argument("mamba: d_conv must be in [1, " +
                                  std::to_string(kernels::kConvMaxWidth) + "]");
  }

  const MambaConfig& config() const { return c_; }
  const MambaLayout& layout() const { return lay_; }
  const Ops& ops() const { return ops_; }
  int batch() const { return B_; }
  int length() const { return L_; }

  // Carry each row's state from one forward to the next (see the top); before resize().
  void set_carry(bool on) {
    if (on != carry_) B_ = L_ = 0;  // resize() allocates (or drops) the state buffers
    carry_ = on;
  }
  bool carries() const { return carry_; }
  // The state the last forward left, as the next carry() reads it (the buffers themselves: a
  // checkpoint saves them, a resume writes them back): the scan states, then the conv inputs.
  const std::vector<Tensor>& carried() const { return carried_; }
  // Bytes of the activation, gradient and state buffers resize() allocated (scratch not counted).
  size_t buffer_bytes() const {
    size_t n = 0;
    for (const Tensor& t : buffers_) n += t.nbytes();
    return n;
  }
  // Forgets every row's carried state (the next forward starts each row afresh whatever its
  // `continues`): around a validation pass, whose batches are other sequences.
  void clear_carry() {
    if (!carry_ || B_ <= 0) return;
    ops_.zero(scan_last_, carry_scan_elems());
    ops_.zero(conv_last_, carry_conv_elems());
  }

  // Sizes every activation and scratch buffer for (B, L). The only allocating call; bf16
  // buffers only when `bf16` (T = float).
  void resize(int B, int L, bool bf16) {
    if (B == B_ && L == L_ && bf16 == bf16_) return;
    if (bf16 && !std::is_same_v<T, float>) throw std::logic_error("mamba: bf16 needs T = float");
    B_ = B, L_ = L, bf16_ = bf16;
    const size_t M = static_cast<size_t>(B) * static_cast<size_t>(L);
    const size_t dm = dm_(), di = di_(), N = N_(), P = P_(), nl = static_cast<size_t>(c_.layers);
    buffers_.clear();
    // On a device in bf16, activations only the bf16 GEMMs read are kept as their bf16 copies
    // alone: the normed inputs, the scan's outputs and in_proj's output gradient (dxc and dz) are
    // written by their kernels in bf16 only (no fp32 write or buffer: at gpu_standard 110 MB of
    // writes a step fewer and 75 MiB less memory). The CPU's bf16 form rounds fp32 values it
    // keeps.
    const bool copies_only = kOnDevice && bf16;
    h_ = buf((nl + 1) * M * dm, "mamba residual stream");
    rstd_ = buf(nl * M, "mamba norm statistics");
    xn_ = buf(copies_only ? 0 : nl * M * dm, "mamba normed input");
    xz_ = buf(nl * M * 2 * di, "mamba conv input and gate");  // in_proj's two halves
    conv_ = buf(Ops::kSavesConvInput ? nl * M * di : 0, "mamba conv output");
    u_ = buf(nl * M * di, "mamba scan input");
    dbc_ = buf(nl * M * P, "mamba x_proj output");
    delta_ = buf(nl * M * di, "mamba delta");
    Bm_ = buf(kOnDevice ? 0 : nl * M * N, "mamba B");  // on a device, read inside dbc
    Cm_ = buf(kOnDevice ? 0 : nl * M * N, "mamba C");
    ys_ = buf(copies_only ? 0 : nl * M * di, "mamba scan output");
    A_ = buf(kOnDevice ? 0 : nl * di * N, "mamba A");  // on a device, made by the scan itself
    scan_states_elems_ =
        ops_.scan_chunk_states_elems(B, L, static_cast<int>(di), static_cast<int>(N));
    scan_states_ = buf(nl * scan_states_elems_, "mamba scan chunk states");
    rstd_f_ = buf(M, "mamba final norm statistics");
    // Backward scratch.
    dh_ = buf(M * dm, "mamba gradient");
    dxn_ = buf(M * dm, "mamba gradient");
    dys_ = buf(M * di, "mamba gradient");
    du_ = buf(M * di, "mamba gradient");
    ddelta_ = buf(M * di, "mamba gradient");
    dconv_ = buf(Ops::kSavesConvInput ? M * di : 0, "mamba gradient");
    dxz_ = buf(copies_only ? 0 : M * 2 * di, "mamba gradient");  // in_proj's output gradient
    dBm_ = buf(kOnDevice ? 0 : M * N, "mamba gradient");         // on a device, written inside ddbc
    dCm_ = buf(kOnDevice ? 0 : M * N, "mamba gradient");
    ddbc_ = buf(M * P, "mamba gradient");
    dA_ = buf(kOnDevice ? 0 : di * N, "mamba gradient");
    // The carried state: what the previous forward left (last) and what this one starts from.
    carried_.clear();
    starting_.clear();
    scan_last_ = buf(carry_ ? carry_scan_elems() : 0, "mamba carried scan state");
    if (scan_last_) carried_.push_back(buffers_.back());
    scan_first_ = buf(carry_ ? carry_scan_elems() : 0, "mamba carried scan state");
    if (scan_first_) starting_.push_back(buffers_.back());
    conv_last_ = buf(carry_ ? carry_conv_elems() : 0, "mamba carried conv inputs");
    if (conv_last_) carried_.push_back(buffers_.back());
    conv_first_ = buf(carry_ ? carry_conv_elems() : 0, "mamba carried conv inputs");
    if (conv_first_) starting_.push_back(buffers_.back());
    const size_t din = static_cast<size_t>(c_.din);
    ops::ScratchNeeds need;
    need.B = B, need.L = L, need.channels = static_cast<int>(di), need.state = static_cast<int>(N);
    need.conv_width = c_.d_conv, need.norm_rows = M, need.norm_cols = dm;
    if (bf16) {
      // gemm_bf16 on the CPU widens op(A) and op(B): the largest M·K + K·N over all products.
      auto lin = [&](size_t in, size_t out) {
        need.gemm_ws_elems = std::max(need.gemm_ws_elems, M * (in + out) + in * out);
      };
      lin(din, dm);
      lin(dm, 2 * di);
      lin(di, P);
      lin(static_cast<size_t>(c_.rank()), di);
      lin(di, dm);
    }
    scratch_t_ = ops_.template alloc<uint8_t>(ops_.scratch_bytes(need), "mamba scratch");
    scratch_ = scratch_t_.numel() ? scratch_t_.raw() : nullptr;
    xin_bf_ = bbuf(bf16 && c_.has_input_proj() ? M * din : 0, "mamba bf16 input");
    xn_bf_ = bbuf(bf16 ? nl * M * dm : 0, "mamba bf16 activations");
    u_bf_ = bbuf(bf16 ? nl * M * di : 0, "mamba bf16 activations");
    ys_bf_ = bbuf(bf16 ? nl * M * di : 0, "mamba bf16 activations");
    dy_bf_ = bbuf(
        bf16 ? M * (kOnDevice ? std::max(dm, 2 * di + std::max(di, P)) : std::max({2 * di, dm, P}))
             : 0,
        "mamba bf16 gradients");
  }

  // carry() with every row continuing (a stream's frame in which no game restarts): the state
  // the last forward left, where it lies, is the one the next starts from; the two sets of
  // buffers trade places instead of a copy (the forward writes every row's last state). A CUDA
  // graph of the frame then alternates between two (the buffers' addresses differ).
  void carry_all() {
    if (!carry_ || B_ <= 0) throw std::logic_error("mamba: carry_all() needs set_carry and resize");
    std::swap(scan_first_, scan_last_);
    std::swap(conv_first_, conv_last_);
    std::swap(carried_, starting_);
  }

  // With a carried state, before each forward: the state it starts from, row by row, the one
  // the previous forward left where `continues` (B) is 1, zeros where it is 0. Every layer's scan
  // states and every layer's convolution inputs (each kind lies layer after layer) in one pass.
  void carry(const T* continues) {
    if (!carry_ || B_ <= 0) throw std::logic_error("mamba: carry() needs set_carry and resize");
    const size_t B = static_cast<size_t>(B_), scan = carry_scan_elems() / nl_() / B;
    const size_t conv = carry_conv_elems() / nl_() / B;
    ops_.scale_rows(scan_last_, continues, scan_first_, nl_(), B, scan, conv ? conv_last_ : nullptr,
                    conv_first_, conv);
  }

  // In the bf16 form (a `wb` given), for the forwards and backwards from here on: x_bf, x's bf16
  // copy made by whoever made x (null: the input projection's GEMMs round x themselves), and
  // y_bf, where the final norm writes y's (null: nowhere). Both fp32_to_bf16's rounding.
  void set_bf16_copies(const uint16_t* x_bf, uint16_t* y_bf) {
    x_bf_given_ = x_bf;
    y_bf_ = y_bf;
  }
  // Whether the next forwards are followed by no backward (validation, inference): on a device
  // the scan then makes Δ itself from dt and dt_proj's weight (dt_rank up to
  // kScanMaxDtRank), with no dt_proj GEMM and no Δ tensor, one launch a layer fewer.
  void set_forward_only(bool on) { forward_only_ = on; }

  // x (B, L, din) -> y (B, L, d_model). `wb` is the bf16 shadow of `w` (same layout), used by
  // the GEMMs together with bf16-rounded activations; null for full precision. With a carried
  // state, each row starts from the state carry() set and leaves its own for the next.
  void forward(const T* x, const T* w, const uint16_t* wb, T* y) {
    check_precision(wb);
    const int M = B_ * L_, dm = c_.d_model, di = c_.d_inner(), N = c_.d_state, R = c_.rank();
    const int P = R + 2 * N;
    const size_t Ms = static_cast<size_t>(M);
    T* h0 = h_;
    xin_bf_used_ = nullptr;
    const bool fold_dt = kOnDevice && forward_only_ && R <= max_folded_dt_rank();
    last_forward_only_ = forward_only_;
    // A frame no backward follows (a policy's): on a device, the whole stack in one launch where
    // the kernel table's switch is on and the model fits the kernel (kernels/mamba_frame.h).
    if constexpr (kOnDevice)
      if (forward_only_ && L_ == 1) {
        const auto frame = frame_shape();
        if (ops_.takes_mamba_frame(frame)) {
          ops_.mamba_frame_forward(frame, x, w, wb, conv_first_, conv_last_, scan_first_,
                                   scan_last_, y, wb ? y_bf_ : nullptr);
          return;
        }
      }
    if (c_.has_input_proj()) {
      const uint16_t* xb =
          wb && x_bf_given_ ? x_bf_given_ : round(x, xin_bf_, Ms * static_cast<size_t>(c_.din), wb);
      xin_bf_used_ = xb;  // the backward's weight gradient reads the same copy
      mm(false, true, M, dm, c_.din, x, xb, c_.din, w + lay_.input_proj_w,
         bf(wb, lay_.input_proj_w), c_.din, T(0), h0, dm);
      // On a device the first norm adds the bias as it reads h_0 (h_0 is kept without it).
      if constexpr (!kOnDevice)
        ops_.add_bias_rows(h0, w + lay_.input_proj_b, Ms, static_cast<size_t>(dm));
    } else {
      ops_.copy(h0, x, Ms * dm_());
    }
    // A = -exp(A_log) of every layer in one pass (on a device the scan makes A as it reads A_log).
    if constexpr (!kOnDevice)
      ops_.neg_exp(w + lay_.layers[0].A_log, c_.layers > 1 ? lay_.layer_stride : di_() * N_(), A_,
                   nl_(), di_() * N_());
    for (int l = 0; l < c_.layers; ++l) {
      const auto& Lw = lay_.layers[static_cast<size_t>(l)];
      const Act a = act(l);
      T* hn = a.h + Ms * dm_();
      // The norm writes the GEMMs' bf16 copy itself, and h's copy into the next layer's stream,
      // onto which out_proj accumulates (the residual).
      uint16_t* xnb = wb ? a.xn_bf : nullptr;
      ops_.rmsnorm_forward(a.h, w + Lw.norm, a.xn, a.rstd, Ms, dm_(), c_.eps, xnb, hn,
                           h_bias(w, l));
      // in_proj: on a device one GEMM writes x and z side by side (rows 2·d_inner long, read in
      // place by the convolution and the scan); on the CPU its two halves of rows go to x and z
      // apart (its convolution and scan read contiguous rows without copies).
      const int ld = xz_ld();
      if constexpr (kOnDevice) {
        mm(false, true, M, 2 * di, dm, a.xn, xnb, dm, w + Lw.in_proj, bf(wb, Lw.in_proj), dm, T(0),
           a.xc, ld);
      } else {
        const size_t in_z = Lw.in_proj + di_() * dm_();
        mm(false, true, M, di, dm, a.xn, xnb, dm, w + Lw.in_proj, bf(wb, Lw.in_proj), dm, T(0),
           a.xc, ld);
        mm(false, true, M, di, dm, a.xn, xnb, dm, w + in_z, bf(wb, in_z), dm, T(0), a.z, ld);
      }
      uint16_t* ub = wb ? a.u_bf : nullptr;  // written by the convolution itself
      // The convolution also keeps each row's last d_conv - 1 inputs (those of its window, or
      // carried from before it in a window shorter than that) in conv_last for the next window.
      ops_.conv_silu_forward(a.xc, a.conv_first, w + Lw.conv_w, w + Lw.conv_b, a.conv, a.u, B_, L_,
                             di, c_.d_conv, ub, zero_unless_apart(ld), a.conv_last);
      mm(false, true, M, P, di, a.u, ub, di, w + Lw.x_proj, bf(wb, Lw.x_proj), di, T(0), a.dbc, P);
      // dt_proj runs in fp32 in both precisions: it reads dt (x_proj's fp32 output) and the fp32
      // master weight, so x_proj's output needs no bf16 copy (a cast launch a layer, in every
      // step and frame), and Δ, which decays the state through exp(Δ A), is made without bf16's
      // rounding of dt. Its inner dimension is dt_rank (d_model / 16): a small product either way.
      // Where no backward follows, a device's scan makes Δ itself (set_forward_only).
      if (!fold_dt)
        mm(false, true, M, di, R, a.dbc, nullptr, P, w + Lw.dt_w, nullptr, R, T(0), a.delta, di);
      if constexpr (!kOnDevice) {
        ops_.copy_cols(a.dbc + R, P_(), a.Bm, N_(), Ms, N_());
        ops_.copy_cols(a.dbc + R + N, P_(), a.Cm, N_(), Ms, N_());
      }
      uint16_t* ysb = wb ? a.ys_bf : nullptr;  // written by the scan itself
      // The chunk states the backward would read, only where a backward follows.
      ops_.selective_scan_forward(
          a.u, fold_dt ? nullptr : a.delta, scan_A(w, Lw, a), a.Bm, a.Cm, w + Lw.D, a.z,
          w + Lw.dt_b, a.scan_first, a.ys, a.scan_last, forward_only_ ? nullptr : a.scan_states, B_,
          L_, di, N, ysb, bc_ld(), zero_unless_apart(ld), kOnDevice, fold_dt ? a.dbc : nullptr,
          fold_dt ? w + Lw.dt_w : nullptr, fold_dt ? R : 0);
      mm(false, true, M, dm, di, a.ys, ysb, di, w + Lw.out_proj, bf(wb, Lw.out_proj), di, T(1), hn,
         dm);
    }
    ops_.rmsnorm_forward(h_ + static_cast<size_t>(c_.layers) * Ms * dm_(), w + lay_.norm_f, y,
                         rstd_f_, Ms, dm_(), c_.eps, wb ? y_bf_ : nullptr);
  }

  // After forward on the same x: dy (B, L, d_model) -> dx (=, may be null when not wanted);
  // parameter gradients accumulate (+=) into g (the layout of w).
  // `layer_done(l)`, when given, is called once layer l's parameter gradients are final (enqueued,
  // on a device).
  void backward(const T* x, const T* dy, const T* w, const uint16_t* wb, T* g, T* dx,
                const std::function<void(int)>* layer_done = nullptr) {
    check_precision(wb);
    if (last_forward_only_)
      throw std::logic_error("mamba: a backward after a forward told no backward follows it");
    const int M = B_ * L_, dm = c_.d_model, di = c_.d_inner(), N = c_.d_state, R = c_.rank();
    const int P = R + 2 * N;
    const size_t Ms = static_cast<size_t>(M);
    T* dh = dh_;
    // The bf16 copies the backward GEMMs read share dy_bf_, each written after the GEMMs that
    // read the one before it (stream order). dh's is written by the norm that produces dh, dΔ's
    // and dz's by the scan, dxc's by the convolution: no cast launch for them. dxc and dz (and
    // their copies) lie as in the forward's x and z: side by side on a device, where dz's copy
    // lives from the scan to in_proj, so dΔ's and x_proj's gradient's copies come and go past
    // them; on the CPU dz's copy sits past the first M·d_inner, where the others come and go.
    uint16_t* dyb = dy_bf_;
    uint16_t* const dh_bf = wb ? dyb : nullptr;
    const int ld = xz_ld();
    T* const dxc = dxz_;  // null on a device in bf16: only the copies are written
    T* const dz = dxz_ ? dxz_ + (kOnDevice ? di_() : Ms * di_()) : nullptr;
    uint16_t* const passing = wb ? dyb + (kOnDevice ? Ms * 2 * di_() : 0) : nullptr;
    ops_.rmsnorm_backward(h_ + static_cast<size_t>(c_.layers) * Ms * dm_(), w + lay_.norm_f,
                          rstd_f_, dy, nullptr, dh, g + lay_.norm_f, Ms, dm_(), scratch_, dh_bf);
    for (int l = c_.layers - 1; l >= 0; --l) {
      const auto& Lw = lay_.layers[static_cast<size_t>(l)];
      const Act a = act(l);
      // out_proj: hn = h + ys W_outᵀ; the residual passes dh through unchanged.
      const uint16_t* dhb = dh_bf;
      mm(false, false, M, di, dm, dh, dhb, dm, w + Lw.out_proj, bf(wb, Lw.out_proj), di, T(0), dys_,
         di);
      mm(true, false, dm, di, M, dh, dhb, dm, a.ys, a.ys_bf, di, T(1), g + Lw.out_proj, di);
      // Scan; dA_log += dA · A, on a device by the scan's own sum of dA (given A_log, it makes A
      // itself), on the CPU from a fresh sum in dA_.
      T* const dA = kOnDevice ? g + Lw.A_log : dA_;
      if constexpr (!kOnDevice) ops_.zero(dA_, di_() * N_());
      uint16_t* const ddb = passing;
      uint16_t* const dzb = wb ? dyb + (kOnDevice ? di_() : Ms * di_()) : nullptr;
      // On a device dBm and dCm go straight into their columns of x_proj's output gradient.
      T* const dB = kOnDevice ? ddbc_ + R : dBm_;
      T* const dC = kOnDevice ? ddbc_ + R + N : dCm_;
      ops_.selective_scan_backward(a.u, a.delta, scan_A(w, Lw, a), a.Bm, a.Cm, w + Lw.D, a.z,
                                   w + Lw.dt_b, a.scan_first, a.scan_states, dys_, du_, ddelta_, dA,
                                   dB, dC, g + Lw.D, dz, g + Lw.dt_b, scratch_, B_, L_, di, N, ddb,
                                   dzb, bc_ld(), kOnDevice, zero_unless_apart(ld));
      if constexpr (!kOnDevice) ops_.mul_accumulate(g + Lw.A_log, dA_, a.A, di_() * N_());
      // dt_proj: delta = dt W_dtᵀ with dt the first R columns of dbc. dt's gradient takes the
      // bf16 GEMM like the other input gradients (dΔ's copy comes from the scan); the weight's is
      // fp32, as the forward (dt has no bf16 copy).
      mm(false, false, M, R, di, ddelta_, ddb, di, w + Lw.dt_w, bf(wb, Lw.dt_w), R, T(0), ddbc_, P);
      mm(true, false, di, R, M, ddelta_, nullptr, di, a.dbc, nullptr, P, T(1), g + Lw.dt_w, R);
      if constexpr (!kOnDevice) {
        ops_.copy_cols(dBm_, N_(), ddbc_ + R, P_(), Ms, N_());
        ops_.copy_cols(dCm_, N_(), ddbc_ + R + N, P_(), Ms, N_());
      }
      // x_proj: dbc = u W_xᵀ; u also feeds the scan, so its gradient adds onto du.
      const uint16_t* dpb = round(ddbc_, passing, Ms * P_(), wb);
      mm(false, false, M, di, P, ddbc_, dpb, P, w + Lw.x_proj, bf(wb, Lw.x_proj), di, T(1), du_,
         di);
      mm(true, false, P, di, M, ddbc_, dpb, P, a.u, a.u_bf, di, T(1), g + Lw.x_proj, di);
      uint16_t* const dxcb = wb ? dyb : nullptr;
      ops_.conv_silu_backward(a.xc, a.conv_first, w + Lw.conv_w, w + Lw.conv_b, a.conv, du_, dconv_,
                              dxc, g + Lw.conv_w, g + Lw.conv_b, B_, L_, di, c_.d_conv, scratch_,
                              dxcb, zero_unless_apart(ld));
      // in_proj (on a device one GEMM each way over dxc and dz side by side; on the CPU by its two
      // halves of rows), then the block's RMSNorm; its input gradient joins the residual stream.
      if constexpr (kOnDevice) {
        mm(false, false, M, dm, 2 * di, dxc, dxcb, ld, w + Lw.in_proj, bf(wb, Lw.in_proj), dm, T(0),
           dxn_, dm);
        mm(true, false, 2 * di, dm, M, dxc, dxcb, ld, a.xn, a.xn_bf, dm, T(1), g + Lw.in_proj, dm);
      } else {
        const size_t in_z = Lw.in_proj + di_() * dm_();
        mm(false, false, M, dm, di, dxc, dxcb, ld, w + Lw.in_proj, bf(wb, Lw.in_proj), dm, T(0),
           dxn_, dm);
        mm(false, false, M, dm, di, dz, dzb, ld, w + in_z, bf(wb, in_z), dm, T(1), dxn_, dm);
        mm(true, false, di, dm, M, dxc, dxcb, ld, a.xn, a.xn_bf, dm, T(1), g + Lw.in_proj, dm);
        mm(true, false, di, dm, M, dz, dzb, ld, a.xn, a.xn_bf, dm, T(1), g + in_z, dm);
      }
      ops_.rmsnorm_backward(a.h, w + Lw.norm, a.rstd, dxn_, dh, dh, g + Lw.norm, Ms, dm_(),
                            scratch_, dh_bf, h_bias(w, l));
      if (layer_done) (*layer_done)(l);
    }
    if (c_.has_input_proj()) {
      const int din = c_.din;
      const uint16_t* dhb = dh_bf;  // written by layer 0's norm
      if (dx)
        mm(false, false, M, din, dm, dh, dhb, dm, w + lay_.input_proj_w, bf(wb, lay_.input_proj_w),
           din, T(0), dx, din);
      mm(true, false, dm, din, M, dh, dhb, dm, x, xin_bf_used_, din, T(1), g + lay_.input_proj_w,
         din);
      ops_.column_sum_accumulate(dh, g + lay_.input_proj_b, Ms, dm_(), scratch_);
    } else if (dx) {
      ops_.copy(dx, dh, Ms * dm_());
    }
  }

 private:
  // One layer's saved activations.
  struct Act {
    T *h, *rstd, *xn, *xc, *z, *conv, *u, *dbc, *delta, *Bm, *Cm, *ys, *A;
    uint16_t *xn_bf, *u_bf, *ys_bf;
    T *scan_first, *scan_last, *conv_first, *conv_last;  // carried state; null without
    T* scan_states;  // the scan's chunk starts from the forward for the backward; null: none
  };
  Act act(int l) const {
    const size_t M = static_cast<size_t>(B_) * static_cast<size_t>(L_), k = static_cast<size_t>(l);
    auto at = [&](T* p, size_t per) { return p ? p + k * per : nullptr; };
    auto atb = [&](uint16_t* p, size_t per) { return p ? p + k * per : nullptr; };
    return {at(h_, M * dm_()),
            at(rstd_, M),
            at(xn_, M * dm_()),
            at(xz_, M * 2 * di_()),
            at(xz_, M * 2 * di_()) + (kOnDevice ? di_() : M * di_()),
            at(conv_, M * di_()),
            at(u_, M * di_()),
            at(dbc_, M * P_()),
            at(delta_, M * di_()),
            kOnDevice ? at(dbc_, M * P_()) + c_.rank() : at(Bm_, M * N_()),
            kOnDevice ? at(dbc_, M * P_()) + c_.rank() + c_.d_state : at(Cm_, M * N_()),
            at(ys_, M * di_()),
            at(A_, di_() * N_()),
            atb(xn_bf_, M * dm_()),
            atb(u_bf_, M * di_()),
            atb(ys_bf_, M * di_()),
            at(scan_first_, carry_scan_elems() / nl_()),
            at(scan_last_, carry_scan_elems() / nl_()),
            at(conv_first_, carry_conv_elems() / nl_()),
            at(conv_last_, carry_conv_elems() / nl_()),
            at(scan_states_, scan_states_elems_)};
  }
  size_t nl_() const { return static_cast<size_t>(c_.layers); }
  // Elements of the carried scan states (layers, B, d_inner, d_state) and conv inputs (layers,
  // B, d_conv - 1, d_inner).
  size_t carry_scan_elems() const { return nl_() * static_cast<size_t>(B_) * di_() * N_(); }
  size_t carry_conv_elems() const {
    return nl_() * static_cast<size_t>(B_) * static_cast<size_t>(c_.d_conv - 1) * di_();
  }

  // A zeroed buffer of n elements of T on the ops' device (null when n == 0), kept alive here.
  T* buf(size_t n, const char* what) {
    if (n == 0) return nullptr;
    buffers_.push_back(ops_.template alloc<T>(n, what));
    return buffers_.back().template data<T>();
  }
  uint16_t* bbuf(size_t n, const char* what) {
    if (n == 0) return nullptr;
    buffers_.push_back(ops_.template alloc<uint16_t>(n, what));
    return buffers_.back().template data<uint16_t>();
  }

  size_t dm_() const { return static_cast<size_t>(c_.d_model); }
  size_t di_() const { return static_cast<size_t>(c_.d_inner()); }
  size_t N_() const { return static_cast<size_t>(c_.d_state); }
  size_t P_() const { return static_cast<size_t>(c_.rank() + 2 * c_.d_state); }
  // On a device the scan reads Bm and Cm inside x_proj's output (dbc's rows: dt, Bm, Cm), rows P
  // apart, its backward writes dBm and dCm inside x_proj's output gradient and applies dA_log's
  // chain rule in its own sum of dA, instead of copies in and out, a zeroed dA and a product (six
  // launches a layer fewer). The CPU does those steps itself, allocation-free.
  static constexpr bool kOnDevice = Ops::kBackend != KernelBackend::cpu;
  // The model as the one-launch frame kernel takes it (device only).
  auto frame_shape() const {
    typename Ops::Table::MambaFrame f{};
    f.rows = B_, f.din = c_.din, f.d_model = c_.d_model, f.d_inner = c_.d_inner();
    f.d_state = c_.d_state, f.dt_rank = c_.rank(), f.d_conv = c_.d_conv, f.layers = c_.layers;
    f.eps = static_cast<float>(c_.eps);
    f.input_proj = c_.has_input_proj() ? 1 : 0;
    f.input_proj_w = lay_.input_proj_w, f.input_proj_b = lay_.input_proj_b;
    f.norm_f = lay_.norm_f, f.layer_stride = lay_.layer_stride;
    const auto& L0 = lay_.layers[0];
    f.norm = L0.norm, f.in_proj = L0.in_proj, f.conv_w = L0.conv_w, f.conv_b = L0.conv_b;
    f.x_proj = L0.x_proj, f.dt_w = L0.dt_w, f.dt_b = L0.dt_b, f.A_log = L0.A_log, f.D = L0.D;
    f.out_proj = L0.out_proj;
    return f;
  }
  // The largest dt_rank whose dt_proj a device's scan folds in (forward-only passes).
  static constexpr int max_folded_dt_rank() {
    if constexpr (kOnDevice)
      return Ops::Table::kScanMaxDtRank;
    else
      return 0;
  }
  int bc_ld() const { return kOnDevice ? static_cast<int>(P_()) : 0; }
  // The bias row layer l's norm adds to its input: the input projection's, on a device, at layer
  // 0 (h_0 is kept without it there; on the CPU it is added to h_0 itself).
  const T* h_bias(const T* w, int l) const {
    return kOnDevice && l == 0 && c_.has_input_proj() ? w + lay_.input_proj_b : nullptr;
  }
  // Elements from one row of x (in_proj's first half) to the next, and of z, dxc and dz: on a
  // device x and z lie side by side (one GEMM makes both, one takes both gradients), on the CPU
  // apart. The ops take 0 for contiguous rows.
  int xz_ld() const { return (kOnDevice ? 2 : 1) * c_.d_inner(); }
  int zero_unless_apart(int ld) const { return ld == c_.d_inner() ? 0 : ld; }
  // What the scan takes as A: on a device the layer's A_log itself (the scan makes A = −exp(A_log)
  // as it reads it: no launch a step for A), on the CPU the A the forward made.
  const T* scan_A(const T* w, const MambaLayout::Layer& Lw, const Act& a) const {
    return kOnDevice ? w + Lw.A_log : a.A;
  }

  void check_precision(const uint16_t* wb) const {
    if (B_ <= 0) throw std::logic_error("mamba: resize() before forward/backward");
    if ((wb != nullptr) != bf16_)
      throw std::logic_error("mamba: bf16 shadow given/absent but buffers sized for the other");
  }

  static const uint16_t* bf(const uint16_t* wb, size_t off) { return wb ? wb + off : nullptr; }

  // The bf16 copy of an activation for the GEMMs (null in full precision).
  const uint16_t* round(const T* src, uint16_t* dst, size_t n, const uint16_t* wb) const {
    if (!wb || !dst) return nullptr;
    ops_.to_bf16(src, dst, n);
    return dst;
  }

  // C = op(A) op(B) + beta C; with both bf16 copies present, the bf16 GEMM (FP32 accumulate).
  void mm(bool ta, bool tb, int M, int N, int K, const T* A, const uint16_t* Ab, int lda,
          const T* B, const uint16_t* Bb, int ldb, T beta, T* C, int ldc) const {
    ops_.gemm(ta, tb, M, N, K, A, Ab, lda, B, Bb, ldb, beta, C, ldc, scratch_);
  }

  MambaConfig c_;
  MambaLayout lay_;
  Ops ops_;
  int B_ = 0, L_ = 0;
  bool bf16_ = false, carry_ = false;
  std::vector<Tensor> buffers_;   // owns every buffer below
  std::vector<Tensor> carried_;   // views of scan_last_ and conv_last_ (carried())
  std::vector<Tensor> starting_;  // and of scan_first_ and conv_first_ (carry_all swaps them)
  Tensor scratch_t_;
  void* scratch_ = nullptr;
  T *h_ = nullptr, *rstd_ = nullptr, *xn_ = nullptr, *xz_ = nullptr;
  T *conv_ = nullptr, *u_ = nullptr, *dbc_ = nullptr, *delta_ = nullptr, *Bm_ = nullptr;
  T *Cm_ = nullptr, *ys_ = nullptr, *A_ = nullptr, *rstd_f_ = nullptr;
  T *dh_ = nullptr, *dxn_ = nullptr, *dys_ = nullptr, *du_ = nullptr;
  T *ddelta_ = nullptr, *dconv_ = nullptr, *dxz_ = nullptr, *dBm_ = nullptr;
  T *dCm_ = nullptr, *ddbc_ = nullptr, *dA_ = nullptr;
  T *scan_first_ = nullptr, *scan_last_ = nullptr, *conv_first_ = nullptr, *conv_last_ = nullptr;
  T* scan_states_ = nullptr;
  size_t scan_states_elems_ = 0;  // a layer's
  uint16_t *xin_bf_ = nullptr, *xn_bf_ = nullptr, *u_bf_ = nullptr;
  uint16_t *ys_bf_ = nullptr, *dy_bf_ = nullptr;
  const uint16_t* x_bf_given_ = nullptr;  // set_bf16_copies
  uint16_t* y_bf_ = nullptr;
  const uint16_t* xin_bf_used_ = nullptr;                  // x's copy the last forward's GEMM read
  bool forward_only_ = false, last_forward_only_ = false;  // set_forward_only
};

}  // namespace slipstream::nn
