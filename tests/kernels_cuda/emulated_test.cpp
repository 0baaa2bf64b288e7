// The CUDA kernels, compiled for the CPU emulator (kernels/emulation), against the CPU
// references. Runs in every build, GPU or not: indexing, barriers, shared memory and warp
// reductions of the real kernel sources are exercised here; the gpu tests repeat the same
// checks on a device.
#include <gtest/gtest.h>

#define SLIPSTREAM_CUDA_EMULATION 1
#include "kernels/selective_scan_cuda.cu"

#include "tests/kernels_cuda/cuda_ops.h"
#include "tests/kernels_cuda/scan_checks.h"

namespace slipstream::kernels::test {
namespace {

SLIPSTREAM_DEFINE_CUDA_OPS(Ops, ::slipstream::kernels::cuda_emulated);
using Mem = EmulatedMemory;

TEST(EmulatedScan, ForwardMatchesCpuFp32) {
  uint64_t seed = 1;
  for (const auto& s : scan_shapes()) check_scan_forward<Ops, Mem, float>(s, seed++);
}
TEST(EmulatedScan, ForwardMatchesCpuBf16) {
  uint64_t seed = 11;
  for (const auto& s : scan_shapes()) check_scan_forward<Ops, Mem, bfloat16>(s, seed++);
}
TEST(EmulatedScan, BackwardMatchesCpuFp32) {
  uint64_t seed = 21;
  for (const auto& s : scan_shapes()) check_scan_backward<Ops, Mem, float>(s, seed++);
}
TEST(EmulatedScan, BackwardMatchesCpuBf16) {
  uint64_t seed = 31;
  for (const auto& s : scan_shapes()) check_scan_backward<Ops, Mem, bfloat16>(s, seed++);
}
TEST(EmulatedScan, StepEqualsParallelForm) {
  uint64_t seed = 41;
  for (const auto& s : scan_shapes()) check_scan_step<Ops, Mem, float>(s, seed++);
}
TEST(EmulatedScan, RejectsLargeState) {
  EXPECT_THROW(cuda_emulated::selective_scan_forward<float>(
                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, true,
                   nullptr, nullptr, 1, 1, 1, 33, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace slipstream::kernels::test
