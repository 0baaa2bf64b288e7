// Finite-difference checks of every parameter tensor of a model whose weights live in one flat
// buffer (stages/nn/param_layout.h): each slot is perturbed through a copy written back into w.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "tests/kernels/gradcheck.h"

namespace slipstream::nn::test {

template <class Slots>
void check_parameter_gradients(const Slots& slots, const std::function<double()>& loss,
                               std::vector<double>& w, const std::vector<double>& g,
                               size_t max_checks) {
  for (const auto& s : slots) {
    const auto first = static_cast<long>(s.offset), last = static_cast<long>(s.offset + s.numel);
    std::vector<double> ws(w.begin() + first, w.begin() + last);
    std::vector<double> gs(g.begin() + first, g.begin() + last);
    auto loss_s = [&] {
      std::copy(ws.begin(), ws.end(), w.begin() + first);
      return loss();
    };
    kernels::test::check_gradient(s.name, loss_s, ws, gs, 1e-6, 1e-6, max_checks);
    std::copy(ws.begin(), ws.end(), w.begin() + first);
  }
}

}  // namespace slipstream::nn::test
