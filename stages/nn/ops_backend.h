// The one place a stage's ops are chosen by the run's execution context: CpuOps<float> on the
// CPU, DeviceOps over the CUDA kernels on a GPU (compute stream, cuBLASLt handle and workspace of
// the context), DeviceOps over the emulated kernels under `device: emulated`. A stage calls
// with_ops once, in setup, with a generic lambda that builds its model over the ops it is given;
// from then on every op of the stage is enqueued through them.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "engine/exec_context.h"
#include "kernels/cuda_kernel_table.h"
#include "stages/nn/device_ops.h"
#include "stages/nn/model_ops.h"
#if SLIPSTREAM_CUDA_EMULATOR
#include "kernels/emulation/emulated_kernels.h"
#endif

namespace slipstream::nn {

#if SLIPSTREAM_KERNELS_CUDA
SLIPSTREAM_CUDA_KERNEL_TABLE(CudaKernels, ::slipstream::kernels::cuda, false);
#endif
#if SLIPSTREAM_CUDA_EMULATOR
SLIPSTREAM_CUDA_KERNEL_TABLE(EmulatedKernels, ::slipstream::kernels::cuda_emulated, true);
#endif

// f(ops) with the ops of exec's backend; every branch must return the same type (e.g. a
// unique_ptr to the stage's model interface). `who` names the stage in the error a build
// without that backend gives.
template <class F>
auto with_ops(const ExecContext& exec, const std::string& who, F&& f) {
  switch (exec.backend()) {
    case KernelBackend::cpu:
      return f(CpuOps<float>());
    case KernelBackend::cuda:
#if SLIPSTREAM_KERNELS_CUDA
      return f(DeviceOps<CudaKernels>(
          exec.device(), static_cast<cudaStream_t>(exec.stream()),
          {exec.blas_handle(), exec.blas_workspace(), exec.blas_workspace_bytes()}));
#else
      throw std::runtime_error(who + ": device " + exec.device().str() +
                               " but this build has no CUDA kernels");
#endif
    case KernelBackend::emulated:
#if SLIPSTREAM_CUDA_EMULATOR
      return f(DeviceOps<EmulatedKernels>(Device::cpu(), nullptr, {}));
#else
      throw std::runtime_error(who +
                               ": device emulated needs the CUDA emulator, which sanitizer "
                               "builds leave out; use a regular build");
#endif
  }
  throw std::logic_error(who + ": unknown kernel backend");
}

// The device path of a stage that keeps its own CPU code: Impl<Ops>(ops, args...) over the device
// ops of exec's backend, or null on the CPU.
template <class Base, template <class> class Impl, class... Args>
std::unique_ptr<Base> make_device_path(const ExecContext& exec, const std::string& who,
                                       Args&&... args) {
  return with_ops(exec, who, [&](auto ops) -> std::unique_ptr<Base> {
    using Ops = decltype(ops);
    if constexpr (Ops::kBackend == KernelBackend::cpu)
      return nullptr;
    else
      return std::make_unique<Impl<Ops>>(ops, args...);
  });
}

}  // namespace slipstream::nn
