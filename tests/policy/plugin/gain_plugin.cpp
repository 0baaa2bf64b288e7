// A stage kind shipped as a plugin .so for the policy library's tests: y = gain · x, position by
// position (so a policy streams it frame by frame), on the CPU. A run whose graph names it must
// open in libslipstream_policy, which resolves the plugin's engine symbols.
#include <stdexcept>
#include <string>

#include "engine/registry.h"

namespace {

using namespace slipstream;

class PolicyTestGain : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("policy_test_gain")
        .family("plugin")
        .doc("y = gain * x (the policy library's plugin test).")
        .streaming(Streaming::per_position)
        .input("x", DType::f32, -1, "input")
        .output("y", DType::f32, -1, "gain * x")
        .param("gain", 0.5, "the factor");
  }
  void setup(StageContext& ctx) override {
    if (!ctx.exec().device().is_cpu())
      throw std::runtime_error("policy_test_gain '" + ctx.name() + "' runs on the CPU only");
    gain_ = static_cast<float>(ctx.params().number("gain"));
    ctx.declare_output("y", ctx.input_shape("x"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    Tensor y = ctx.input(b, "x").clone();
    for (float& v : y.span<float>()) v *= gain_;
    ctx.set_output(b, "y", y);
  }
  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& dy = ctx.output_grad(b, "y");
    if (!dy.defined()) return;
    Tensor dx = dy.clone();
    for (float& v : dx.span<float>()) v *= gain_;
    ctx.add_input_grad(b, "x", dx);
  }

 private:
  float gain_ = 0.5f;
};
SLIPSTREAM_REGISTER_STAGE(PolicyTestGain);

}  // namespace
