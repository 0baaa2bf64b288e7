// The CUDA kernels, compiled for the CPU emulator (kernels/emulation), against the CPU
// references. Runs in every build, GPU or not: indexing, barriers, shared memory and warp
// reductions of the real kernel sources are exercised here; the gpu tests repeat the same
// checks on a device.
#include <gtest/gtest.h>

#include "kernels/cuda_kernels.h"
#include "tests/kernels_cuda/adamw_checks.h"
#include "tests/kernels_cuda/conv_checks.h"
#include "tests/kernels_cuda/elementwise_checks.h"
#include "tests/kernels_cuda/gru_checks.h"
#include "tests/kernels_cuda/scan_checks.h"

namespace slipstream::kernels::test {
namespace {

using Kernels = EmulatedKernels;
struct Mem : EmulatedMemory {
  Kernels::GemmContext gemm_context() const { return {}; }
};

TEST(EmulatedScan, ForwardMatchesCpuFp32) {
  uint64_t seed = 1;
  for (const auto& s : scan_shapes()) check_scan_forward<Kernels, Mem, float>(s, seed++);
}
TEST(EmulatedScan, ForwardMatchesCpuBf16) {
  uint64_t seed = 11;
  for (const auto& s : scan_shapes()) check_scan_forward<Kernels, Mem, bfloat16>(s, seed++);
}
TEST(EmulatedScan, BackwardMatchesCpuFp32) {
  uint64_t seed = 21;
  for (const auto& s : scan_shapes()) check_scan_backward<Kernels, Mem, float>(s, seed++);
  // The default shape gives a thread 8 states: 8 + 4 pads the second thread of a channel.
  check_scan_backward<Kernels, Mem, float>({2, 21, 45, 12}, 90);
}
TEST(EmulatedScan, BackwardMatchesCpuBf16) {
  uint64_t seed = 31;
  for (const auto& s : scan_shapes()) check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
}
// The backward's other shape for d_state 9..32 (16 states a thread), which the benchmarks
// compare with the default.
TEST(EmulatedScan, BackwardRegistersVariantMatchesCpu) {
  const auto was = Kernels::scan_backward_variant();
  Kernels::set_scan_backward_variant(Kernels::ScanBackwardVariant::registers);
  uint64_t seed = 71;
  for (const auto& s : scan_shapes()) {
    check_scan_backward<Kernels, Mem, float>(s, seed++);
    check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
  check_scan_backward<Kernels, Mem, float>({2, 21, 45, 12}, 90);
  Kernels::set_scan_backward_variant(was);
}
TEST(EmulatedScan, StepEqualsParallelForm) {
  uint64_t seed = 41;
  for (const auto& s : scan_shapes()) check_scan_step<Kernels, Mem, float>(s, seed++);
}
TEST(EmulatedScan, RejectsLargeState) {
  EXPECT_THROW(Kernels::selective_scan_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                      nullptr, nullptr, nullptr, true, nullptr,
                                                      nullptr, 1, 1, 1, 33, nullptr),
               std::invalid_argument);
}

TEST(EmulatedConv, ForwardMatchesCpu) {
  uint64_t seed = 101;
  for (const auto& s : conv_shapes()) {
    check_conv_forward<Kernels, Mem, float>(s, seed++);
    check_conv_forward<Kernels, Mem, bfloat16>(s, seed++);
  }
}
TEST(EmulatedConv, BackwardMatchesCpu) {
  uint64_t seed = 111;
  for (const auto& s : conv_shapes()) {
    check_conv_backward<Kernels, Mem, float>(s, seed++);
    check_conv_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
}
TEST(EmulatedConv, StepEqualsForward) {
  uint64_t seed = 121;
  for (const auto& s : conv_shapes()) check_conv_step<Kernels, Mem, float>(s, seed++);
}

TEST(EmulatedElementwise, MatchesCpu) {
  uint64_t seed = 301;
  // 4357 rows: 18 partials a column, more than the 16 lanes that sum them.
  for (auto [M, N] : {std::pair<size_t, size_t>{1, 1}, {37, 40}, {300, 7}, {513, 130}, {4357, 33}})
    check_elementwise<Kernels, Mem>(M, N, seed++);
}
TEST(EmulatedElementwise, Bf16RoundingIsBitIdentical) {
  check_bf16_rounding<Kernels, Mem>(311);
}

// The emulated GEMM is the CPU reference itself; this checks the row-major contract the device
// ops are written against (the gpu test runs the same shapes through cuBLASLt).
TEST(EmulatedGemm, MatchesCpu) {
  uint64_t seed = 321;
  for (const auto& s : gemm_shapes()) {
    check_gemm<Kernels, Mem, float>(s, seed++);
    check_gemm<Kernels, Mem, bfloat16>(s, seed++);
  }
}

TEST(EmulatedAdamW, MatchesCpuOptimizer) {
  check_adamw<Kernels, Mem>({1000, 37, 4096, 5}, 0.0f, 4, -1, 401);
  check_adamw<Kernels, Mem>({300, 2000}, 1.0f, 5, 2, 402);  // clipped; step 2 skipped (NaN)
}

TEST(EmulatedGru, LayerMatchesCpu) {
  uint64_t seed = 501;
  for (const auto& s : gru_shapes()) check_gru<Kernels, Mem>(s, seed++);
  check_gru<Kernels, Mem>({4, 60, 128, 128}, 511);  // gpu_standard's width and window, fewer rows
}

TEST(EmulatedGru, Bf16FormMatchesCpu) {
  uint64_t seed = 521;
  for (const auto& s : gru_shapes()) check_gru_bf16<Kernels, Mem>(s, seed++);
  check_gru_bf16<Kernels, Mem>({4, 60, 128, 128}, 531);
}

}  // namespace
}  // namespace slipstream::kernels::test
