// controller_heads: per-frame features x (B, W, H) -> logits of the six controller heads
// (buttons 8, main/c stick x/y 17 each, shoulder 5). One linear layer per head, or a shared
// SiLU hidden layer first (`hidden` > 0); with `prev_input` connected (the embedding's previous
// input: the controller and its classes), a direct linear path from it to every head's logits,
// so repeating the last input needs no detour through the temporal model; with `autoregressive`,
// each of the controller's items (8 buttons, 5 axes, in that order) conditioned on the items
// before it (model_math.h's heads_ar_*: the recorded ones in training, the model's own most likely
// ones otherwise; a bot samples them in order, controller_choice.h). The six heads run as one
// fused (M, 81) GEMM; their parameters are row-views of the fused weight, named like PyTorch
// modules (buttons.weight, ...). One source for every backend: the math is written against the
// model ops (stages/nn), so the CPU kernels or the CUDA kernels (on the run's stream, cuBLASLt) run
// it; the weights live in one flat store on the run's device. bf16 precision: the GEMMs take
// bf16-rounded operands (the optimizer's shadow of the weights), accumulating in fp32, forward and
// backward alike.
#include <cmath>
#include <random>

#include "engine/registry.h"
#include "stages/melee/melee_kernels.h"
#include "stages/melee/model_math.h"
#include "stages/nn/param_store.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {
using namespace melee;

// Where each weight sits in the store: the hidden layer, then the fused head weight (81, In)
// whose rows are the heads' weights in order, then the fused bias (81), then (P > 0) the direct
// path's weight (81, P) from the previous input, then (ar) the autoregressive weight (81, 81).
struct HeadsLayout {
  int H = 0, hidden = 0, In = 0, P = 0;
  bool ar = false;
  size_t wh = 0, bh = 0, wo = 0, bo = 0, wp = 0, wa = 0;
  nn::ParamLayout params;
  HeadsLayout(int H_, int hidden_, int P_, bool ar_)
      : H(H_), hidden(hidden_), In(hidden_ > 0 ? hidden_ : H_), P(P_), ar(ar_) {
    if (hidden > 0) {
      wh = params.add("hidden.weight", {hidden, H}, true);
      bh = params.add("hidden.bias", {hidden}, false);
    }
    for (int h = 0; h < kHeads; ++h) {
      const size_t off =
          params.add(std::string(kHeadNames[h]) + ".weight", {head_width(h), In}, true);
      if (h == 0) wo = off;
    }
    for (int h = 0; h < kHeads; ++h) {
      const size_t off = params.add(std::string(kHeadNames[h]) + ".bias", {head_width(h)}, false);
      if (h == 0) bo = off;
    }
    if (P > 0) wp = params.add("prev.weight", {kHeadsWidth, P}, true);
    if (ar) wa = params.add("ar.weight", {kHeadsWidth, kHeadsWidth}, true);
  }
};

// What the autoregressive form conditions on: the recorded items (training: the loader's targets
// and the embedding's mirror flags), or the model's own most likely ones (every other pass).
struct ArInputs {
  bool teacher = false;
  const float* target_buttons = nullptr;
  const int32_t* target_sticks = nullptr;
  const uint8_t* mirrored = nullptr;  // may be null: nothing mirrored
  size_t window = 1;
};

// The heads' math over whichever ops the run uses.
class HeadsRunner {
 public:
  virtual ~HeadsRunner() = default;
  virtual void reserve(int64_t M) = 0;
  // x (M, H) and prev (M, P; null when P is 0) -> out[h] (M, head_width(h)); `ar` is read
  // only by the autoregressive form. x_bf, prev_bf: their bf16 copies where the stages before
  // wrote them (null: the bf16 form rounds them itself), read by this forward's GEMMs and its
  // backward's.
  virtual void forward(const float* x, const float* prev, const uint16_t* x_bf,
                       const uint16_t* prev_bf, const ArInputs& ar, int M, const nn::ParamStore& st,
                       float* const out[kHeads]) = 0;
  // After a teacher-forced forward. dout[h] may be null (no gradient for that head).
  // dx (M, H) =, weight gradients +=.
  virtual void backward(const float* x, const float* prev, int M, const nn::ParamStore& st,
                        const float* const dout[kHeads], float* dx) = 0;
  virtual void refresh_shadow(const nn::ParamStore& st) const = 0;
};

template <class Ops>
class HeadsRunnerOn final : public HeadsRunner {
 public:
  HeadsRunnerOn(const HeadsLayout& lay, bool bf16, Ops ops) : L_(lay), bf16_(bf16), o_(ops) {}

  void refresh_shadow(const nn::ParamStore& st) const override { st.refresh_shadow(o_); }

  // Buffers for M = B·W positions, grown to the largest batch seen (none in steady state).
  void reserve(int64_t M) override {
    if (M <= cap_) return;
    cap_ = M;
    const size_t m = static_cast<size_t>(M), hid = static_cast<size_t>(L_.hidden);
    logits_ = o_.template alloc<float>(m * kHeadsWidth, "controller_heads logits");
    if (L_.ar) teacher_ = o_.template alloc<float>(m * kHeadsWidth, "controller_heads teacher");
    dlogits_ = o_.template alloc<float>(m * kHeadsWidth, "controller_heads dlogits");
    if (L_.hidden > 0) {
      pre_ = o_.template alloc<float>(m * hid, "controller_heads hidden pre-activation");
      act_ = o_.template alloc<float>(m * hid, "controller_heads hidden activation");
      dact_ = o_.template alloc<float>(m * hid, "controller_heads hidden grad");
    }
    if (bf16_) {
      x16_ = o_.template alloc<uint16_t>(m * static_cast<size_t>(L_.H), "controller_heads bf16 x");
      if (L_.P > 0)
        prev16_ = o_.template alloc<uint16_t>(m * static_cast<size_t>(L_.P),
                                              "controller_heads bf16 prev_input");
      dl16_ = o_.template alloc<uint16_t>(m * kHeadsWidth, "controller_heads bf16 dlogits");
      if (L_.ar)
        teacher16_ = o_.template alloc<uint16_t>(m * kHeadsWidth, "controller_heads bf16 teacher");
      if (L_.hidden > 0) {
        act16_ = o_.template alloc<uint16_t>(m * hid, "controller_heads bf16 activation");
        dact16_ = o_.template alloc<uint16_t>(m * hid, "controller_heads bf16 hidden grad");
      }
    }
    const int mi = static_cast<int>(M);
    ops::ScratchNeeds need;
    auto gemm = [&](int a, int b, int c) {
      need.gemm_ws_elems =
          std::max(need.gemm_ws_elems, kernels::gemm_bf16_workspace_elems(a, b, c));
    };
    gemm(mi, kHeadsWidth, L_.In);
    gemm(kHeadsWidth, L_.In, mi);
    if (L_.P > 0) {
      gemm(mi, kHeadsWidth, L_.P);
      gemm(kHeadsWidth, L_.P, mi);
    }
    gemm(mi, L_.In, kHeadsWidth);
    if (L_.ar) {
      gemm(mi, kHeadsWidth, kHeadsWidth);
      gemm(kHeadsWidth, kHeadsWidth, mi);
    }
    if (L_.hidden > 0) {
      gemm(mi, L_.hidden, L_.H);
      gemm(L_.hidden, L_.H, mi);
      gemm(mi, L_.H, L_.hidden);
    }
    need.norm_rows = m;
    need.norm_cols = std::max<size_t>(kHeadsWidth, hid);
    size_t bytes = o_.scratch_bytes(need);
    if constexpr (kOnDevice) bytes = std::max(bytes, Ops::Table::heads_join_workspace_bytes(m));
    scratch_ = o_.template alloc<uint8_t>(std::max<size_t>(1, bytes), "controller_heads scratch");
  }

  void forward(const float* x, const float* prev, const uint16_t* x_bf, const uint16_t* prev_bf,
               const ArInputs& ar, int M, const nn::ParamStore& st,
               float* const out[kHeads]) override {
    const float* W = st.values();
    const uint16_t* Wb = st.shadow();
    const size_t m = static_cast<size_t>(M);
    xb_ = pb_ = nullptr;
    if (bf16_) {  // the copies not given: x's and the direct path's prev's, in one launch
      const size_t nx = m * static_cast<size_t>(L_.H), np = m * static_cast<size_t>(L_.P);
      xb_ = x_bf ? x_bf : x16();
      pb_ = L_.P == 0 ? nullptr : prev_bf ? prev_bf : b16(prev16_);
      const bool round_x = !x_bf, round_prev = L_.P > 0 && !prev_bf;
      if (round_x && round_prev)
        o_.to_bf16(x, x16(), nx, prev, b16(prev16_), np);
      else if (round_x)
        o_.to_bf16(x, x16(), nx);
      else if (round_prev)
        o_.to_bf16(prev, b16(prev16_), np);
    }
    const uint16_t* xb = xb_;
    if constexpr (kOnDevice) {
      // A few rows (a policy's frame) of heads with neither a hidden layer nor decoding: the two
      // products and the split in one launch, where the small-row GEMMs are on.
      if (L_.hidden == 0 && !L_.ar && M <= Ops::Table::kSmallGemmRows && Ops::Table::small_gemm()) {
        typename Ops::Table::HeadGradPointers split{};
        for (int h = 0; h < kHeads; ++h) split.dlogits[h] = out[h];
        const bool direct = L_.P > 0;
        if (bf16_)
          Ops::Table::heads_small_rows(
              m, kbf(xb), L_.H, kbf(bf(Wb, L_.wo)), direct ? kbf(pb_) : nullptr, L_.P,
              direct ? kbf(bf(Wb, L_.wp)) : nullptr, W + L_.bo, split, o_.stream());
        else
          Ops::Table::heads_small_rows(m, x, L_.H, W + L_.wo, direct ? prev : nullptr, L_.P,
                                       direct ? W + L_.wp : nullptr, W + L_.bo, split, o_.stream());
        return;
      }
    }
    const float* in = x;
    const uint16_t* inb = xb;
    if (L_.hidden > 0) {
      const size_t n = m * static_cast<size_t>(L_.hidden);
      o_.gemm(false, true, M, L_.hidden, L_.H, x, xb, L_.H, W + L_.wh, bf(Wb, L_.wh), L_.H, 0.0f,
              f(pre_), L_.hidden, scratch());
      o_.add_bias_rows(f(pre_), W + L_.bh, m, static_cast<size_t>(L_.hidden));
      o_.silu_forward(f(pre_), f(act_), n);
      in = f(act_);
      if (bf16_) {
        o_.to_bf16(f(act_), b16(act16_), n);
        inb = b16(act16_);
      }
    }
    o_.gemm(false, true, M, kHeadsWidth, L_.In, in, inb, L_.In, W + L_.wo, bf(Wb, L_.wo), L_.In,
            0.0f, f(logits_), kHeadsWidth, scratch());
    if (L_.P > 0) {  // the direct path: logits += prev Wpᵀ
      o_.gemm(false, true, M, kHeadsWidth, L_.P, prev, pb_, L_.P, W + L_.wp, bf(Wb, L_.wp), L_.P,
              1.0f, f(logits_), kHeadsWidth, scratch());
    }
    // The output bias last, on a device added by the split itself (before the decoding of
    // autoregressive heads, which reads whole logits).
    const bool decodes = L_.ar && !ar.teacher;
    if (decodes) o_.add_bias_rows(f(logits_), W + L_.bo, m, kHeadsWidth);
    if (L_.ar) {
      autoregressive_forward(ar, M, W + L_.wa, bf(Wb, L_.wa));
      teacher_rows_ = ar.teacher ? M : -1;  // what the backward's dWa reads
    }
    if constexpr (kOnDevice) {  // the six outputs in one launch
      typename Ops::Table::HeadGradPointers split{};
      for (int h = 0; h < kHeads; ++h) split.dlogits[h] = out[h];
      Ops::Table::heads_split(f(logits_), decodes ? nullptr : W + L_.bo, m, split, o_.stream());
    } else {
      if (!decodes) o_.add_bias_rows(f(logits_), W + L_.bo, m, kHeadsWidth);
      for (int h = 0; h < kHeads; ++h)
        o_.copy_cols(f(logits_) + head_offset(h), kHeadsWidth, out[h],
                     static_cast<size_t>(head_width(h)), m, static_cast<size_t>(head_width(h)));
    }
  }

  void backward(const float* x, const float* prev, int M, const nn::ParamStore& st,
                const float* const dout[kHeads], float* dx) override {
    const float* W = st.values();
    const uint16_t* Wb = st.shadow();
    float* G = st.grads();
    const size_t m = static_cast<size_t>(M);
    float* dl = f(dlogits_);
    // Same operands as the forward: bf16 copies of x / act, of the weights and of dy.
    uint16_t* const dlb = bf16_ ? b16(dl16_) : nullptr;
    if constexpr (kOnDevice) {  // the six gradients in, dl's bf16 copy and dbo, in one launch
      typename Ops::Table::HeadPointers join{};
      for (int h = 0; h < kHeads; ++h) join.logits[h] = dout[h];
      Ops::Table::heads_join(join, m, dl, reinterpret_cast<kernels::bfloat16*>(dlb), G + L_.bo,
                             scratch(), o_.stream());
    } else {
      bool all = true;
      for (int h = 0; h < kHeads; ++h) all = all && dout[h] != nullptr;
      if (!all) o_.zero(dl, m * kHeadsWidth);
      for (int h = 0; h < kHeads; ++h)
        if (dout[h])
          o_.copy_cols(dout[h], static_cast<size_t>(head_width(h)), dl + head_offset(h),
                       kHeadsWidth, m, static_cast<size_t>(head_width(h)));
      if (dlb) o_.to_bf16(dl, dlb, m * kHeadsWidth);
      o_.column_sum_accumulate(dl, G + L_.bo, m, kHeadsWidth, scratch());
    }
    const float* in = L_.hidden > 0 ? f(act_) : x;
    const uint16_t* inb = !bf16_ ? nullptr : L_.hidden > 0 ? b16(act16_) : xb_;
    o_.gemm(true, false, kHeadsWidth, L_.In, M, dl, dlb, kHeadsWidth, in, inb, L_.In, 1.0f,
            G + L_.wo, L_.In, scratch());
    if (L_.P > 0)  // dWp += dlᵀ prev, with the forward's bf16 copy of prev
      o_.gemm(true, false, kHeadsWidth, L_.P, M, dl, dlb, kHeadsWidth, prev, pb_, L_.P, 1.0f,
              G + L_.wp, L_.P, scratch());
    if (L_.ar) {  // dWa += dlᵀ teacher, then Wa's structural zeros get none
      if (teacher_rows_ != M)
        throw std::logic_error(
            "controller_heads: a backward of autoregressive heads needs the teacher-forced "
            "forward of the same batch (a training pass) just before it");
      o_.gemm(true, false, kHeadsWidth, kHeadsWidth, M, dl, dlb, kHeadsWidth, f(teacher_),
              bf16_ ? b16(teacher16_) : nullptr, kHeadsWidth, 1.0f, G + L_.wa, kHeadsWidth,
              scratch());
      if constexpr (kOnDevice)
        Ops::Table::heads_ar_mask(G + L_.wa, o_.stream());
      else
        heads_ar_mask(G + L_.wa);
    }
    if (L_.hidden > 0) {
      const size_t n = m * static_cast<size_t>(L_.hidden);
      float* da = f(dact_);
      o_.gemm(false, false, M, L_.hidden, kHeadsWidth, dl, dlb, kHeadsWidth, W + L_.wo,
              bf(Wb, L_.wo), L_.In, 0.0f, da, L_.hidden, scratch());
      o_.silu_backward(f(pre_), da, da, n);
      const uint16_t* dab = nullptr;
      if (bf16_) {
        o_.to_bf16(da, b16(dact16_), n);
        dab = b16(dact16_);
      }
      o_.gemm(true, false, L_.hidden, L_.H, M, da, dab, L_.hidden, x, xb_, L_.H, 1.0f, G + L_.wh,
              L_.H, scratch());
      o_.column_sum_accumulate(da, G + L_.bh, m, static_cast<size_t>(L_.hidden), scratch());
      o_.gemm(false, false, M, L_.H, L_.hidden, da, dab, L_.hidden, W + L_.wh, bf(Wb, L_.wh), L_.H,
              0.0f, dx, L_.H, scratch());
    } else {
      o_.gemm(false, false, M, L_.H, kHeadsWidth, dl, dlb, kHeadsWidth, W + L_.wo, bf(Wb, L_.wo),
              L_.In, 0.0f, dx, L_.H, scratch());
    }
  }

 private:
  static constexpr bool kOnDevice = requires { typename Ops::Table; };
  static const kernels::bfloat16* kbf(const uint16_t* p) {
    return reinterpret_cast<const kernels::bfloat16*>(p);
  }

  // logits += teacher Waᵀ (training), or the logits conditioned item by item on the most likely
  // items (every other pass).
  void autoregressive_forward(const ArInputs& ar, int M, const float* Wa, const uint16_t* Wab) {
    const size_t m = static_cast<size_t>(M);
    if (!ar.teacher) {
      if constexpr (kOnDevice)
        Ops::Table::heads_ar_decode(m, Wa, f(logits_), o_.stream());
      else
        heads_ar_decode(m, Wa, f(logits_));
      return;
    }
    if constexpr (kOnDevice)
      Ops::Table::heads_ar_teacher(m, ar.window, ar.target_buttons, ar.target_sticks, ar.mirrored,
                                   f(teacher_), o_.stream());
    else
      heads_ar_teacher(m, ar.window, ar.target_buttons, ar.target_sticks, ar.mirrored, f(teacher_));
    const uint16_t* tb = nullptr;
    if (bf16_) {
      o_.to_bf16(f(teacher_), b16(teacher16_), m * kHeadsWidth);
      tb = b16(teacher16_);
    }
    o_.gemm(false, true, M, kHeadsWidth, kHeadsWidth, f(teacher_), tb, kHeadsWidth, Wa, Wab,
            kHeadsWidth, 1.0f, f(logits_), kHeadsWidth, scratch());
  }

  static float* f(const Tensor& t) { return t.data<float>(); }
  static uint16_t* b16(const Tensor& t) { return t.data<uint16_t>(); }
  static const uint16_t* bf(const uint16_t* wb, size_t off) { return wb ? wb + off : nullptr; }
  uint16_t* x16() const { return b16(x16_); }
  // The bf16 copies of x and prev the last forward's GEMMs read (given, or x16_ and prev16_).
  const uint16_t *xb_ = nullptr, *pb_ = nullptr;
  void* scratch() const { return scratch_.raw(); }

  const HeadsLayout& L_;
  bool bf16_;
  Ops o_;
  int64_t cap_ = 0;
  Tensor logits_, dlogits_, pre_, act_, dact_, x16_, prev16_, dl16_, act16_, dact16_, scratch_;
  Tensor teacher_, teacher16_;
  int teacher_rows_ = -1;  // rows of the last forward's teacher, -1: it decoded instead
};

}  // namespace

class ControllerHeadsStage : public Stage {
 public:
  static StageSchema schema() {
    StageSchema s("controller_heads");
    s.family("melee")
        .streaming(Streaming::per_position)
        .doc(
            "Features x (B, W, H) -> controller logits: buttons (8), main_x/main_y/c_x/c_y (17), "
            "shoulder (5).")
        .trainable()
        .input("x", DType::f32, 3, "(B, W, H) per-frame features")
        .reads_bf16_copy()
        .optional_input("prev_input", DType::f32, 3,
                        "(B, W, P) the previous input (melee_embedding's prev_input): when "
                        "connected, a direct linear path from it to every head's logits")
        .reads_bf16_copy()
        .optional_input("target_buttons", DType::f32, 3,
                        "(B, W, 8) the recorded buttons (the loader's): what `autoregressive` "
                        "conditions on in training")
        .optional_input("target_sticks", DType::i32, 3,
                        "(B, W, 5) the recorded stick and shoulder classes (the loader's), as "
                        "target_buttons")
        .optional_input("mirrored", DType::u8, 1,
                        "(B) the embedding's mirror flags: the recorded x classes mirror alike");
    for (int h = 0; h < kHeads; ++h)
      s.output(kHeadNames[h], DType::f32, 3,
               "(B, W, " + std::to_string(head_width(h)) + ") logits" +
                   (h == 0 ? " (one per button)" : ""));
    s.param("hidden", int64_t{0}, "width of a shared SiLU hidden layer before the heads (0: none)")
        .range(0, 65536);
    s.param("autoregressive", false,
            "condition each controller item (8 buttons, then main x/y, c x/y, shoulder) on the "
            "items before it: the recorded ones in training (connect target_buttons, "
            "target_sticks, mirrored), the model's own most likely ones otherwise; bots sample "
            "them in that order");
    return s;
  }

  void setup(StageContext& ctx) override {
    const Shape& xs = ctx.input_shape("x");
    const int H = static_cast<int>(xs[2]);
    if (H <= 0)
      throw std::runtime_error("controller_heads '" + ctx.name() +
                               "': the width of x must be known at setup, got " + xs.str());
    const int hidden = static_cast<int>(ctx.params().integer("hidden"));
    int P = 0;
    if (ctx.input_connected("prev_input")) {
      P = static_cast<int>(ctx.input_shape("prev_input")[2]);
      if (P <= 0)
        throw std::runtime_error("controller_heads '" + ctx.name() +
                                 "': the width of prev_input must be known at setup, got " +
                                 ctx.input_shape("prev_input").str());
    }
    const bool ar = ctx.params().boolean("autoregressive");
    if (ar && !(ctx.input_connected("target_buttons") && ctx.input_connected("target_sticks")))
      throw std::runtime_error("controller_heads '" + ctx.name() +
                               "': autoregressive needs the recorded input: connect "
                               "target_buttons and target_sticks (the loader's) and mirrored "
                               "(the embedding's), as configs/train_bc.yaml does");
    layout_ = std::make_unique<HeadsLayout>(H, hidden, P, ar);
    bf16_ = ctx.run().precision == Precision::bf16;
    device_ = ctx.exec().device();
    for (int h = 0; h < kHeads; ++h) {
      Shape os{1, 1, head_width(h)};  // operator[] keeps a per-batch -1 as it is
      os[0] = xs[0];
      os[1] = xs[1];
      ctx.declare_output(kHeadNames[h], os, DType::f32);
    }
    runner_ = ops::with_ops<MeleeKernelFamily>(
        ctx.exec(), "controller_heads '" + ctx.name() + "'",
        [&](auto ops) -> std::unique_ptr<HeadsRunner> {
          return std::make_unique<HeadsRunnerOn<decltype(ops)>>(*layout_, bf16_, ops);
        });
    store_.allocate(layout_->params, bf16_, device_, ctx.run().param_arena.get());
    // PyTorch nn.Linear's default: weight and bias uniform in ±1/sqrt(fan_in), drawn in the
    // store's order (hidden weight, hidden bias, head weights, head biases).
    store_.initialize([&](float* w) {
      std::mt19937_64 rng(ctx.seed());
      auto init = [&](size_t off, size_t n, int fan_in) {
        std::uniform_real_distribution<double> u(-1.0 / std::sqrt(fan_in), 1.0 / std::sqrt(fan_in));
        for (size_t i = 0; i < n; ++i) w[off + i] = static_cast<float>(u(rng));
      };
      const HeadsLayout& L = *layout_;
      if (hidden > 0) {
        init(L.wh, static_cast<size_t>(hidden) * H, H);
        init(L.bh, static_cast<size_t>(hidden), H);
      }
      init(L.wo, static_cast<size_t>(kHeadsWidth) * L.In, L.In);
      init(L.bo, kHeadsWidth, L.In);
      // The direct and autoregressive paths start at zero: the heads start as they would
      // without them (and Wa's structural zeros stay zero: they get no gradient).
      if (L.P > 0) std::fill_n(w + L.wp, static_cast<size_t>(kHeadsWidth) * L.P, 0.0f);
      if (L.ar) std::fill_n(w + L.wa, static_cast<size_t>(kHeadsWidth) * kHeadsWidth, 0.0f);
    });
    runner_->refresh_shadow(store_);
    shadow_checked_ = false;
    if (xs[0] > 0 && xs[1] > 0) reserve(rows_setup_ = xs[0] * xs[1]);
  }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    const int H = layout_->H;
    if (x.rank() != 3 || x.dim(2) != H || x.dtype() != DType::f32 || x.device() != device_)
      throw std::runtime_error("controller_heads '" + ctx.name() + "': x is " + x.describe() +
                               ", expected f32 width " + std::to_string(H) + " on " +
                               device_.str() + " (batch " + std::to_string(b.index) + ")");
    const int64_t B = x.dim(0), W = x.dim(1);
    const int M = static_cast<int>(B * W);
    reserve(M);
    if (bf16_ && !shadow_checked_) {
      // Weights may have been replaced since setup (checkpoint, StageHarness::load_weights);
      // from here on the optimizer keeps the shadow in step with every update.
      runner_->refresh_shadow(store_);
      shadow_checked_ = true;
    }
    float* out[kHeads];
    for (int h = 0; h < kHeads; ++h) out[h] = out_[h].data<float>();
    runner_->forward(x.data<float>(), prev_of(b, ctx, M), copy_of(b, ctx, "x"),
                     layout_->P > 0 ? copy_of(b, ctx, "prev_input") : nullptr, ar_of(b, ctx, B, W),
                     M, store_, out);
    for (int h = 0; h < kHeads; ++h)
      ctx.set_output(b, kHeadNames[h],
                     out_[h].slice_rows(0, M).reshape(Shape{B, W, head_width(h)}));
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    const int64_t B = x.dim(0), W = x.dim(1);
    const int M = static_cast<int>(B * W);
    const float* dout[kHeads];
    bool any = false;
    for (int h = 0; h < kHeads; ++h) {
      const Tensor& g = ctx.output_grad(b, kHeadNames[h]);
      dout[h] = nullptr;
      if (!g.defined()) continue;
      if (g.numel() != static_cast<int64_t>(M) * head_width(h) || g.device() != device_)
        throw std::runtime_error("controller_heads '" + ctx.name() + "': gradient of " +
                                 kHeadNames[h] + " is " + g.describe() + " (batch " +
                                 std::to_string(b.index) + ")");
      dout[h] = g.data<float>();
      any = true;
    }
    if (!any) return;
    runner_->backward(x.data<float>(), prev_of(b, ctx, M), M, store_, dout, dx_.data<float>());
    ctx.add_input_grad(b, "x", dx_.slice_rows(0, M).reshape(Shape{B, W, layout_->H}));
  }

  // The linear layers (forward, then the input and weight gradients) and the SiLU.
  Cost cost() const override {
    if (rows_setup_ <= 0) return {};
    const double M = static_cast<double>(rows_setup_), H = layout_->H, hid = layout_->hidden;
    const double gemm = 2 * M * (hid > 0 ? H * hid + hid * kHeadsWidth : H * kHeadsWidth) +
                        2 * M * (layout_->P + (layout_->ar ? kHeadsWidth : 0)) * kHeadsWidth;
    return {gemm + M * (kHeadsWidth + 5 * hid), 2 * gemm + M * (kHeadsWidth + 8 * hid), 0};
  }

  // The order of the stage's earlier releases: hidden layer, then weight and bias per head.
  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> all = store_.pointers(), out;
    const size_t first = layout_->hidden > 0 ? 2 : 0;
    for (size_t i = 0; i < first; ++i) out.push_back(all[i]);
    for (size_t h = 0; h < kHeads; ++h) {
      out.push_back(all[first + h]);
      out.push_back(all[first + kHeads + h]);
    }
    const size_t extra = (layout_->P > 0 ? 1 : 0) + (layout_->ar ? 1 : 0);
    out.insert(out.end(), all.end() - static_cast<std::ptrdiff_t>(extra), all.end());
    return out;  // then prev.weight, ar.weight
  }

 private:
  // What the autoregressive form conditions on: in training the recorded items of the batch.
  ArInputs ar_of(const Batch& b, const StageContext& ctx, int64_t B, int64_t W) const {
    ArInputs a;
    a.teacher = layout_->ar && ctx.run().training && !ctx.run().streaming;
    if (!a.teacher) return a;
    const int64_t M = B * W;
    const Tensor& tb = ctx.input(b, "target_buttons");
    const Tensor& ts = ctx.input(b, "target_sticks");
    if (tb.numel() != M * kButtons || tb.dtype() != DType::f32 || tb.device() != device_ ||
        ts.numel() != M * kStickHeads || ts.dtype() != DType::i32 || ts.device() != device_)
      throw std::runtime_error("controller_heads '" + ctx.name() + "': target_buttons is " +
                               tb.describe() + " and target_sticks " + ts.describe() +
                               ", expected " + std::to_string(M) + " positions on " +
                               device_.str() + " (batch " + std::to_string(b.index) + ")");
    a.target_buttons = tb.data<float>();
    a.target_sticks = ts.data<int32_t>();
    if (ctx.input_connected("mirrored")) {
      const Tensor& mr = ctx.input(b, "mirrored");
      if (mr.numel() != B || mr.dtype() != DType::u8 || mr.device() != device_)
        throw std::runtime_error("controller_heads '" + ctx.name() + "': mirrored is " +
                                 mr.describe() + ", expected " + std::to_string(B) +
                                 " u8 flags on " + device_.str());
      a.mirrored = mr.data<uint8_t>();
    }
    a.window = static_cast<size_t>(W);
    return a;
  }

  // The bf16 copy of input `port` where the stage before wrote one, else null.
  static const uint16_t* copy_of(const Batch& b, const StageContext& ctx, const char* port) {
    const Tensor* c = ctx.input_bf16_copy(b, port);
    return c ? c->data<uint16_t>() : nullptr;
  }

  // prev_input's rows for the batch, null when the port is not connected.
  const float* prev_of(const Batch& b, const StageContext& ctx, int M) const {
    if (layout_->P == 0) return nullptr;
    const Tensor& p = ctx.input(b, "prev_input");
    if (p.numel() != static_cast<int64_t>(M) * layout_->P || p.dtype() != DType::f32 ||
        p.device() != device_)
      throw std::runtime_error("controller_heads '" + ctx.name() + "': prev_input is " +
                               p.describe() + ", expected " + std::to_string(M) + " rows of " +
                               std::to_string(layout_->P) + " f32 on " + device_.str() +
                               " (batch " + std::to_string(b.index) + ")");
    return p.data<float>();
  }

  // Output and input-gradient buffers for M = B·W positions, grown to the largest batch seen.
  void reserve(int64_t M) {
    runner_->reserve(M);
    if (M <= rows_cap_) return;
    rows_cap_ = M;
    dx_ = Tensor::empty(Shape{M, layout_->H}, DType::f32, device_, "controller_heads dx");
    for (int h = 0; h < kHeads; ++h)
      out_[h] =
          Tensor::empty(Shape{M, head_width(h)}, DType::f32, device_, "controller_heads output");
  }

  std::unique_ptr<HeadsLayout> layout_;
  std::unique_ptr<HeadsRunner> runner_;
  nn::ParamStore store_;
  Device device_;
  bool bf16_ = false, shadow_checked_ = false;
  Tensor dx_, out_[kHeads];
  int64_t rows_cap_ = 0;
  int64_t rows_setup_ = 0;  // B·W known at setup (cost())
};
SLIPSTREAM_REGISTER_STAGE(ControllerHeadsStage);

}  // namespace slipstream
