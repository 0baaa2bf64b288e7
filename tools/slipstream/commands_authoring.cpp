// `slipstream new-stage NAME` (a compiling skeleton stage and its test) and
// `slipstream stage run KIND` (one stage alone on stored tensors).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>

#include "engine/registry.h"
#include "engine/safetensors.h"
#include "engine/stage_harness.h"
#include "engine/text_match.h"
#include "tools/slipstream/commands.h"

namespace fs = std::filesystem;

namespace slipstream::cli {

namespace {

std::string camel(const std::string& snake) {
  std::string out;
  bool up = true;
  for (char c : snake) {
    if (c == '_') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out;
}

std::string fill(std::string text, const std::string& kind, const std::string& cls,
                 const std::string& family) {
  text = std::regex_replace(text, std::regex("@KIND@"), kind);
  text = std::regex_replace(text, std::regex("@CLASS@"), cls);
  return std::regex_replace(text, std::regex("@FAMILY@"), family);
}

constexpr const char* kStageTemplate =
    R"tpl(// @KIND@: y = x Wᵀ + b over the last dimension (a linear layer). TODO: say what yours computes.
//
// What a real stage needs, in the order the engine asks for it:
// - schema(): ports, parameters with ranges and docs, .trainable() (it has weights), and
//   .streaming(...): per_position says a position's output depends on that position alone, so
//   `slipstream infer` and the policy library can run the trained model frame by frame (a stage
//   without the declaration makes them refuse the model).
// - setup(): output shapes, the weights in an nn::ParamStore (nn::ParamLayout names them as the
//   checkpoint stores them, "NAME.weight"), and the stage's math built once by ops::with_ops for
//   the run's device: the CPU kernels, the CUDA kernels on the run's stream, or the emulator.
// - forward()/backward() go through that math only, on buffers from the ops (the run's device),
//   so one source trains on the CPU and a GPU. Input gradients are written (=), parameter
//   gradients accumulate (+=): micro-batches add up before the optimizer step.
#include <cmath>

#include "engine/registry.h"
#include "stages/nn/param_layout.h"
#include "stages/nn/param_store.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {

// The stage's math, whichever ops it runs on. x (M, In), W (Out, In), b (Out), y (M, Out).
class @CLASS@Math {
 public:
  virtual ~@CLASS@Math() = default;
  virtual Tensor alloc(size_t n, const char* what) const = 0;
  virtual size_t scratch_bytes(int M, int Out) const = 0;
  virtual void forward(const float* x, const float* w, const float* b, float* y, int M, int In,
                       int Out) const = 0;
  virtual void backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                        float* db, void* scratch, int M, int In, int Out) const = 0;
};

template <class Ops>
class @CLASS@MathOn final : public @CLASS@Math {
 public:
  explicit @CLASS@MathOn(Ops ops) : o_(ops) {}
  Tensor alloc(size_t n, const char* what) const override {
    return o_.template alloc<float>(n, what);
  }
  size_t scratch_bytes(int M, int Out) const override {
    ops::ScratchNeeds need;  // the bias gradient's column sum
    need.norm_rows = static_cast<size_t>(M);
    need.norm_cols = static_cast<size_t>(Out);
    return std::max<size_t>(1, o_.scratch_bytes(need));
  }
  void forward(const float* x, const float* w, const float* b, float* y, int M, int In,
               int Out) const override {
    o_.gemm(false, true, M, Out, In, x, nullptr, In, w, nullptr, In, 0.0f, y, Out, nullptr);
    o_.add_bias_rows(y, b, static_cast<size_t>(M), static_cast<size_t>(Out));
  }
  void backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                void* scratch, int M, int In, int Out) const override {
    o_.gemm(false, false, M, In, Out, dy, nullptr, Out, w, nullptr, In, 0.0f, dx, In, nullptr);
    o_.gemm(true, false, Out, In, M, dy, nullptr, Out, x, nullptr, In, 1.0f, dw, In, nullptr);
    o_.column_sum_accumulate(dy, db, static_cast<size_t>(M), static_cast<size_t>(Out), scratch);
  }

 private:
  Ops o_;
};

}  // namespace

class @CLASS@ : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("@KIND@")
        .family("@FAMILY@")
        .doc("y = x W^T + b over the last dimension. Replace with what the stage does.")
        .trainable()
        .streaming(Streaming::per_position)
        .input("x", DType::f32, -1, "(..., In) input")
        .output("y", DType::f32, -1, "(..., Out) x W^T + b")
        .param("features", int64_t{0}, "Out, the output width; 0: the input's width")
        .range(0, 65536);
  }

  void setup(StageContext& ctx) override {
    Shape ys = ctx.input_shape("x");
    const int last = ys.rank() - 1;
    if (last < 0 || ys[last] < 1)
      throw std::runtime_error("@KIND@ '" + ctx.name() + "': x is " + ys.str() +
                               "; its last dimension must be known when the graph is planned");
    in_ = ys[last];
    out_ = ctx.params().integer("features") > 0 ? ctx.params().integer("features") : in_;
    ys[last] = out_;
    ctx.declare_output("y", ys, DType::f32);

    nn::ParamLayout layout;
    w_ = layout.add("weight", {out_, in_}, true);  // weight decay on the matrix
    b_ = layout.add("bias", {out_}, false);        // none on the bias
    device_ = ctx.exec().device();
    store_.allocate(layout, false, device_, ctx.run().param_arena.get());
    store_.initialize([&](float* v) {  // W ~ U(±1/√In), as torch.nn.Linear; b = 0
      nn::InitRng rng(ctx.seed());
      const double a = 1.0 / std::sqrt(static_cast<double>(in_));
      for (int64_t i = 0; i < out_ * in_; ++i) v[w_ + i] = static_cast<float>(rng.uniform(-a, a));
      for (int64_t i = 0; i < out_; ++i) v[b_ + i] = 0.0f;
    });
    math_ = ops::with_ops(ctx.exec(), "@KIND@ '" + ctx.name() + "'",
                          [](auto o) -> std::unique_ptr<@CLASS@Math> {
                            return std::make_unique<@CLASS@MathOn<decltype(o)>>(o);
                          });
  }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    if (x.dtype() != DType::f32 || x.device() != device_ || x.rank() < 1 ||
        x.dim(x.rank() - 1) != in_)
      throw std::runtime_error("@KIND@ '" + ctx.name() + "': x is " + x.describe() +
                               ", expected f32 (..., " + std::to_string(in_) + ") on " +
                               device_.str());
    const int M = static_cast<int>(x.numel() / in_);
    reserve(M);
    const float* v = store_.values();
    math_->forward(x.data<float>(), v + w_, v + b_, y_.data<float>(), M, int(in_), int(out_));
    Shape ys = x.shape();
    ys[ys.rank() - 1] = out_;
    ctx.set_output(b, "y", y_.slice_rows(0, int64_t{M} * out_).reshape(ys));
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& dy = ctx.output_grad(b, "y");
    if (!dy.defined()) return;
    const Tensor& x = ctx.input(b, "x");
    const int M = static_cast<int>(x.numel() / in_);
    float* g = store_.grads();
    math_->backward(x.data<float>(), store_.values() + w_, dy.data<float>(), dx_.data<float>(),
                    g + w_, g + b_, scratch_.raw(), M, int(in_), int(out_));
    ctx.add_input_grad(b, "x", dx_.slice_rows(0, x.numel()).reshape(x.shape()));
  }

  std::vector<Parameter*> parameters() override { return store_.pointers(); }

 private:
  // Buffers grow to the largest batch seen: steady state allocates nothing. A trainable stage
  // runs one batch at a time and may hand out y_; a stage before the trainable section works
  // while other batches are in flight and makes each batch's outputs fresh (Tensor::empty).
  void reserve(int M) {
    if (M <= rows_cap_) return;
    rows_cap_ = M;
    y_ = math_->alloc(size_t(M) * size_t(out_), "@KIND@ output");
    dx_ = math_->alloc(size_t(M) * size_t(in_), "@KIND@ input gradient");
    scratch_ = math_->alloc((math_->scratch_bytes(M, int(out_)) + 3) / 4, "@KIND@ scratch");
  }

  int64_t in_ = 0, out_ = 0;
  size_t w_ = 0, b_ = 0;  // offsets of the weight and the bias in the store
  nn::ParamStore store_;
  std::unique_ptr<@CLASS@Math> math_;
  Device device_;
  Tensor y_, dx_, scratch_;
  int rows_cap_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(@CLASS@);

}  // namespace slipstream
)tpl";

constexpr const char* kTestTemplate = R"tpl(#include <gtest/gtest.h>

#include "engine/stage_harness.h"

using namespace slipstream;

// y = x Wᵀ + b with the stage's own initial weights; the backward's dx = dy W. (`slipstream
// stage check @KIND@ --input x=2,3,8`, a (batch, window, features) input as a graph gives it,
// checks every gradient against finite differences.)
TEST(@CLASS@, ForwardAndBackward) {
  StageHarness h("@KIND@", {"features=2"});
  Tensor x = Tensor::empty({2, 3}, DType::f32);
  for (int i = 0; i < 6; ++i) x.data<float>()[i] = 0.5f * static_cast<float>(i) - 1.0f;
  h.setup({{"x", x}});
  auto out = h.forward({{"x", x}});
  std::map<std::string, Tensor> w = h.weights();
  const float* W = w.at("weight").data<float>();
  const float* bias = w.at("bias").data<float>();
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 2; ++o) {
      double want = bias[o];
      for (int i = 0; i < 3; ++i) want += x.data<float>()[r * 3 + i] * W[o * 3 + i];
      EXPECT_NEAR(out["y"].data<float>()[r * 2 + o], want, 1e-5);
    }
  Tensor dy = Tensor::empty({2, 2}, DType::f32);
  for (int i = 0; i < 4; ++i) dy.data<float>()[i] = 1.0f + static_cast<float>(i);
  auto grads = h.backward({{"y", dy}});
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i) {
      double want = 0;
      for (int o = 0; o < 2; ++o) want += dy.data<float>()[r * 2 + o] * W[o * 3 + i];
      EXPECT_NEAR(grads["grad.x"].data<float>()[r * 3 + i], want, 1e-5);
    }
}
)tpl";

// A plugin project outside the tree (`new-stage NAME --out DIR`), built against the installed
// SDK (cmake --install ... --component sdk/tools); its tests run the installed CLI on it.
constexpr const char* kPluginCMake = R"tpl(cmake_minimum_required(VERSION 3.25)
project(@KIND@ LANGUAGES CXX)

# The slipstream SDK: `cmake --install <slipstream build> --prefix P --component tools` and
# `--component sdk`, then configure this project with -DCMAKE_PREFIX_PATH=P.
find_package(slipstream REQUIRED)
slipstream_add_plugin(@KIND@ @KIND@.cpp)
target_compile_options(@KIND@ PRIVATE -Wall -Wextra -Werror)

enable_testing()
# The schema loads and documents itself; the backward matches finite differences of the forward.
add_test(NAME @KIND@_schema
         COMMAND slipstream::slipstream --plugin $<TARGET_FILE:@KIND@> stages @KIND@)
add_test(NAME @KIND@_gradients
         COMMAND slipstream::slipstream --plugin $<TARGET_FILE:@KIND@> stage check @KIND@
                 --input x=2,3,8)
)tpl";

constexpr const char* kPluginReadme = R"tpl(# @KIND@ — a slipstream stage plugin

    cmake -S . -B build -DCMAKE_PREFIX_PATH=<slipstream install prefix>
    cmake --build build && (cd build && ctest --output-on-failure)

Use it in a graph:

    plugins: [build/lib@KIND@.so]   # a path from the graph file's folder, or absolute
    stages:
      ...
      - name: my_step
        kind: @KIND@
        inputs: {x: embed.x}
      - name: core
        kind: mamba
        inputs: {x: my_step.y, continues: h2d.continues}
      ...

Inputs bind by name: a stage reads an output of another name when the graph names it
(`{x: my_step.y}`), as above.

`slipstream --plugin build/lib@KIND@.so stages @KIND@` prints its schema;
`slipstream --plugin build/lib@KIND@.so stage check @KIND@ --input x=2,3,8` checks its gradients.
)tpl";

// Writes `files` (path, text) unless one exists.
int write_new(const std::vector<std::pair<fs::path, std::string>>& files) {
  for (const auto& [p, text] : files)
    if (fs::exists(p)) {
      std::cerr << "new-stage: " << p.string() << " exists; not overwriting\n";
      return kExitFailure;
    }
  for (const auto& [p, text] : files) {
    fs::create_directories(p.parent_path());
    std::ofstream out(p);
    out << text;
    if (!out.flush()) {
      std::cerr << "new-stage: cannot write " << p.string() << "\n";
      return kExitFailure;
    }
    std::cout << "wrote " << p.string() << "\n";
  }
  return kExitOk;
}

int new_plugin_project(const std::string& kind, const std::string& family, const fs::path& dir) {
  // The project's library target is named after the kind: CMake keeps these names for its own.
  static const std::set<std::string> kCMakeTargets = {"all",
                                                      "clean",
                                                      "depend",
                                                      "edit_cache",
                                                      "help",
                                                      "install",
                                                      "list_install_components",
                                                      "package",
                                                      "package_source",
                                                      "preinstall",
                                                      "rebuild_cache",
                                                      "test"};
  if (kCMakeTargets.count(kind)) {
    std::cerr << "new-stage: '" << kind
              << "' is a target name CMake keeps for itself, and the plugin project's library "
                 "is named after the kind; choose another name\n";
    return kExitConfig;
  }
  const std::string cls = camel(kind) + "Stage";
  const int status = write_new({{dir / "CMakeLists.txt", fill(kPluginCMake, kind, cls, family)},
                                {dir / (kind + ".cpp"), fill(kStageTemplate, kind, cls, family)},
                                {dir / "README.md", fill(kPluginReadme, kind, cls, family)}});
  if (status != kExitOk) return status;
  std::cout << "next: cmake -S " << dir.string() << " -B " << (dir / "build").string()
            << " -DCMAKE_PREFIX_PATH=<slipstream install prefix>, build, ctest;\n"
            << "      then `plugins: [" << (dir / "build" / ("lib" + kind + ".so")).string()
            << "]` in a graph.\n";
  return kExitOk;
}

int new_stage(const std::string& kind, const std::string& family, const std::string& root,
              const std::string& out) {
  if (!std::regex_match(kind, std::regex("[a-z][a-z0-9_]*"))) {
    std::cerr << "new-stage: NAME must be snake_case (a-z, 0-9, _), got '" << kind << "'\n";
    return kExitConfig;
  }
  if (!std::regex_match(family, std::regex("[a-z][a-z0-9_]*"))) {
    std::cerr << "new-stage: --family must be snake_case, got '" << family << "'\n";
    return kExitConfig;
  }
  // Two registrations of one kind abort every binary at start-up: refuse the name now.
  if (StageRegistry::find(kind)) {
    std::cerr << "new-stage: '" << kind << "' is already a stage kind (`slipstream stages " << kind
              << "`); choose another name\n";
    return kExitConfig;
  }
  if (!out.empty()) return new_plugin_project(kind, family, out);
  fs::path src = fs::path(root) / "stages" / family / (kind + ".cpp");
  fs::path test = fs::path(root) / "tests" / "stages" / (kind + "_test.cpp");
  if (!fs::exists(fs::path(root) / "stages") || !fs::exists(fs::path(root) / "tests")) {
    std::cerr << "new-stage: " << root
              << " is not a slipstream source tree (no stages/ and tests/)\n";
    return kExitFailure;
  }
  std::string cls = camel(kind) + "Stage";
  if (int status = write_new({{src, fill(kStageTemplate, kind, cls, family)},
                              {test, fill(kTestTemplate, kind, cls, family)}});
      status != kExitOk)
    return status;
  std::cout << "next: `make build` picks both up; `slipstream stages " << kind
            << "` shows the schema;\n"
            << "      use it in a graph with `kind: " << kind << "`.\n";
  return kExitOk;
}

struct StageRunArgs {
  std::string kind, inputs, weights, grads, out, name = "stage", precision = "fp32";
  std::vector<std::string> sets;
};

int stage_run(const StageRunArgs& a) {
  try {
    StageHarness h(a.kind, a.sets, a.name,
                   a.precision == "bf16" ? Precision::bf16 : Precision::fp32);
    auto inputs = read_safetensors(a.inputs).tensors;
    h.setup(inputs);
    if (!a.weights.empty()) {
      // As --out writes them (weight.NAME) or bare.
      std::map<std::string, Tensor> w;
      for (auto& [k, v] : read_safetensors(a.weights).tensors)
        w[k.starts_with("weight.") ? k.substr(7) : k] = v;
      h.load_weights(w);
    }
    std::map<std::string, Tensor> out = h.forward(inputs);
    bool is_loss = h.context().schema().stage_role() == StageRole::loss;
    if (!a.grads.empty() || is_loss) {
      std::map<std::string, Tensor> dout;
      if (!a.grads.empty()) dout = read_safetensors(a.grads).tensors;
      // A gradient under another name than an output's would leave that output's at zero.
      std::vector<std::string> outputs;
      for (const PortSpec& p : h.context().schema().outputs()) outputs.push_back(p.name);
      for (const auto& [name, t] : dout)
        if (std::find(outputs.begin(), outputs.end(), name) == outputs.end()) {
          std::string list;
          for (const auto& o : outputs) list += (list.empty() ? "" : ", ") + o;
          throw std::runtime_error(a.grads + ": '" + name + "' is not an output of " + a.kind +
                                   " (its outputs: " + list + ")" + did_you_mean(name, outputs));
        }
      for (auto& [k, v] : h.backward(dout)) out[k] = v;
    }
    for (auto& [k, v] : h.weights()) out["weight." + k] = v;
    std::map<std::string, std::string> meta{{"kind", a.kind}};
    for (const auto& [k, v] : h.metrics()) meta["metric." + k] = std::to_string(v);
    write_safetensors(a.out, out, meta);
    std::cout << "wrote " << a.out << ":";
    for (const auto& [k, v] : out) std::cout << " " << k << v.shape().str();
    std::cout << "\n";
    return kExitOk;
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kExitConfig;
  } catch (const std::exception& e) {
    std::cerr << "stage run: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace

void add_stage_check_command(CLI::App& stage);  // commands_stage_check.cpp

void add_authoring_commands(CLI::App& app) {
  auto kind = std::make_shared<std::string>();
  auto family = std::make_shared<std::string>("custom");
  auto root = std::make_shared<std::string>(".");
  auto* ns = app.add_subcommand(
      "new-stage", "Write a compiling skeleton stage and its test (with --out: a plugin project)");
  ns->add_option("name", *kind, "snake_case kind name")->required();
  ns->add_option("--family", *family,
                 "stage family: its folder under stages/ (with --out: the schema's family only)");
  ns->add_option("--root", *root, "source tree root");
  auto out = std::make_shared<std::string>();
  ns->add_option("--out", *out,
                 "write a plugin project here instead (CMakeLists.txt against the installed SDK, "
                 "the stage, a README), outside any source tree")
      ->excludes("--root");
  ns->callback(
      [kind, family, root, out] { set_exit_code(new_stage(*kind, *family, *root, *out)); });

  auto a = std::make_shared<StageRunArgs>();
  auto* stage = app.add_subcommand("stage", "Work with one stage alone");
  stage->require_subcommand(1);
  auto* run = stage->add_subcommand(
      "run",
      "Run one stage on stored tensors (forward; backward with --grad, and always for a loss "
      "stage)");
  run->add_option("kind", a->kind, "stage kind")->required();
  run->add_option("--inputs", a->inputs, "safetensors file: one tensor per input port")->required();
  run->add_option("--weights", a->weights,
                  "safetensors file of parameters, named bare or as --out writes them "
                  "(weight.NAME); else the stage's own initialisation, seed 1");
  run->add_option("--grad", a->grads, "safetensors file: gradient per output port (runs backward)");
  run->add_option("--out", a->out,
                  "where to write outputs, gradients (grad.*) and weights (weight.*)")
      ->required();
  run->add_option("--set", a->sets, "param=value (repeatable)");
  run->add_option("--name", a->name, "stage name (weight names may carry it as a prefix)");
  run->add_option("--precision", a->precision, "fp32 | bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  run->callback([a] { set_exit_code(stage_run(*a)); });
  add_stage_check_command(*stage);
}

}  // namespace slipstream::cli
