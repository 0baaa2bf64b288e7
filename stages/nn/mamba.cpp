// mamba: a stack of Mamba-1 blocks (mamba-ssm's MixerModel without the embedding), sequence to
// sequence and causal. The math is MambaModel (mamba_model.h) over the ops of the run's backend
// (with_ops.h: the CPU kernels, or the CUDA kernels on the run's stream); this file binds it
// to the stage API: weights as Parameters on the run's device, buffers sized in setup, bf16
// under precision bf16. On a stream (Runner::stream) the forward continues each row's sequence
// one frame at a time from the state the previous batch left (mamba_recurrent.h, CPU, fp32).
#include <cmath>

#include "engine/registry.h"
#include "stages/nn/mamba_model.h"
#include "stages/nn/mamba_recurrent.h"
#include "stages/nn/model_stage_util.h"
#include "stages/nn/param_store.h"
#include "stages/nn/sequence_model.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {

// The model whichever ops it runs on: the stage holds one and calls through this interface.
using MambaRunner = nn::SequenceModel<nn::MambaConfig, nn::MambaLayout>;
template <class Ops>
using MambaRunnerOn =
    nn::SequenceModelOn<nn::MambaModel<float, Ops>, nn::MambaConfig, nn::MambaLayout>;

class MambaStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("mamba")
        .family("nn")
        .doc(
            "Mamba-1 blocks (RMSNorm, selective-scan mixer, residual) and a final RMSNorm; "
            "mamba-ssm's parameter names; causal sequence to sequence.")
        .trainable()
        .streaming(Streaming::recurrent)
        .input("x", DType::f32, 3, "(B, W, Din) input sequence")
        .output("y", DType::f32, 3, "(B, W, d_model) output sequence")
        .param("d_model", int64_t{128},
               "model width (an input_proj maps Din to it when they differ)")
        .range(1, 65536)
        .param("d_state", int64_t{16}, "SSM state size per channel")
        .range(1, kernels::kScanMaxState)
        .param("d_conv", int64_t{4}, "causal depthwise convolution width")
        .range(1, kernels::kConvMaxWidth)
        .param("expand", int64_t{2}, "d_inner = expand * d_model")
        .range(1, 16)
        .param("dt_rank", int64_t{0}, "rank of the dt projection (0: ceil(d_model / 16))")
        .range(0, 65536)
        .param("layers", int64_t{2}, "number of Mamba blocks")
        .range(1, 256)
        .param("eps", 1e-5, "RMSNorm epsilon")
        .range(0, 1);
  }

  void setup(StageContext& ctx) override {
    const Params& p = ctx.params();
    const Shape& in = ctx.input_shape("x");
    if (in.rank() != 3 || in[2] <= 0)
      throw std::runtime_error("input x must be (B, W, Din) with Din known at setup, got " +
                               in.str());
    nn::MambaConfig c;
    c.din = static_cast<int>(in[2]);
    c.d_model = static_cast<int>(p.integer("d_model"));
    c.d_state = static_cast<int>(p.integer("d_state"));
    c.d_conv = static_cast<int>(p.integer("d_conv"));
    c.expand = static_cast<int>(p.integer("expand"));
    c.dt_rank = static_cast<int>(p.integer("dt_rank"));
    c.layers = static_cast<int>(p.integer("layers"));
    c.eps = p.number("eps");
    model_ = ops::with_ops(ctx.exec(), "mamba '" + ctx.name() + "'",
                           [&](auto ops) -> std::unique_ptr<MambaRunner> {
                             return std::make_unique<MambaRunnerOn<decltype(ops)>>(c, ops);
                           });
    device_ = ctx.exec().device();
    bf16_ = ctx.run().precision == Precision::bf16;
    store_.allocate(model_->layout().params, bf16_, device_, ctx.run().param_arena.get());
    layer_params_ = nn::parameters_by_layer(store_.pointers(), model_->config().layers);
    // The final norm's gradient is the backward pass's first: it goes with the top layer's.
    for (Parameter* p : store_.pointers())
      if (p->name.starts_with("norm_f.")) layer_params_.back().push_back(p);
    store_.initialize([&](float* w) { nn::mamba_init(c, model_->layout(), w, ctx.seed()); });
    model_->refresh_shadow(store_);
    shadow_checked_ = false;
    want_dx_ = nn::input_grad_wanted(ctx, 0);
    ctx.declare_output("y", {in[0], in[1], c.d_model}, DType::f32);
    if (in[0] > 0 && in[1] > 0) resize(in[0], in[1]);
  }

  void stream_begin(StageContext& ctx) override { stream_.begin(ctx, device_); }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    nn::check_sequence(ctx, x, model_->config().din, device_);
    if (x.dim(0) != model_->batch() || x.dim(1) != model_->length()) resize(x.dim(0), x.dim(1));
    if (ctx.run().streaming) {
      const auto& c = model_->config();
      stream_.forward(c, x, store_.values(), y_, static_cast<size_t>(c.din),
                      static_cast<size_t>(c.d_model));
      ctx.set_output(b, "y", y_);
      return;
    }
    if (bf16_ && !shadow_checked_) {
      // Weights may have been replaced since setup (checkpoint, StageHarness::load_weights);
      // from here on the optimizer keeps the shadow in step with every update.
      model_->refresh_shadow(store_);
      shadow_checked_ = true;
    }
    model_->forward(x.data<float>(), store_.values(), store_.shadow(), y_.data<float>());
    x_ = x;
    ctx.set_output(b, "y", y_);
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& dy = ctx.output_grad(b, "y");
    if (!dy.defined()) return;
    nn::check_output_grad(ctx, dy, y_);
    // A multi-rank run's reducer hears of each layer as the pass leaves it.
    const std::function<void(int)> layer_done = [&](int l) {
      ctx.gradients_ready(layer_params_[static_cast<size_t>(l)]);
    };
    model_->backward(x_.data<float>(), dy.data<float>(), store_.values(), store_.shadow(),
                     store_.grads(), want_dx_ ? dx_.data<float>() : nullptr,
                     ctx.run().gradient_listeners.empty() ? nullptr : &layer_done);
    if (want_dx_) ctx.add_input_grad(b, "x", dx_);
  }

  std::vector<Parameter*> parameters() override { return store_.pointers(); }

  Cost cost() const override {
    if (model_->batch() <= 0) return {};
    const nn::ModelFlops f =
        nn::mamba_flops(model_->config(), model_->batch(), model_->length(), want_dx_);
    return {f.forward(), f.backward(), 0};
  }

 private:
  // The rare path: a batch of a new shape (and setup, when the shape is known).
  void resize(int64_t B, int64_t W) {
    const auto& c = model_->config();
    model_->resize(static_cast<int>(B), static_cast<int>(W), bf16_);
    y_ = Tensor::empty({B, W, c.d_model}, DType::f32, device_, "mamba output");
    dx_ = Tensor::empty({B, W, c.din}, DType::f32, device_, "mamba input gradient");
  }

  std::unique_ptr<MambaRunner> model_;
  Device device_;
  nn::ParamStore store_;
  std::vector<std::vector<Parameter*>> layer_params_;  // per layer, for gradients_ready
  Tensor x_, y_, dx_;
  bool bf16_ = false, want_dx_ = true, shadow_checked_ = false;
  nn::FrameStream<nn::MambaRecurrent<float>, nn::MambaConfig> stream_;  // Runner::stream's state
};
SLIPSTREAM_REGISTER_STAGE(MambaStage);

}  // namespace
}  // namespace slipstream
