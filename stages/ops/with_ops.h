// The one place a stage's ops are chosen by the run's execution context: CpuOps<float> on the
// CPU, DeviceOps over a CUDA kernel table on a GPU (compute stream, cuBLASLt handle and workspace
// of the context), DeviceOps over the emulated table under `device: emulated`. A stage calls
// with_ops once, in setup, with a generic lambda that builds its path over the ops it is given
// (the model of mamba/gru/heads, or a stage's own CPU and device forms); from then on every op
// of the stage is enqueued through them.
//
// `Family` names the pair of tables (kernels/cuda_kernels.h's KernelFamily: the kernels of
// kernels/; a stage with kernels of its own passes a family whose tables extend those, as the
// Melee stages do with melee::MeleeKernelFamily). Ops::Table is the table in use.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "engine/exec_context.h"
#include "kernels/cuda_kernels.h"
#include "stages/ops/cpu_ops.h"
#include "stages/ops/device_ops.h"

namespace slipstream::ops {

// f(ops) with the ops of exec's backend; every branch must return the same type (e.g. a
// unique_ptr to the stage's interface). `who` names the stage in the error a build without that
// backend gives.
template <class Family = kernels::KernelFamily, class F>
auto with_ops(const ExecContext& exec, const std::string& who, F&& f) {
  switch (exec.backend()) {
    case KernelBackend::cpu:
      return f(CpuOps<float>());
    case KernelBackend::cuda:
#if SLIPSTREAM_KERNELS_CUDA
      return f(DeviceOps<typename Family::Cuda>(
          exec.device(), static_cast<cudaStream_t>(exec.stream()),
          {exec.blas_handle(), exec.blas_workspace(), exec.blas_workspace_bytes()}));
#else
      throw std::runtime_error(who + ": device " + exec.device().str() +
                               " but this build has no CUDA kernels");
#endif
    case KernelBackend::emulated:
      return f(DeviceOps<typename Family::Emulated>(Device::cpu(), nullptr, {}));
  }
  throw std::logic_error(who + ": unknown kernel backend");
}

}  // namespace slipstream::ops
