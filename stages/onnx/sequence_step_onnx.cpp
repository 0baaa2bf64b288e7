#include "stages/onnx/sequence_step_onnx.h"

#include <cmath>
#include <stdexcept>
#include <vector>

namespace slipstream::onnx_export {

const float* weight_values(const WeightOf& w, const std::string& name, size_t n) {
  const Tensor& t = w(name);
  if (t.dtype() != DType::f32 || static_cast<size_t>(t.numel()) != n)
    throw std::runtime_error("parameter " + name + ": expected " + std::to_string(n) +
                             " f32 values, the checkpoint has " + std::to_string(t.numel()) + " " +
                             std::string(dtype_name(t.dtype())));
  return t.data<float>();
}

namespace {
const float* values(const WeightOf& w, const std::string& name, size_t n) {
  return weight_values(w, name, n);
}
}  // namespace

std::string mamba_step(OnnxGraph& g, const nn::MambaConfig& c, const WeightOf& w,
                       const std::string& x, const std::string& prefix) {
  const int64_t dm = c.d_model, E = c.d_inner(), N = c.d_state, R = c.rank(), K = c.d_conv;
  const size_t dms = static_cast<size_t>(dm), Es = static_cast<size_t>(E),
               Ns = static_cast<size_t>(N), Rs = static_cast<size_t>(R);
  const float eps = static_cast<float>(c.eps);
  std::string h = x;
  if (c.has_input_proj())
    h = g.linear(x, "input_proj", values(w, "input_proj.weight", dms * size_t(c.din)),
                 values(w, "input_proj.bias", dms), dm, c.din);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string m = p + "mixer.";
    const std::string xn = g.rms_norm(h, p + "norm", values(w, p + "norm.weight", dms), dm, eps);
    const std::string xz = g.linear(
        xn, m + "in_proj", values(w, m + "in_proj.weight", 2 * Es * dms), nullptr, 2 * E, dm);
    const std::string xin = g.slice(xz, -1, 0, E), z = g.slice(xz, -1, E, 2 * E);
    // The conv over the last K inputs, oldest first: the state's K - 1, then this frame's.
    const float* cw = values(w, m + "conv1d.weight", Es * size_t(K));
    std::vector<float> taps(Es * size_t(K));  // (K, E)
    for (size_t e = 0; e < Es; ++e)
      for (size_t k = 0; k < size_t(K); ++k) taps[k * Es + e] = cw[e * size_t(K) + k];
    const std::string cb = g.weight(m + "conv1d.bias", {E}, values(w, m + "conv1d.bias", Es));
    std::string xc;
    if (K > 1) {
      const std::string state = prefix + ".conv." + std::to_string(l);
      g.input(state, Elem::f32, {kBatch, K - 1, E});
      const std::string win =
          g.node("Concat", {state, g.unsqueeze(xin, {1})}, {OnnxGraph::attr("axis", int64_t{1})});
      g.output(state + ".next", g.slice(win, 1, 1, K), Elem::f32, {kBatch, K - 1, E});
      xc = g.reduce_sum(g.node("Mul", {win, g.weight(m + "conv1d.taps", {K, E}, taps)}), 1, false);
    } else {
      xc = g.node("Mul", {xin, g.weight(m + "conv1d.taps", {E}, taps)});
    }
    const std::string u = g.silu(g.node("Add", {xc, cb}));
    const std::string dbc = g.linear(
        u, m + "x_proj", values(w, m + "x_proj.weight", (Rs + 2 * Ns) * Es), nullptr, R + 2 * N, E);
    const std::string dt = g.slice(dbc, -1, 0, R), Bm = g.slice(dbc, -1, R, R + N),
                      Cm = g.slice(dbc, -1, R + N, R + 2 * N);
    const std::string delta =
        g.node("Softplus", {g.linear(dt, m + "dt_proj", values(w, m + "dt_proj.weight", Es * Rs),
                                     values(w, m + "dt_proj.bias", Es), E, R)});
    // A = -exp(A_log), as the step computes it in float.
    const float* a_log = values(w, m + "A_log", Es * Ns);
    std::vector<float> A(Es * Ns);
    for (size_t i = 0; i < A.size(); ++i) A[i] = -std::exp(a_log[i]);
    const std::string dA =
        g.node("Exp", {g.node("Mul", {g.unsqueeze(delta, {2}), g.weight(m + "A", {E, N}, A)})});
    const std::string dBu =
        g.node("Mul", {g.unsqueeze(g.node("Mul", {delta, u}), {2}), g.unsqueeze(Bm, {1})});
    const std::string state = prefix + ".ssm." + std::to_string(l);
    g.input(state, Elem::f32, {kBatch, E, N});
    const std::string next = g.node("Add", {g.node("Mul", {state, dA}), dBu});
    g.output(state + ".next", next, Elem::f32, {kBatch, E, N});
    std::string y = g.reduce_sum(g.node("Mul", {next, g.unsqueeze(Cm, {1})}), 2, false);
    y = g.node("Add", {y, g.node("Mul", {u, g.weight(m + "D", {E}, values(w, m + "D", Es))})});
    y = g.node("Mul", {y, g.silu(z)});
    h = g.node("Add", {h, g.linear(y, m + "out_proj", values(w, m + "out_proj.weight", dms * Es),
                                   nullptr, dm, E)});
  }
  return g.rms_norm(h, "norm_f", values(w, "norm_f.weight", dms), dm, eps);
}

std::string gru_step(OnnxGraph& g, const nn::GruConfig& c, const WeightOf& w, const std::string& x,
                     const std::string& prefix) {
  const int64_t H = c.hidden;
  const size_t Hs = static_cast<size_t>(H);
  // PyTorch's gate blocks r, z, n; ONNX's z, r, h.
  const size_t order[3] = {1, 0, 2};
  auto reorder = [&](const float* v, size_t cols) {
    std::vector<float> out(3 * Hs * cols);
    for (size_t b = 0; b < 3; ++b)
      std::copy_n(v + order[b] * Hs * cols, Hs * cols, out.begin() + long(b * Hs * cols));
    return out;
  };
  std::string in = x;
  for (int l = 0; l < c.layers; ++l) {
    const std::string s = "_l" + std::to_string(l);
    const int64_t In = l == 0 ? c.din : c.hidden;
    const size_t Ins = static_cast<size_t>(In);
    const auto W = reorder(values(w, "weight_ih" + s, 3 * Hs * Ins), Ins);
    const auto Rw = reorder(values(w, "weight_hh" + s, 3 * Hs * Hs), Hs);
    auto bias = reorder(values(w, "bias_ih" + s, 3 * Hs), 1);
    const auto rb = reorder(values(w, "bias_hh" + s, 3 * Hs), 1);
    bias.insert(bias.end(), rb.begin(), rb.end());
    const std::string state = prefix + ".h." + std::to_string(l);
    g.input(state, Elem::f32, {kBatch, H});
    const auto outs = g.node_n(
        "GRU",
        {g.unsqueeze(in, {0}), g.weight("weight_ih" + s, {1, 3 * H, In}, W),
         g.weight("weight_hh" + s, {1, 3 * H, H}, Rw), g.weight("bias" + s, {1, 6 * H}, bias), "",
         g.unsqueeze(state, {0})},
        2, {OnnxGraph::attr("hidden_size", H), OnnxGraph::attr("linear_before_reset", int64_t{1})});
    in = g.squeeze(outs[1], {0});
    g.output(state + ".next", in, Elem::f32, {kBatch, H});
  }
  return in;
}

}  // namespace slipstream::onnx_export
