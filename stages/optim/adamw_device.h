// The optimizer step on a device: every parameter of the run updated by one fused multi-tensor
// AdamW (kernels/adamw.h's adamw_step on CUDA or the emulator) that decides the gradient norm,
// the skip on a non-finite norm, clipping and the learning rate on the device; the EMA of the
// weights is updated in the same pass. AdamWOptimizer drives it when its parameters live where
// device ops run (stages/ops/with_ops.h). Sharded over device ranks (ZeRO-1), it updates this
// rank's pieces and gathers the rest, every collective enqueued on the compute stream.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "engine/exec_context.h"
#include "engine/optimizer_shard.h"
#include "engine/stage.h"
#include "stages/optim/lr_schedule.h"

namespace slipstream::optim {

struct AdamWConfig;

// Elements [begin, begin + n) of a parameter and their moments (n elements each), on the
// parameter's device; ema, of the whole parameter, may be undefined. Unsharded, a slot is a whole
// parameter.
struct AdamWDeviceSlot {
  Parameter* p = nullptr;
  size_t begin = 0, n = 0;
  Tensor* m = nullptr;
  Tensor* v = nullptr;
  Tensor* ema = nullptr;
};

// What one device step did, read back from the device.
struct AdamWDeviceOutcome {
  bool finite = true;
  double lr = 0, grad_norm = 0;
  int64_t step = 0;  // updates applied so far
};

class AdamWDevice {
 public:
  virtual ~AdamWDevice() = default;
  // Enqueues one update from the gradients summed over `accumulate` micro-batches and the
  // read-back of its outcome, which `on_outcome` gets when the runner completes the step's
  // read-backs (ExecContext::read_back_later).
  virtual void step(std::function<void(const AdamWDeviceOutcome&)> on_outcome) = 0;
  // The device's count of applied updates (a resume sets it).
  virtual void set_step(int64_t step) = 0;
  virtual void refresh_shadows() = 0;  // bf16 copies from the FP32 values
  virtual void swap_ema() = 0;         // values <-> EMA, then the bf16 copies
};

// The learning rates of steps [0, n) as the device reads them (float, as the CPU passes them).
std::vector<float> lr_table(const LrSchedule& schedule, size_t n);

// `shard` (ZeRO-1 over device ranks, null otherwise): the slots are this rank's pieces; the
// gradient norm is summed over the ranks on the device (OptimizerShard::sum_on_device), the
// other ranks' pieces of the weights are gathered after the update (gather_weights), and their
// bf16 copies, EMAs and gradients follow (adamw_finish_gathered).
// `params`: every parameter whole, with its EMA (may be null or undefined), for the bf16 copies
// and the EMA swap.
std::unique_ptr<AdamWDevice> make_adamw_device(
    const ExecContext& exec, const std::vector<AdamWDeviceSlot>& slots,
    const std::vector<std::pair<Parameter*, Tensor*>>& params, const AdamWConfig& config,
    std::shared_ptr<OptimizerShard> shard = nullptr);

}  // namespace slipstream::optim
