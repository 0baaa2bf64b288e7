// The kernel tables: every CUDA entry point of kernels/ as a static member of one struct per
// build, kernels::cuda::Kernels (the device build, kernels/*_cuda.cu) and
// kernels::cuda_emulated::Kernels (the same sources compiled for the CPU emulator,
// kernels/emulation). Code that runs on either is a template over the table (the stages' device
// ops, stages/ops/device_ops.h; the kernel tests, tests/kernel_ops/kernel_test.h).
//
// An op declares its entry points once, in the second part of its own header (kernels/OP.h,
// under SLIPSTREAM_CUDA_ENTRY_POINTS); the one line that registers it is its #include below.
// Entry points take device pointers and a stream, enqueue their kernels on it and return without
// synchronising; a failed launch throws std::runtime_error naming the op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

namespace cuda {
struct Kernels {
  static constexpr bool kEmulated = false;
#define SLIPSTREAM_CUDA_ENTRY_POINTS
#include "kernels/cuda_kernel_list.inc"
#undef SLIPSTREAM_CUDA_ENTRY_POINTS
};
}  // namespace cuda

namespace cuda_emulated {
struct Kernels {
  static constexpr bool kEmulated = true;
#define SLIPSTREAM_CUDA_ENTRY_POINTS
#include "kernels/cuda_kernel_list.inc"
#undef SLIPSTREAM_CUDA_ENTRY_POINTS
};
}  // namespace cuda_emulated

using CudaKernels = cuda::Kernels;
using EmulatedKernels = cuda_emulated::Kernels;

// The pair a stage's device path is compiled against (stages/ops/with_ops.h).
struct KernelFamily {
  using Cuda = CudaKernels;
  using Emulated = EmulatedKernels;
};

}  // namespace slipstream::kernels
