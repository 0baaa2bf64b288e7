// The optimizer step on a device: every parameter of the run updated by one fused multi-tensor
// AdamW (kernels/adamw.h's adamw_step on CUDA or the emulator) that decides the gradient norm,
// the skip on a non-finite norm, clipping and the learning rate on the device; the EMA of the
// weights is updated in the same pass. AdamWOptimizer drives it when its parameters live where
// device ops run (stages/nn/ops_backend.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/exec_context.h"
#include "engine/stage.h"
#include "stages/optim/lr_schedule.h"

namespace slipstream::optim {

struct AdamWConfig;

// One parameter and its optimizer tensors (on the parameter's device; ema may be undefined).
struct AdamWDeviceSlot {
  Parameter* p = nullptr;
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

std::unique_ptr<AdamWDevice> make_adamw_device(const ExecContext& exec,
                                               const std::vector<AdamWDeviceSlot>& slots,
                                               const AdamWConfig& config);

}  // namespace slipstream::optim
