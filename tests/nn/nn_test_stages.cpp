#include "tests/nn/nn_test_stages.h"

#include <cmath>

#include "engine/registry.h"
#include "stages/nn/param_layout.h"

namespace slipstream::nn_test {

namespace {
// Reserved up front so recording a loss never allocates (the zero-allocation test).
std::vector<double>& loss_log() {
  static std::vector<double> v = [] {
    std::vector<double> r;
    r.reserve(1 << 16);
    return r;
  }();
  return v;
}
}  // namespace

void reset_losses() {
  loss_log().clear();
}
const std::vector<double>& losses() {
  return loss_log();
}

// x: random values fixed by the batch index; target[t, j] = tanh of the causal running mean of
// x[:, j % din] over the last 4 positions (a task a causal sequence model can learn).
class SequenceSource : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("nn_test_source")
        .family("test")
        .doc("Synthetic causal regression batches for the nn tests.")
        .role(StageRole::source)
        .output("x", DType::f32, 3, "(B, W, din)")
        .output("target", DType::f32, 3, "(B, W, dout)")
        .param("batch", int64_t{4}, "B")
        .param("window", int64_t{16}, "W")
        .param("din", int64_t{6}, "input width")
        .param("dout", int64_t{12}, "target width")
        .param("count", int64_t{100000}, "batches per epoch")
        .param("reuse", false, "fill the same two tensors every batch (zero-allocation test)")
        .param("tells_count", true,
               "publish `count` as the run's length (RunState::source_batches)");
  }
  void setup(StageContext& ctx) override {
    const Params& p = ctx.params();
    B_ = p.integer("batch"), W_ = p.integer("window"), din_ = p.integer("din"),
    dout_ = p.integer("dout");
    count_ = p.integer("count");
    reuse_ = p.boolean("reuse");
    if (p.boolean("tells_count")) ctx.declare_source_batches(static_cast<uint64_t>(count_));
    ctx.declare_output("x", {B_, W_, din_}, DType::f32);
    ctx.declare_output("target", {B_, W_, dout_}, DType::f32);
    x_ = Tensor::empty({B_, W_, din_}, DType::f32);
    t_ = Tensor::empty({B_, W_, dout_}, DType::f32);
  }
  bool produce(Batch& out, StageContext& ctx) override {
    if (static_cast<int64_t>(out.index) >= count_) return false;
    if (!reuse_) {
      x_ = Tensor::empty({B_, W_, din_}, DType::f32);
      t_ = Tensor::empty({B_, W_, dout_}, DType::f32);
    }
    nn::InitRng rng(out.index * 7919 + 17);
    float* x = x_.data<float>();
    float* t = t_.data<float>();
    for (int64_t i = 0; i < x_.numel(); ++i) x[i] = static_cast<float>(rng.uniform(-1, 1));
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t w = 0; w < W_; ++w)
        for (int64_t j = 0; j < dout_; ++j) {
          double s = 0;
          for (int64_t k = std::max<int64_t>(0, w - 3); k <= w; ++k)
            s += x[(b * W_ + k) * din_ + j % din_];
          t[(b * W_ + w) * dout_ + j] =
              static_cast<float>(std::tanh(s * (j < dout_ / 2 ? 1.0 : -0.5)));
        }
    out.samples = static_cast<uint64_t>(B_);
    ctx.set_output(out, "x", x_);
    ctx.set_output(out, "target", t_);
    return true;
  }
  void seek(uint64_t, StageContext&) override {}  // batches depend on their index only

 private:
  int64_t B_ = 0, W_ = 0, din_ = 0, dout_ = 0, count_ = 0;
  bool reuse_ = false;
  Tensor x_, t_;
};
SLIPSTREAM_REGISTER_STAGE(SequenceSource);

class MseLoss : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("nn_test_mse")
        .family("test")
        .doc("mean((y - target)^2) for the nn tests.")
        .role(StageRole::loss)
        .input("y", DType::f32, 3, "prediction")
        .input("target", DType::f32, 3, "target");
  }
  void setup(StageContext& ctx) override {
    grad_ = Tensor::empty(ctx.input_shape("y"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& y = ctx.input(b, "y");
    const Tensor& t = ctx.input(b, "target");
    if (!(y.shape() == t.shape()))
      throw std::runtime_error("nn_test_mse: y " + y.describe() + " vs target " + t.describe());
    if (!(y.shape() == grad_.shape())) grad_ = Tensor::empty(y.shape(), DType::f32);  // batcher
    const int64_t n = y.numel();
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = double(y.data<float>()[i]) - double(t.data<float>()[i]);
      s += d * d;
      grad_.data<float>()[i] = static_cast<float>(2.0 * d / double(n));
    }
    ctx.metric("loss", s / double(n));
    if (ctx.run().training) loss_log().push_back(s / double(n));
  }
  void backward(Batch& b, StageContext& ctx) override { ctx.add_input_grad(b, "y", grad_); }

 private:
  Tensor grad_;
};
SLIPSTREAM_REGISTER_STAGE(MseLoss);

std::vector<float>& probe_log() {
  static std::vector<float> v;
  return v;
}
const std::vector<float>& probed_gradient() {
  return probe_log();
}

// y = x, passing the gradient through and keeping a host copy of it.
class GradProbe : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("nn_test_probe")
        .family("test")
        .doc("y = x; records the gradient it gets.")
        .differentiable()
        .input("x", DType::f32, 3, "values")
        .output("y", DType::f32, 3, "the same values");
  }
  void setup(StageContext& ctx) override {
    ctx.declare_output("y", ctx.input_shape("x"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override { ctx.set_output(b, "y", ctx.input(b, "x")); }
  void backward(Batch& b, StageContext& ctx) override {
    const Tensor dy = ctx.output_grad(b, "y").to(Device::cpu());
    probe_log().assign(dy.data<float>(), dy.data<float>() + dy.numel());
  }
};
SLIPSTREAM_REGISTER_STAGE(GradProbe);

// y = a + b; both inputs get dy.
class Sum : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("nn_test_sum")
        .family("test")
        .doc("y = a + b.")
        .differentiable()
        .input("a", DType::f32, 3, "values")
        .input("b", DType::f32, 3, "values")
        .output("y", DType::f32, 3, "a + b");
  }
  void setup(StageContext& ctx) override {
    ctx.declare_output("y", ctx.input_shape("a"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& a = ctx.input(b, "a");
    y_ = Tensor::empty(a.shape(), DType::f32, a.device(), "nn_test_sum output");
    add_f32(a, ctx.input(b, "b"), y_, ctx.exec().stream());
    ctx.set_output(b, "y", y_);
  }
  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& dy = ctx.output_grad(b, "y");
    ctx.add_input_grad(b, "a", dy);
    ctx.add_input_grad(b, "b", dy);
  }

 private:
  Tensor y_;
};
SLIPSTREAM_REGISTER_STAGE(Sum);

}  // namespace slipstream::nn_test
