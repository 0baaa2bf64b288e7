// Learning-rate schedules, as a function of the optimizer step (0 for the first update).
//   constant         lr
//   linear_warmup    lr·(s+1)/warmup for s < warmup, then lr
//   cosine           linear warmup, then min_lr + (lr - min_lr)·½(1 + cos(π p)),
//                    p = (s - warmup) / (total - warmup) clamped to [0, 1]
//   cosine_restarts  linear warmup, then SGDR: cosine from lr to min_lr over restart_period
//                    steps, restarting at lr; each period restart_mult times the previous
#pragma once

#include <cstdint>
#include <string>

namespace slipstream::optim {

struct LrSchedule {
  enum class Kind { constant, linear_warmup, cosine, cosine_restarts };
  Kind kind = Kind::constant;
  double lr = 1e-4;
  double min_lr = 0;
  int64_t warmup = 0;
  int64_t total = 0;  // optimizer steps; cosine needs it
  int64_t restart_period = 1000;
  double restart_mult = 1.0;

  // Throws std::invalid_argument for an unknown name.
  static Kind parse(const std::string& name);
  double at(int64_t step) const;
};

}  // namespace slipstream::optim
