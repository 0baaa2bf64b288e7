// controller_heads: per-frame features x (B, W, H) -> logits of the six controller heads
// (buttons 8, main/c stick x/y 17 each, shoulder 5). One linear layer per head, or a shared
// SiLU hidden layer first (`hidden` > 0). The six heads run as one fused (M, 81) GEMM; their
// parameters are row-views of the fused weight, named like PyTorch modules (buttons.weight, ...).
// bf16 precision: the GEMMs take bf16-rounded operands (the optimizer's shadow when it keeps one),
// accumulating in fp32, forward and backward alike.
#include <cmath>
#include <cstring>
#include <random>

#include "engine/registry.h"
#include "kernels/bf16.h"
#include "kernels/elementwise.h"
#include "stages/melee/model_math.h"

namespace slipstream {
namespace {
using namespace melee;
}  // namespace

class ControllerHeadsStage : public Stage {
 public:
  static StageSchema schema() {
    StageSchema s("controller_heads");
    s.family("melee")
        .doc(
            "Features x (B, W, H) -> controller logits: buttons (8), main_x/main_y/c_x/c_y (17), "
            "shoulder (5).")
        .trainable()
        .input("x", DType::f32, 3, "(B, W, H) per-frame features");
    for (int h = 0; h < kHeads; ++h)
      s.output(kHeadNames[h], DType::f32, 3,
               "(B, W, " + std::to_string(head_width(h)) + ") logits" +
                   (h == 0 ? " (one per button)" : ""));
    s.param("hidden", int64_t{0}, "width of a shared SiLU hidden layer before the heads (0: none)")
        .range(0, 65536);
    return s;
  }

  void setup(StageContext& ctx) override {
    if (!ctx.device().is_cpu())
      throw std::runtime_error("controller_heads '" + ctx.name() +
                               "': only the CPU path exists (device " + ctx.device().str() +
                               "); run with device: cpu");
    const Shape& xs = ctx.input_shape("x");
    H_ = static_cast<int>(xs[2]);
    if (H_ <= 0)
      throw std::runtime_error("controller_heads '" + ctx.name() +
                               "': the width of x must be known at setup, got " + xs.str());
    hidden_ = static_cast<int>(ctx.params().integer("hidden"));
    bf16_ = ctx.run().precision == Precision::bf16;
    In_ = hidden_ > 0 ? hidden_ : H_;
    for (int h = 0; h < kHeads; ++h) {
      Shape os{1, 1, head_width(h)};  // operator[] keeps a per-batch -1 as it is
      os[0] = xs[0];
      os[1] = xs[1];
      ctx.declare_output(kHeadNames[h], os, DType::f32);
    }

    // PyTorch nn.Linear's default: weight and bias uniform in ±1/sqrt(fan_in).
    std::mt19937_64 rng(ctx.seed());
    auto init = [&](Tensor& t, int fan_in) {
      std::uniform_real_distribution<double> u(-1.0 / std::sqrt(fan_in), 1.0 / std::sqrt(fan_in));
      for (float& v : t.span<float>()) v = static_cast<float>(u(rng));
    };
    if (hidden_ > 0) {
      hidden_w_ = make_param("hidden.weight", Shape{hidden_, H_}, true);
      hidden_b_ = make_param("hidden.bias", Shape{hidden_}, false);
      init(hidden_w_.value, H_);
      init(hidden_b_.value, H_);
    }
    Wo_ = Tensor::empty(Shape{kHeadsWidth, In_}, DType::f32, Device::cpu(),
                        "controller_heads weight");
    bo_ = Tensor::empty(Shape{kHeadsWidth}, DType::f32, Device::cpu(), "controller_heads bias");
    dWo_ = Tensor::zeros(Shape{kHeadsWidth, In_}, DType::f32, Device::cpu(),
                         "controller_heads weight grad");
    dbo_ =
        Tensor::zeros(Shape{kHeadsWidth}, DType::f32, Device::cpu(), "controller_heads bias grad");
    init(Wo_, In_);
    init(bo_, In_);
    for (int h = 0; h < kHeads; ++h) {
      const int64_t a = head_offset(h), e = a + head_width(h);
      Parameter& w = heads_[2 * h];
      Parameter& b = heads_[2 * h + 1];
      w.name = std::string(kHeadNames[h]) + ".weight";
      w.value = Wo_.slice_rows(a, e);
      w.grad = dWo_.slice_rows(a, e);
      b.name = std::string(kHeadNames[h]) + ".bias";
      b.value = bo_.slice_rows(a, e);
      b.grad = dbo_.slice_rows(a, e);
      b.weight_decay = false;
    }
    if (bf16_) {
      Wo16_ = Tensor::empty(Shape{kHeadsWidth, In_}, DType::bf16, Device::cpu(),
                            "controller_heads bf16 weight");
      if (hidden_ > 0)
        Wh16_ = Tensor::empty(Shape{hidden_, H_}, DType::bf16, Device::cpu(),
                              "controller_heads bf16 hidden");
    }
    if (xs[0] > 0 && xs[1] > 0) reserve(xs[0] * xs[1]);
  }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    if (x.rank() != 3 || x.dim(2) != H_ || !x.device().is_cpu())
      throw std::runtime_error("controller_heads '" + ctx.name() + "': x is " + x.describe() +
                               ", expected width " + std::to_string(H_) + " on cpu (batch " +
                               std::to_string(b.index) + ")");
    const int64_t B = x.dim(0), W = x.dim(1);
    const int M = static_cast<int>(B * W);
    reserve(M);
    float* logits = logits_.data<float>();
    float* pre = hidden_ > 0 ? pre_.data<float>() : nullptr;
    float* act = hidden_ > 0 ? act_.data<float>() : nullptr;
    if (!bf16_) {
      heads_forward<float>(x.data<float>(), M, H_, hidden_,
                           hidden_ > 0 ? hidden_w_.value.data<float>() : nullptr,
                           hidden_ > 0 ? hidden_b_.value.data<float>() : nullptr, pre, act,
                           Wo_.data<float>(), bo_.data<float>(), logits);
    } else {
      refresh_bf16_weights();
      uint16_t* x16 = x16_.data<uint16_t>();
      kernels::fp32_to_bf16(x.data<float>(), x16, static_cast<size_t>(M) * H_);
      const uint16_t* in16 = x16;
      if (hidden_ > 0) {
        mm(false, true, M, hidden_, H_, x16, H_, Wh16_.data<uint16_t>(), H_, 0.0f, pre, hidden_);
        add_bias(pre, hidden_b_.value.data<float>(), M, hidden_);
        kernels::silu_forward(pre, act, static_cast<size_t>(M) * hidden_);
        kernels::fp32_to_bf16(act, act16_.data<uint16_t>(), static_cast<size_t>(M) * hidden_);
        in16 = act16_.data<uint16_t>();
      }
      mm(false, true, M, kHeadsWidth, In_, in16, In_, Wo16_.data<uint16_t>(), In_, 0.0f, logits,
         kHeadsWidth);
      add_bias(logits, bo_.data<float>(), M, kHeadsWidth);
    }
    for (int h = 0; h < kHeads; ++h) {
      kernels::copy_cols(logits + head_offset(h), kHeadsWidth, out_[h].data<float>(), head_width(h),
                         M, head_width(h));
      ctx.set_output(b, kHeadNames[h],
                     out_[h].slice_rows(0, M).reshape(Shape{B, W, head_width(h)}));
    }
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    const int64_t B = x.dim(0), W = x.dim(1);
    const int M = static_cast<int>(B * W);
    float* dl = dlogits_.data<float>();
    bool any = false;
    for (int h = 0; h < kHeads; ++h) {
      const Tensor& g = ctx.output_grad(b, kHeadNames[h]);
      if (g.defined()) {
        if (g.numel() != static_cast<int64_t>(M) * head_width(h))
          throw std::runtime_error("controller_heads '" + ctx.name() + "': gradient of " +
                                   kHeadNames[h] + " is " + g.describe() + " (batch " +
                                   std::to_string(b.index) + ")");
        kernels::copy_cols(g.data<float>(), head_width(h), dl + head_offset(h), kHeadsWidth, M,
                           head_width(h));
        any = true;
      } else {
        for (int i = 0; i < M; ++i)
          std::fill_n(dl + static_cast<size_t>(i) * kHeadsWidth + head_offset(h), head_width(h),
                      0.0f);
      }
    }
    if (!any) return;
    float* dx = dx_.data<float>();
    float* dact = hidden_ > 0 ? dact_.data<float>() : nullptr;
    if (!bf16_) {
      heads_backward<float>(
          x.data<float>(), M, H_, hidden_, hidden_ > 0 ? hidden_w_.value.data<float>() : nullptr,
          hidden_ > 0 ? pre_.data<float>() : nullptr, hidden_ > 0 ? act_.data<float>() : nullptr,
          Wo_.data<float>(), dl, dx, hidden_ > 0 ? hidden_w_.grad.data<float>() : nullptr,
          hidden_ > 0 ? hidden_b_.grad.data<float>() : nullptr, dWo_.data<float>(),
          dbo_.data<float>(), dact);
    } else {
      // Same operands as the forward: bf16 copies of x / act, of the weights and of dy.
      uint16_t* dl16 = dl16_.data<uint16_t>();
      kernels::fp32_to_bf16(dl, dl16, static_cast<size_t>(M) * kHeadsWidth);
      const uint16_t* in16 = hidden_ > 0 ? act16_.data<uint16_t>() : x16_.data<uint16_t>();
      mm(true, false, kHeadsWidth, In_, M, dl16, kHeadsWidth, in16, In_, 1.0f, dWo_.data<float>(),
         In_);
      kernels::column_sum_accumulate(dl, dbo_.data<float>(), static_cast<size_t>(M), kHeadsWidth);
      if (hidden_ > 0) {
        mm(false, false, M, hidden_, kHeadsWidth, dl16, kHeadsWidth, Wo16_.data<uint16_t>(), In_,
           0.0f, dact, hidden_);
        kernels::silu_backward(pre_.data<float>(), dact, dact, static_cast<size_t>(M) * hidden_);
        uint16_t* da16 = dact16_.data<uint16_t>();
        kernels::fp32_to_bf16(dact, da16, static_cast<size_t>(M) * hidden_);
        mm(true, false, hidden_, H_, M, da16, hidden_, x16_.data<uint16_t>(), H_, 1.0f,
           hidden_w_.grad.data<float>(), H_);
        kernels::column_sum_accumulate(dact, hidden_b_.grad.data<float>(), static_cast<size_t>(M),
                                       hidden_);
        mm(false, false, M, H_, hidden_, da16, hidden_, Wh16_.data<uint16_t>(), H_, 0.0f, dx, H_);
      } else {
        mm(false, false, M, H_, kHeadsWidth, dl16, kHeadsWidth, Wo16_.data<uint16_t>(), In_, 0.0f,
           dx, H_);
      }
    }
    ctx.add_input_grad(b, "x", dx_.slice_rows(0, M).reshape(Shape{B, W, H_}));
  }

  std::vector<Parameter*> parameters() override {
    std::vector<Parameter*> out;
    if (hidden_ > 0) out = {&hidden_w_, &hidden_b_};
    for (auto& p : heads_) out.push_back(&p);
    return out;
  }

 private:
  static Parameter make_param(const char* name, const Shape& shape, bool decay) {
    Parameter p;
    p.name = name;
    p.value = Tensor::empty(shape, DType::f32, Device::cpu(), name);
    p.grad = Tensor::zeros(shape, DType::f32, Device::cpu(), name);
    p.weight_decay = decay;
    return p;
  }

  void mm(bool ta, bool tb, int M, int N, int K, const uint16_t* A, int lda, const uint16_t* B,
          int ldb, float beta, float* C, int ldc) {
    kernels::gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, ws_.data<float>());
  }
  static void add_bias(float* y, const float* b, int M, int N) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) y[static_cast<size_t>(i) * N + j] += b[j];
  }

  // The optimizer's bf16 shadow when it keeps one (already rounded), else round the master.
  void refresh_bf16_weights() {
    auto take = [](const Parameter& p, uint16_t* dst) {
      if (p.low_precision.defined() && p.low_precision.numel() == p.value.numel() &&
          p.low_precision.dtype() == DType::bf16 && p.low_precision.device().is_cpu())
        std::memcpy(dst, p.low_precision.raw(), p.low_precision.nbytes());
      else
        kernels::fp32_to_bf16(p.value.data<float>(), dst, static_cast<size_t>(p.value.numel()));
    };
    for (int h = 0; h < kHeads; ++h)
      take(heads_[2 * h], Wo16_.data<uint16_t>() + static_cast<size_t>(head_offset(h)) * In_);
    if (hidden_ > 0) take(hidden_w_, Wh16_.data<uint16_t>());
  }

  // Buffers for M = B·W positions, grown to the largest batch seen (none in steady state).
  void reserve(int64_t M) {
    if (M <= rows_cap_) return;
    rows_cap_ = M;
    auto f32 = [&](int64_t cols, const char* what) {
      return Tensor::empty(Shape{M, cols}, DType::f32, Device::cpu(), what);
    };
    logits_ = f32(kHeadsWidth, "controller_heads logits");
    dlogits_ = f32(kHeadsWidth, "controller_heads dlogits");
    dx_ = f32(H_, "controller_heads dx");
    for (int h = 0; h < kHeads; ++h) out_[h] = f32(head_width(h), "controller_heads output");
    if (hidden_ > 0) {
      pre_ = f32(hidden_, "controller_heads hidden pre-activation");
      act_ = f32(hidden_, "controller_heads hidden activation");
      dact_ = f32(hidden_, "controller_heads hidden grad");
    }
    if (bf16_) {
      auto b16 = [&](int64_t cols, const char* what) {
        return Tensor::empty(Shape{M, cols}, DType::bf16, Device::cpu(), what);
      };
      x16_ = b16(H_, "controller_heads bf16 x");
      dl16_ = b16(kHeadsWidth, "controller_heads bf16 dlogits");
      if (hidden_ > 0) {
        act16_ = b16(hidden_, "controller_heads bf16 activation");
        dact16_ = b16(hidden_, "controller_heads bf16 hidden grad");
      }
      const int m = static_cast<int>(M);
      size_t ws = 0;
      auto need = [&](int a, int b, int c) {
        ws = std::max(ws, kernels::gemm_bf16_workspace_elems(a, b, c));
      };
      need(m, kHeadsWidth, In_);
      need(kHeadsWidth, In_, m);
      need(m, In_, kHeadsWidth);
      if (hidden_ > 0) {
        need(m, hidden_, H_);
        need(hidden_, H_, m);
        need(m, H_, hidden_);
      }
      ws_ = Tensor::empty(Shape{static_cast<int64_t>(ws)}, DType::f32, Device::cpu(),
                          "controller_heads bf16 workspace");
    }
  }

  int H_ = 0, hidden_ = 0, In_ = 0;
  bool bf16_ = false;
  Parameter hidden_w_, hidden_b_;
  Parameter heads_[2 * kHeads];  // weight, bias per head: views of Wo_/bo_ and their grads
  Tensor Wo_, bo_, dWo_, dbo_, Wo16_, Wh16_;
  Tensor logits_, dlogits_, dx_, pre_, act_, dact_, out_[kHeads];
  Tensor x16_, dl16_, act16_, dact16_, ws_;
  int64_t rows_cap_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(ControllerHeadsStage);

}  // namespace slipstream
