// AdamW over a set of Parameters: gradient accumulation, global-norm clipping, an LR schedule,
// the bf16 shadow written in the same pass as the update, and an EMA of the weights. The
// `adamw` stage drives it; tests and benchmarks use it directly. State (moments, EMA, counters,
// gradients accumulated but not yet applied) round-trips through save/load for exact resume.
// Given an execution context with device ops, the update runs there (adamw_device.h) on
// parameters that live on the context's device; the policy is the same.
//
// Given an OptimizerShard of several ranks (ZeRO-1, host parameters), it keeps moments for this
// rank's pieces only and updates only them (their gradients are the ones averaged over the
// ranks), the global gradient norm summed over the ranks; then every rank's updated weights are
// gathered. Its state is brought whole to rank 0 before a checkpoint (gather_state), so saved
// state reads as unsharded, and load() takes this rank's pieces of it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
              const ExecContext* exec = nullptr, std::shared_ptr<OptimizerShard> shard = nullptr);
  // Weights whose moments this rank keeps (all of them unless sharded over several ranks).
  size_t elements_updated() const;

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
  const Tensor& ema_of(size_t i) const { return held_[i].ema; }

  // Sharded: rank 0's save() needs gather_state() (every rank, same step) first.
  void save(StateWriter& w) const;
  // Also rewrites every bf16 shadow from the (just restored) FP32 values.
  void load(StateReader& r);
  // bf16 shadows from the FP32 values (after weights were replaced from outside).
  void refresh_shadows() const;

 private:
  struct Held {
    std::string name;
    Parameter* p = nullptr;
    Tensor ema;
  };
  // Moments of elements [begin, begin + n) of held_[held]'s parameter (the whole of it unless
  // sharded).
  struct Slot {
    size_t held = 0;
    size_t begin = 0, n = 0;
    Tensor m, v;
    Parameter* param = nullptr;  // held_[held].p
  };
  bool sharded() const { return shard_ != nullptr; }
  void gather_state();

  std::vector<Held> held_;
  std::vector<Slot> slots_;
  std::shared_ptr<OptimizerShard> shard_;  // null: this process updates every weight
  // Rank 0, after gather_state(): every rank's moments (its slots' m, then their v), rank order.
  std::vector<float> gathered_;
  int64_t gathered_at_ = -1;  // step_ when gathered
  AdamWConfig cfg_;
  int64_t step_ = 0, micro_ = 0;
  bool ema_swapped_ = false;
  std::unique_ptr<AdamWDevice> device_;  // null: the CPU update
  const ExecContext* exec_ = nullptr;
};

}  // namespace slipstream::optim
