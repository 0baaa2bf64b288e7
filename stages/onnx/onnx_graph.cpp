#include "stages/onnx/onnx_graph.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <stdexcept>

#include "engine/atomic_file.h"

namespace slipstream::onnx_export {

struct OnnxGraph::Model {
  onnx::ModelProto proto;
  onnx::GraphProto& graph() { return *proto.mutable_graph(); }
};

namespace {

int32_t onnx_type(Elem e) {
  return e == Elem::f32 ? onnx::TensorProto::FLOAT : onnx::TensorProto::INT64;
}

void describe(onnx::ValueInfoProto* v, const std::string& name, Elem type,
              const std::vector<int64_t>& dims) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx_type(type));
  auto* shape = t->mutable_shape();
  for (int64_t d : dims) {
    if (d == kBatch) {
      shape->add_dim()->set_dim_param("batch");
    } else {
      shape->add_dim()->set_dim_value(d);
    }
  }
}

}  // namespace

OnnxGraph::OnnxGraph(const std::string& name) : m_(std::make_unique<Model>()) {
  m_->proto.set_ir_version(8);
  m_->proto.set_producer_name("slipstream");
  auto* opset = m_->proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  m_->graph().set_name(name);
}

OnnxGraph::~OnnxGraph() = default;

std::string OnnxGraph::fresh(const std::string& base) {
  return base + "_" + std::to_string(counter_++);
}

void OnnxGraph::input(const std::string& name, Elem type, const std::vector<int64_t>& dims) {
  describe(m_->graph().add_input(), name, type, dims);
}

void OnnxGraph::output(const std::string& name, const std::string& value, Elem type,
                       const std::vector<int64_t>& dims) {
  if (name != value) {
    auto* n = m_->graph().add_node();
    n->set_op_type("Identity");
    n->set_name(fresh("Identity"));
    n->add_input(value);
    n->add_output(name);
  }
  describe(m_->graph().add_output(), name, type, dims);
}

std::string OnnxGraph::weight(const std::string& name, const std::vector<int64_t>& dims,
                              const float* data) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  auto* t = m_->graph().add_initializer();
  const std::string id = fresh(name);
  t->set_name(id);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  t->set_raw_data(
      std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(float)));
  return id;
}

std::string OnnxGraph::weight(const std::string& name, const std::vector<int64_t>& dims,
                              const std::vector<float>& data) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (static_cast<int64_t>(data.size()) != n)
    throw std::logic_error("onnx weight " + name + ": " + std::to_string(data.size()) +
                           " values for " + std::to_string(n) + " elements");
  return weight(name, dims, data.data());
}

std::string OnnxGraph::ints(const std::string& name, const std::vector<int64_t>& values) {
  auto* t = m_->graph().add_initializer();
  const std::string id = fresh(name);
  t->set_name(id);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
  return id;
}

std::string OnnxGraph::scalar(const std::string& name, float value) {
  auto* t = m_->graph().add_initializer();
  const std::string id = fresh(name);
  t->set_name(id);
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_float_data(value);
  return id;
}

std::vector<std::string> OnnxGraph::node_n(const std::string& op,
                                           const std::vector<std::string>& inputs, int outputs,
                                           const std::vector<Attr>& attrs) {
  auto* n = m_->graph().add_node();
  n->set_op_type(op);
  const std::string id = fresh(op);
  n->set_name(id);
  for (const auto& in : inputs) n->add_input(in);
  std::vector<std::string> outs;
  for (int k = 0; k < outputs; ++k) {
    outs.push_back(id + "_out" + std::to_string(k));
    n->add_output(outs.back());
  }
  for (const Attr& a : attrs) {
    auto* p = n->add_attribute();
    p->set_name(a.name);
    switch (a.kind) {
      case Attr::Kind::i:
        p->set_type(onnx::AttributeProto::INT);
        p->set_i(a.i);
        break;
      case Attr::Kind::f:
        p->set_type(onnx::AttributeProto::FLOAT);
        p->set_f(a.f);
        break;
      case Attr::Kind::ints:
        p->set_type(onnx::AttributeProto::INTS);
        for (int64_t v : a.v) p->add_ints(v);
        break;
    }
  }
  return outs;
}

std::string OnnxGraph::node(const std::string& op, const std::vector<std::string>& inputs,
                            const std::vector<Attr>& attrs) {
  return node_n(op, inputs, 1, attrs)[0];
}

std::string OnnxGraph::linear(const std::string& x, const std::string& name, const float* W,
                              const float* b, int64_t out, int64_t in) {
  std::vector<float> wt(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      wt[static_cast<size_t>(i * out + o)] = W[static_cast<size_t>(o * in + i)];
  std::string y = node("MatMul", {x, weight(name + ".weight_t", {in, out}, wt)});
  if (b) y = node("Add", {y, weight(name + ".bias", {out}, b)});
  return y;
}

std::string OnnxGraph::rms_norm(const std::string& x, const std::string& name, const float* w,
                                int64_t width, float eps) {
  const std::string ms =
      node("ReduceMean", {node("Mul", {x, x})}, {attr("axes", std::vector<int64_t>{-1})});
  const std::string rstd =
      node("Reciprocal", {node("Sqrt", {node("Add", {ms, scalar(name + ".eps", eps)})})});
  return node("Mul", {node("Mul", {x, rstd}), weight(name + ".weight", {width}, w)});
}

std::string OnnxGraph::silu(const std::string& x) {
  return node("Mul", {x, node("Sigmoid", {x})});
}

std::string OnnxGraph::slice(const std::string& x, int64_t axis, int64_t begin, int64_t end) {
  return node("Slice", {x, ints("begin", {begin}), ints("end", {end}), ints("axis", {axis})});
}

std::string OnnxGraph::unsqueeze(const std::string& x, const std::vector<int64_t>& axes) {
  return node("Unsqueeze", {x, ints("axes", axes)});
}

std::string OnnxGraph::squeeze(const std::string& x, const std::vector<int64_t>& axes) {
  return node("Squeeze", {x, ints("axes", axes)});
}

std::string OnnxGraph::reduce_sum(const std::string& x, int64_t axis, bool keepdims) {
  return node("ReduceSum", {x, ints("axes", {axis})}, {attr("keepdims", int64_t{keepdims})});
}

void OnnxGraph::check() const {
  try {
    onnx::checker::check_model(m_->proto);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("the exported ONNX model does not check: ") + e.what());
  }
}

void OnnxGraph::write(const std::string& path) const {
  std::string bytes;
  if (!m_->proto.SerializeToString(&bytes))
    throw std::runtime_error("cannot serialise the ONNX model for " + path +
                             " (over protobuf's 2 GiB limit?)");
  write_file_atomically(path, bytes);
}

std::vector<std::string> OnnxGraph::input_names() const {
  std::vector<std::string> names;
  for (const auto& v : m_->proto.graph().input()) names.push_back(v.name());
  return names;
}

size_t OnnxGraph::nodes() const {
  return static_cast<size_t>(m_->proto.graph().node_size());
}
size_t OnnxGraph::initializers() const {
  return static_cast<size_t>(m_->proto.graph().initializer_size());
}

}  // namespace slipstream::onnx_export
