// The CUDA entry points as the emulated build defines them (namespace kernels::cuda_emulated,
// library slipstream_kernels_emulated): the same declarations as kernels::cuda, so code written
// against a kernel namespace (a test's checks, a model's device ops) runs on the CPU emulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cuda_api.h"

namespace slipstream::kernels::cuda_emulated {
#include "kernels/adamw_cuda.inc"
#include "kernels/causal_conv1d_cuda.inc"
#include "kernels/elementwise_cuda.inc"
#include "kernels/gemm_cuda.inc"
#include "kernels/gru_cuda.inc"
#include "kernels/rmsnorm_cuda.inc"
#include "kernels/selective_scan_cuda.inc"
}  // namespace slipstream::kernels::cuda_emulated
