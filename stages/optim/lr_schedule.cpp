#include "stages/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace slipstream::optim {

LrSchedule::Kind LrSchedule::parse(const std::string& name) {
  if (name == "constant") return Kind::constant;
  if (name == "linear_warmup") return Kind::linear_warmup;
  if (name == "cosine") return Kind::cosine;
  if (name == "cosine_restarts") return Kind::cosine_restarts;
  throw std::invalid_argument("unknown learning-rate schedule '" + name +
                              "' (constant, linear_warmup, cosine, cosine_restarts)");
}

double LrSchedule::at(int64_t step) const {
  if (kind == Kind::constant) return lr;
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const auto cosine = [&](double t, double period) {
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t / period));
  };
  const int64_t s = step - warmup;
  switch (kind) {
    case Kind::linear_warmup:
      return lr;
    case Kind::cosine: {
      const int64_t span = total - warmup;
      if (span <= 0) return min_lr;
      return cosine(std::min(static_cast<double>(s), static_cast<double>(span)),
                    static_cast<double>(span));
    }
    case Kind::cosine_restarts: {
      double t = static_cast<double>(s),
             period = static_cast<double>(std::max<int64_t>(1, restart_period));
      if (restart_mult == 1.0) return cosine(std::fmod(t, period), period);
      while (t >= period) t -= period, period *= restart_mult;  // periods grow geometrically
      return cosine(t, period);
    }
    case Kind::constant:
      break;
  }
  return lr;
}

}  // namespace slipstream::optim
