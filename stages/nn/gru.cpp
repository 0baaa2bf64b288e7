// gru: stacked GRU layers with PyTorch nn.GRU's names, layout and initialisation, sequence to
// sequence from a zero initial state, or (backend kernels, `continues` connected, the loader's
// rows: streams) from each row's state the previous batch left. The math is GruModel (gru_model.h)
// over the ops of the run's backend (with_ops.h: the CPU kernels, or on a device each step a
// cuBLASLt GEMM and a gate kernel, kernels/gru_cuda.cu), or with `backend: cudnn` on a CUDA device
// the whole stack in cuDNN's RNN (kernels/gru_cudnn.h), the weights in the same store. Under bf16
// precision the kernels backend runs each layer's bf16 form (kernels/gru.h: bf16 GEMM operands,
// FP32 gates and sums) and the cudnn backend cuDNN's bf16 RNN (bf16 data, states and weights, FP32
// sums; cuDNN 9.13 or later, else FP32 with a note saying why), both from the store's bf16 shadow,
// which the optimizer keeps in step. On a stream (Runner::stream) the forward continues each row's
// sequence one frame at a time (gru_recurrent.h, CPU, FP32 weights).

#include "engine/registry.h"
#if SLIPSTREAM_KERNELS_CUDA
#include "kernels/gru_cudnn.h"
#endif
#include "stages/nn/gru_model.h"
#include "stages/nn/gru_recurrent.h"
#include "stages/nn/model_stage_util.h"
#include "stages/nn/param_store.h"
#include "stages/nn/sequence_stage.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {

using GruRunner = nn::SequenceModel<nn::GruConfig, nn::GruLayout>;
template <class Ops>
using GruRunnerOn = nn::SequenceModelOn<nn::GruModel<float, Ops>, nn::GruConfig, nn::GruLayout>;

#if SLIPSTREAM_KERNELS_CUDA
// The stack in cuDNN's RNN on the run's CUDA device, in its fp32 or bf16 form: its weight
// spaces, workspace, reserve and bf16 staging from the device pool, sized by resize().
class GruRunnerCudnn final : public GruRunner {
 public:
  GruRunnerCudnn(const nn::GruConfig& c, const ExecContext& exec, bool bf16)
      : c_(c),
        lay_(c),
        device_(exec.device()),
        stream_(static_cast<cudaStream_t>(exec.stream())),
        gru_(stream_, c.din, c.hidden, offsets(lay_), bf16) {
    auto bytes = [&](const char* what) {
      return Tensor::zeros({static_cast<int64_t>(gru_.weight_space_bytes())}, DType::u8, device_,
                           what);
    };
    weights_ = bytes("gru cuDNN weight space");
    dweights_ = bytes("gru cuDNN weight gradients");
  }
  const nn::GruConfig& config() const override { return c_; }
  const nn::GruLayout& layout() const override { return lay_; }
  int batch() const override { return B_; }
  int length() const override { return L_; }
  bool has_bf16_form() const override { return gru_.bf16(); }
  void refresh_shadow(const nn::ParamStore& store) const override {
    struct Rounding {  // the one op ParamStore::refresh_shadow asks of a model's ops
      cudaStream_t stream;
      void to_bf16(const float* x, uint16_t* y, size_t n) const {
        kernels::CudaKernels::fp32_to_bf16(x, reinterpret_cast<kernels::bfloat16*>(y), n, stream);
      }
    };
    store.refresh_shadow(Rounding{stream_});
  }
  void resize(int B, int L, bool) override {
    B_ = B, L_ = L;
    const auto needs = gru_.describe_batch(B, L);
    auto bytes = [&](size_t n, const char* what) {
      return Tensor::zeros({static_cast<int64_t>(std::max<size_t>(n, 1))}, DType::u8, device_,
                           what);
    };
    work_ = bytes(needs.work_bytes, "gru cuDNN workspace");
    reserve_ = bytes(needs.reserve_bytes, "gru cuDNN reserve");
    staging_ =
        needs.staging_bytes > 0 ? bytes(needs.staging_bytes, "gru cuDNN bf16 staging") : Tensor();
    lengths_ = Tensor::zeros({B}, DType::i32, device_, "gru cuDNN sequence lengths");
    dx_ = Tensor::zeros({int64_t{B} * L * c_.din}, DType::f32, device_, "gru input gradient");
    gru_.set_batch(lengths_.data<int>());
  }
  void forward(const float* x, const float* w, const uint16_t* wb, float* y) override {
    gru_.forward(x, w, reinterpret_cast<const kernels::bfloat16*>(wb), y, buffers(), true);
    y_ = y;
  }
  void backward(const float* x, const float* dy, const float*, const uint16_t*, float* g, float* dx,
                const std::function<void(int)>* layer_done) override {
    // cuDNN writes the input gradient whether or not it is wanted.
    gru_.backward(x, y_, dy, dx ? dx : dx_.data<float>(), g, buffers());
    // One call computes every layer's gradients: all are final together.
    if (layer_done)
      for (int l = c_.layers - 1; l >= 0; --l) (*layer_done)(l);
  }

 private:
  static std::vector<kernels::cuda::CudnnGru::LayerOffsets> offsets(const nn::GruLayout& lay) {
    std::vector<kernels::cuda::CudnnGru::LayerOffsets> o;
    for (const auto& l : lay.layers) o.push_back({l.w_ih, l.w_hh, l.b_ih, l.b_hh});
    return o;
  }
  kernels::cuda::CudnnGru::Buffers buffers() {
    return {weights_.raw(),
            dweights_.raw(),
            work_.raw(),
            reserve_.raw(),
            staging_.defined() ? staging_.raw() : nullptr,
            lengths_.data<int>()};
  }

  nn::GruConfig c_;
  nn::GruLayout lay_;
  Device device_;
  cudaStream_t stream_;
  kernels::cuda::CudnnGru gru_;
  Tensor weights_, dweights_, work_, reserve_, staging_, lengths_, dx_;
  const float* y_ = nullptr;  // the last forward's output (the backward reads it)
  int B_ = 0, L_ = 0;
};
#endif

class GruStage final
    : public nn::SequenceStage<nn::GruConfig, nn::GruLayout, nn::GruRecurrent<float>> {
 public:
  static StageSchema schema() {
    return StageSchema("gru")
        .family("nn")
        .doc(
            "Stacked GRU (PyTorch nn.GRU names and semantics, zero initial state unless the state "
            "is carried); causal sequence to sequence.")
        .trainable()
        .streaming(Streaming::recurrent)
        .input("x", DType::f32, 3, "(B, W, Din) input sequence")
        .optional_input("continues", DType::f32, 1,
                        nn::continues_input_doc("every layer's last state; backend kernels only, "
                                                "backend cudnn starts each batch from zero"))
        .output("y", DType::f32, 3, "(B, W, hidden) the last layer's state at every step")
        .param("hidden", int64_t{128}, "hidden size H")
        .range(1, 65536)
        .param("layers", int64_t{1}, "stacked GRU layers")
        .range(1, 256)
        .param("backend", std::string("kernels"),
               "kernels: the run's ops (the CPU's, or on a GPU a cuBLASLt GEMM and a gate kernel "
               "per step; bf16 GEMM operands under precision bf16) | cudnn: the whole stack in "
               "cuDNN's RNN (CUDA devices; under precision bf16 cuDNN's bf16 RNN, from cuDNN "
               "9.13)")
        .choices({"kernels", "cudnn"});
  }

  void setup(StageContext& ctx) override {
    const Shape& in = ctx.input_shape("x");
    if (in.rank() != 3 || in[2] <= 0)
      throw std::runtime_error("input x must be (B, W, Din) with Din known at setup, got " +
                               in.str());
    nn::GruConfig c;
    c.din = static_cast<int>(in[2]);
    c.hidden = static_cast<int>(ctx.params().integer("hidden"));
    c.layers = static_cast<int>(ctx.params().integer("layers"));
    std::unique_ptr<Model> model;
    if (ctx.params().string("backend") == "cudnn") {
      if (ctx.exec().backend() != KernelBackend::cuda)
        throw std::runtime_error(
            "backend cudnn runs on a CUDA device and this run's is " + ctx.exec().device().str() +
            ": use backend kernels (cudnn was set at " + ctx.params().mark("backend").str() + ")");
#if SLIPSTREAM_KERNELS_CUDA
      bool bf16 = ctx.run().precision == Precision::bf16;
      if (bf16) {
        const std::string why = kernels::cuda::CudnnGru::bf16_unsupported();
        if (!why.empty()) {
          ctx.log("note: backend cudnn computes in fp32 under precision bf16: " + why +
                  " (backend kernels has a bf16 form)");
          bf16 = false;
        }
      }
      model = std::make_unique<GruRunnerCudnn>(c, ctx.exec(), bf16);
#endif
    } else {
      model = ops::with_ops(ctx.exec(), "gru '" + ctx.name() + "'",
                            [&](auto ops) -> std::unique_ptr<Model> {
                              return std::make_unique<GruRunnerOn<decltype(ops)>>(c, ops);
                            });
    }
    setup_model(
        ctx, in, std::move(model),
        [&](float* w) { nn::gru_init(c, model_->layout(), w, ctx.seed()); }, "gru");
  }

  Cost cost() const override {
    if (B_ <= 0) return {};
    const nn::ModelFlops f = nn::gru_flops(model_->config(), B_, W_);
    return {f.forward(), f.backward(), 0};
  }

 private:
  int output_width(const nn::GruConfig& c) const override {
    return c.hidden;
  }
};
SLIPSTREAM_REGISTER_STAGE(GruStage);

}  // namespace
}  // namespace slipstream
