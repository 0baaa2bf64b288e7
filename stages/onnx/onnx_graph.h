// An ONNX model built node by node (onnx.proto's ModelProto through Debian's libonnx-dev), for
// `slipstream export --format onnx`: named inputs and outputs with a symbolic batch dimension,
// weights as initializers, and the few composite pieces the exported steps share (a Linear with
// PyTorch's (out, in) weight, RMSNorm, SiLU). Opset 17, IR version 8: what ONNX 1.12 checks and
// ONNX Runtime runs. No protobuf type appears here: the model lives behind a pointer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace slipstream::onnx_export {

enum class Elem { f32, i64 };

// A dimension of an input or output: a size, or kBatch (the symbolic "batch").
inline constexpr int64_t kBatch = -1;

class OnnxGraph {
 public:
  explicit OnnxGraph(const std::string& name);
  ~OnnxGraph();
  OnnxGraph(const OnnxGraph&) = delete;
  OnnxGraph& operator=(const OnnxGraph&) = delete;

  void input(const std::string& name, Elem type, const std::vector<int64_t>& dims);
  // Marks `value` (a node's output) as the graph output `name` (an Identity between them when
  // the names differ).
  void output(const std::string& name, const std::string& value, Elem type,
              const std::vector<int64_t>& dims);

  // Initializers; each returns its name (unique: `name`, or `name` and a number).
  std::string weight(const std::string& name, const std::vector<int64_t>& dims, const float* data);
  std::string weight(const std::string& name, const std::vector<int64_t>& dims,
                     const std::vector<float>& data);
  std::string ints(const std::string& name, const std::vector<int64_t>& values);
  std::string scalar(const std::string& name, float value);

  // A node; returns its (single) output's name. `attrs` are given through the Attr helpers.
  struct Attr {
    std::string name;
    enum class Kind { i, f, ints } kind;
    int64_t i = 0;
    float f = 0;
    std::vector<int64_t> v;
  };
  static Attr attr(const std::string& name, int64_t v) { return {name, Attr::Kind::i, v, 0, {}}; }
  static Attr attr_f(const std::string& name, float v) { return {name, Attr::Kind::f, 0, v, {}}; }
  static Attr attr(const std::string& name, std::vector<int64_t> v) {
    return {name, Attr::Kind::ints, 0, 0, std::move(v)};
  }
  std::string node(const std::string& op, const std::vector<std::string>& inputs,
                   const std::vector<Attr>& attrs = {});
  // A node with several outputs (GRU: Y, Y_h); returns their names.
  std::vector<std::string> node_n(const std::string& op, const std::vector<std::string>& inputs,
                                  int outputs, const std::vector<Attr>& attrs = {});

  // x (..., in) W^T + b with PyTorch's W (out, in) row-major, stored transposed; b may be null.
  std::string linear(const std::string& x, const std::string& name, const float* W, const float* b,
                     int64_t out, int64_t in);
  // x / sqrt(mean(x², last axis) + eps) * weight, as kernels/rmsnorm.h.
  std::string rms_norm(const std::string& x, const std::string& name, const float* weight,
                       int64_t width, float eps);
  std::string silu(const std::string& x);
  // x[..., begin:end] along `axis`.
  std::string slice(const std::string& x, int64_t axis, int64_t begin, int64_t end);
  std::string unsqueeze(const std::string& x, const std::vector<int64_t>& axes);
  std::string squeeze(const std::string& x, const std::vector<int64_t>& axes);
  std::string reduce_sum(const std::string& x, int64_t axis, bool keepdims);

  // The model as onnx::checker::check_model sees it; throws naming what is wrong.
  void check() const;
  // Serialised to `path` (atomically: a temporary beside it, then renamed); throws naming it.
  void write(const std::string& path) const;
  // The graph's inputs in the order declared.
  std::vector<std::string> input_names() const;
  // Nodes and initializers so far (for messages and tests).
  size_t nodes() const;
  size_t initializers() const;

 private:
  std::string fresh(const std::string& base);
  struct Model;  // the ModelProto
  std::unique_ptr<Model> m_;
  size_t counter_ = 0;
};

}  // namespace slipstream::onnx_export
