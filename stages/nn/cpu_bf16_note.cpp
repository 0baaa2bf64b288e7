// Tells the runner what precision bf16 does on this CPU (engine/exec_context.h), from what the
// kernels found at run time: native bf16 GEMMs (oneDNN on AVX-512 BF16 / AMX), or rounded
// operands multiplied by the fp32 GEMMs, which costs time rather than saving it.
#include "engine/exec_context.h"
#include "kernels/gemm_onednn.h"

namespace slipstream {
namespace {

std::string describe() {
  if (kernels::onednn_bf16_gemm_native())
    return "the GEMMs multiply bf16 natively (oneDNN, " + kernels::onednn_bf16_gemm_kernel() +
           "; about twice fp32's GEMM throughput here), the other ops run in fp32";
  return "the GEMMs' operands are rounded to bf16 and multiplied in fp32, as no native bf16 "
         "GEMM is available (" +
         kernels::onednn_bf16_gemm_kernel() +
         "): the GPU path's numerics, at more cost than fp32; use precision fp32 for speed on "
         "this CPU";
}

const bool registered = (set_cpu_bf16_description(&describe), true);

}  // namespace
}  // namespace slipstream
