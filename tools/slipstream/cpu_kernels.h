// What the CPU path's kernels run on this machine: the vector level and which library does the
// fp32 and bf16 GEMMs (kernels/vector_math.h, kernels/gemm_onednn.h). `slipstream devices` and
// `slipstream bench` print it: figures from different levels or GEMM libraries do not compare.
#pragma once

#include <string>

namespace slipstream::cli {

struct CpuKernels {
  std::string isa;   // "avx512", "avx2" or "generic" (SLIPSTREAM_CPU_ISA caps it)
  std::string fp32;  // e.g. "oneDNN brg:avx512_core", or "OpenBLAS sgemm"
  std::string bf16;  // e.g. "oneDNN brg:avx512_core_bf16", or "fp32 GEMMs of rounded operands"
};
CpuKernels cpu_kernels();
// "cpu kernels: avx512; fp32 GEMMs: ...; bf16 GEMMs: ..."
std::string cpu_kernels_line();

}  // namespace slipstream::cli
