// A stage kind shipped as a plugin .so: loaded by `plugins: [...]` in a graph file.
#include "engine/registry.h"

namespace {

class PluginScale : public slipstream::Stage {
 public:
  static slipstream::StageSchema schema() {
    return slipstream::StageSchema("plugin_scale")
        .family("plugin")
        .doc("Multiplies i32 values by `factor` (test plugin).")
        .input("x", slipstream::DType::i32, 1, "in")
        .output("y", slipstream::DType::i32, 1, "x * factor")
        .param("factor", int64_t{2}, "multiplier");
  }
  void setup(slipstream::StageContext& ctx) override {
    factor_ = static_cast<int32_t>(ctx.params().integer("factor"));
    ctx.declare_output("y", ctx.input_shape("x"), slipstream::DType::i32);
  }
  void forward(slipstream::Batch& b, slipstream::StageContext& ctx) override {
    slipstream::Tensor y = ctx.input(b, "x").clone();
    for (int32_t& v : y.span<int32_t>()) v *= factor_;
    ctx.set_output(b, "y", y);
  }

 private:
  int32_t factor_ = 2;
};
SLIPSTREAM_REGISTER_STAGE(PluginScale);

}  // namespace
