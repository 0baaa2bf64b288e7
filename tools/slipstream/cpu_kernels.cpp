#include "tools/slipstream/cpu_kernels.h"

#include "kernels/gemm.h"
#include "kernels/gemm_onednn.h"
#include "kernels/vector_math.h"

namespace slipstream::cli {

CpuKernels cpu_kernels() {
  CpuKernels k;
  k.isa = kernels::cpu_isa_name(kernels::cpu_isa());
  k.fp32 = kernels::gemm_f32_uses_onednn()     ? "oneDNN " + kernels::onednn_f32_gemm_kernel()
           : kernels::onednn_f32_gemm_native() ? "OpenBLAS sgemm (OPENBLAS_NUM_THREADS is set)"
                                               : "OpenBLAS sgemm";
  k.bf16 = kernels::onednn_bf16_gemm_native() ? "oneDNN " + kernels::onednn_bf16_gemm_kernel()
                                              : "fp32 GEMMs of rounded operands";
  return k;
}

std::string cpu_kernels_line() {
  const CpuKernels k = cpu_kernels();
  return "cpu kernels: " + k.isa + "; fp32 GEMMs: " + k.fp32 + "; bf16 GEMMs: " + k.bf16;
}

}  // namespace slipstream::cli
