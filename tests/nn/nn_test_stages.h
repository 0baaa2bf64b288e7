// Stage kinds used only by the nn tests (registered in the test binary): a synthetic sequence
// source, a mean-squared-error loss that records every training loss, a sum of two inputs and a
// probe that records the gradient it receives (two consumers of one tensor).
#pragma once

#include <vector>

namespace slipstream::nn_test {
void reset_losses();
const std::vector<double>& losses();
// What the last nn_test_probe backward received (its dy, on the host).
const std::vector<float>& probed_gradient();
}  // namespace slipstream::nn_test
