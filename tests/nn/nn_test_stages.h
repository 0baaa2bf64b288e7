// Stage kinds used only by the nn tests (registered in the test binary): a synthetic sequence
// source and a mean-squared-error loss that records every training loss.
#pragma once

#include <vector>

namespace slipstream::nn_test {
void reset_losses();
const std::vector<double>& losses();
}  // namespace slipstream::nn_test
