// AdamW over a set of Parameters: gradient accumulation, global-norm clipping, an LR schedule,
// the bf16 shadow written in the same pass as the update, and an EMA of the weights. The
// `adamw` stage drives it; tests and benchmarks use it directly. State (moments, EMA, counters,
// gradients accumulated but not yet applied) round-trips through save/load for exact resume.
// Given an execution context with device ops, the update runs there (adamw_device.h) on
// parameters that live on the context's device; the policy is the same.
#pragma once

#include <functional>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/stage.h"
#include "engine/state_io.h"
#include "stages/optim/adamw_device.h"
#include "stages/optim/lr_schedule.h"

namespace slipstream::optim {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double clip = 1.0;       // max global gradient norm; 0 = off
  int64_t accumulate = 1;  // micro-batches per update
  double ema = 0;          // EMA decay; 0 = off
  LrSchedule schedule;
};

class AdamWOptimizer {
 public:
  // What one call to micro_step did.
  struct Report {
    bool stepped = false;  // an update happened (every `accumulate` micro-batches)
    bool finite = true;    // false: a NaN/inf gradient; the update was skipped
    double lr = 0;
    double grad_norm = 0;  // of the averaged gradient, before clipping
  };

  // Parameters are named (the names key the saved state). Allocates moments and EMA copies on
  // the parameters' device. exec: where the update runs (null: the CPU).
  void attach(std::vector<std::pair<std::string, Parameter*>> params, const AdamWConfig& config,
              const ExecContext* exec = nullptr);

  // One micro-batch's gradients are in the parameters' grad buffers (summed with those of the
  // earlier micro-batches of this update). Every `accumulate`-th call updates the weights and
  // zeroes the gradients. Allocates nothing. `report` hears what the call did: at once on the
  // CPU; on a device, once the runner completes the step's read-backs (the update is enqueued
  // and the host does not wait for it here).
  void micro_step(const std::function<void(const Report&)>& report);
  // The same, waiting for the report (tests and tools; a device step's read-backs complete here).
  Report micro_step();

  int64_t steps() const { return step_; }
  int64_t pending_micro_batches() const { return micro_; }
  const AdamWConfig& config() const { return cfg_; }

  // EMA weights swapped in (validation) and back; no-ops without EMA.
  void swap_ema();
  // The parameters got new values from outside (a warm start): the EMA and the bf16 shadows
  // start again from them.
  void weights_replaced();
  bool ema_swapped() const { return ema_swapped_; }
  const Tensor& ema_of(size_t i) const { return slots_[i].ema; }

  void save(StateWriter& w) const;
  // Also rewrites every bf16 shadow from the (just restored) FP32 values.
  void load(StateReader& r);
  // bf16 shadows from the FP32 values (after weights were replaced from outside).
  void refresh_shadows() const;

 private:
  struct Slot {
    std::string name;
    Parameter* p = nullptr;
    Tensor m, v, ema;
  };
  std::vector<Slot> slots_;
  AdamWConfig cfg_;
  int64_t step_ = 0, micro_ = 0;
  bool ema_swapped_ = false;
  std::unique_ptr<AdamWDevice> device_;  // null: the CPU update
  const ExecContext* exec_ = nullptr;
};

}  // namespace slipstream::optim
