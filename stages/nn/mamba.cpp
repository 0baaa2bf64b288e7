// mamba: a stack of Mamba-1 blocks (mamba-ssm's MixerModel without the embedding), sequence to
// sequence and causal. The math is MambaModel (mamba_model.h) over the ops of the run's backend
// (with_ops.h: the CPU kernels, or the CUDA kernels on the run's stream); this file declares the
// stage's schema and builds the model, and sequence_stage.h binds it to the stage API (weights as
// Parameters on the run's device, buffers, bf16 under precision bf16, and on a stream the frame-
// by-frame forward from the previous batch's state: mamba_recurrent.h, CPU, fp32).
#include <cmath>

#include "engine/registry.h"
#include "stages/nn/mamba_model.h"
#include "stages/nn/mamba_recurrent.h"
#include "stages/nn/model_stage_util.h"
#include "stages/nn/param_store.h"
#include "stages/nn/sequence_stage.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {

// The model over the ops of the run's backend (the stage holds it as a SequenceModel).
template <class Ops>
using MambaRunnerOn =
    nn::SequenceModelOn<nn::MambaModel<float, Ops>, nn::MambaConfig, nn::MambaLayout>;

class MambaStage final
    : public nn::SequenceStage<nn::MambaConfig, nn::MambaLayout, nn::MambaRecurrent<float>> {
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
        .reads_bf16_copy()
        .optional_input("continues", DType::f32, 1,
                        nn::continues_input_doc("conv inputs and scan state"))
        .output("y", DType::f32, 3, "(B, W, d_model) output sequence")
        .param("d_model", int64_t{128},
               "model width (an input_proj maps Din to it when they differ)")
        .range(1, 65536)
        .param("d_state", int64_t{16}, "SSM state size per channel (at most 32 on a CUDA device)")
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
    setup_model(
        ctx, in,
        ops::with_ops(ctx.exec(), "mamba '" + ctx.name() + "'",
                      [&](auto ops) -> std::unique_ptr<Model> {
                        return std::make_unique<MambaRunnerOn<decltype(ops)>>(c, ops);
                      }),
        [&](float* w) { nn::mamba_init(c, model_->layout(), w, ctx.seed()); }, "mamba");
    // The final norm's gradient is the backward pass's first: it goes with the top layer's.
    for (Parameter* p : store_.pointers())
      if (p->name.starts_with("norm_f.")) layer_params_.back().push_back(p);
  }

  Cost cost() const override {
    if (B_ <= 0) return {};
    const nn::ModelFlops f = nn::mamba_flops(model_->config(), int(B_), int(W_), want_dx_);
    return {f.forward(), f.backward(), 0};
  }

 private:
  int output_width(const nn::MambaConfig& c) const override { return c.d_model; }
};
SLIPSTREAM_REGISTER_STAGE(MambaStage);

}  // namespace
}  // namespace slipstream
