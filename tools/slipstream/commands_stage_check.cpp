// `slipstream stage check KIND --input x=4,8`: a stage's backward against finite differences of
// its own forward, on random inputs of the given shapes, through the real stage code on the CPU.
// The test a stage author (in the tree or in a plugin project) runs first.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>

#include "engine/schema.h"
#include "engine/stage_harness.h"
#include "tools/slipstream/commands.h"

namespace slipstream::cli {

namespace {

struct CheckArgs {
  std::string kind;
  std::vector<std::string> inputs, sets;
  int64_t samples = 24;  // elements checked per tensor
  double tolerance = 2e-2;
  uint64_t seed = 1;
};

// "x=4,8" -> ("x", {4, 8}).
std::pair<std::string, Shape> parse_input(const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("--input " + s + ": expected NAME=D0,D1,... e.g. x=4,8");
  std::vector<int64_t> dims;
  std::stringstream ss(s.substr(eq + 1));
  for (std::string d; std::getline(ss, d, ',');) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(d, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != d.size() || v < 1 || v > (1 << 24))
      throw std::invalid_argument("--input " + s + ": '" + d + "' is not a dimension (1..2^24)");
    dims.push_back(v);
  }
  if (dims.empty()) throw std::invalid_argument("--input " + s + ": no dimensions");
  return {s.substr(0, eq), Shape(dims)};
}

int check_stage(const CheckArgs& a) {
  return exit_status_of([&] {
    StageHarness h(a.kind, a.sets);
    std::mt19937_64 rng(a.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::map<std::string, Tensor> inputs;
    for (const auto& spec : a.inputs) {
      auto [name, shape] = parse_input(spec);
      Tensor t = Tensor::empty(shape, DType::f32);
      for (float& v : t.span<float>()) v = 0.5f * normal(rng);
      inputs[name] = t;
    }
    h.setup(inputs);
    const bool is_loss = h.context().schema().stage_role() == StageRole::loss;
    // The objective: a loss stage's own output, otherwise sum(dy * y) with fixed random dy.
    std::map<std::string, Tensor> dy;
    auto objective = [&]() {
      auto out = h.forward(inputs);
      double f = 0;
      for (const auto& [name, y] : out) {
        if (y.dtype() != DType::f32) continue;
        if (is_loss) {
          f += y.span<float>()[0];
          continue;
        }
        auto it = dy.find(name);
        if (it == dy.end()) {
          Tensor g = Tensor::empty(y.shape(), DType::f32);
          for (float& v : g.span<float>()) v = normal(rng);
          it = dy.emplace(name, g).first;
        }
        const auto ys = y.span<float>();
        const auto gs = it->second.span<float>();
        for (size_t i = 0; i < ys.size(); ++i) f += double(ys[i]) * gs[i];
      }
      return f;
    };
    objective();
    auto grads = h.backward(dy);

    // Each f32 input and parameter: a sample of elements, central differences.
    struct Target {
      std::string name;
      float* data;
      size_t n;
      const Tensor* grad;
    };
    std::vector<Target> targets;
    for (auto& [name, t] : inputs) {
      auto g = grads.find("grad." + name);
      if (g != grads.end())
        targets.push_back({"input " + name, t.data<float>(), size_t(t.numel()), &g->second});
    }
    for (Parameter* p : h.stage().parameters()) {
      auto g = grads.find("grad." + p->name);
      if (g != grads.end() && p->value.dtype() == DType::f32)
        targets.push_back({p->name, p->value.data<float>(), size_t(p->value.numel()), &g->second});
    }
    if (targets.empty())
      throw std::runtime_error("stage '" + a.kind +
                               "' gave no gradient of an input or parameter: is it differentiable, "
                               "and were its inputs given (--input NAME=D0,D1,...)?");
    bool ok = true;
    std::printf("%-40s %8s %12s  %s\n", "gradient of", "checked", "max error", "");
    for (const Target& t : targets) {
      const size_t count = std::min<size_t>(t.n, static_cast<size_t>(a.samples));
      std::uniform_int_distribution<size_t> pick(0, t.n - 1);
      double worst = 0;
      const float* g = t.grad->data<float>();
      for (size_t k = 0; k < count; ++k) {
        const size_t i = count == t.n ? k : pick(rng);
        const float x = t.data[i];
        const float e = 1e-2f * std::max(1.0f, std::fabs(x));
        t.data[i] = x + e;
        const double fp = objective();
        t.data[i] = x - e;
        const double fm = objective();
        t.data[i] = x;
        const double numeric = (fp - fm) / (double(x + e) - double(x - e));
        const double err = std::fabs(numeric - g[i]) / std::max(1.0, std::fabs(numeric));
        worst = std::max(worst, err);
      }
      const bool pass = worst <= a.tolerance;
      ok &= pass;
      std::printf("%-40s %8zu %12.3g  %s\n", t.name.c_str(), count, worst, pass ? "ok" : "FAIL");
    }
    std::cout << (ok ? "gradients match finite differences"
                     : "gradients differ from finite differences")
              << " (relative to max(1, |numeric|), tolerance " << a.tolerance << ")\n";
    return ok ? kExitOk : kExitFailure;
  });
}

}  // namespace

void add_stage_check_command(CLI::App& stage) {
  auto a = std::make_shared<CheckArgs>();
  auto* cmd = stage.add_subcommand(
      "check",
      "Check a stage's backward against finite differences of its forward, on random inputs "
      "(up to --samples elements of each input and of each parameter)");
  cmd->add_option("kind", a->kind, "stage kind")->required();
  cmd->add_option("--input,-i", a->inputs, "NAME=D0,D1,... a random f32 input (repeatable)");
  cmd->add_option("--set", a->sets, "param=value (repeatable)");
  cmd->add_option("--samples", a->samples, "elements checked per tensor")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--tolerance", a->tolerance,
                  "largest error allowed: |numeric - analytic| / max(1, |numeric|)")
      ->check(CLI::Range(1e-12, 1e6));
  cmd->add_option("--seed", a->seed, "seed of the inputs and the elements picked");
  cmd->callback([a] { set_exit_code(check_stage(*a)); });
}

}  // namespace slipstream::cli
