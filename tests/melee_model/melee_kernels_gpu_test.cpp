// The Melee stages' CUDA kernels on a GPU against model_math.h's references (label gpu:
// SKIPPED without a device or in a build without CUDA).
#include <gtest/gtest.h>

#if SLIPSTREAM_KERNELS_CUDA
#include "stages/melee/melee_kernels.h"
#include "tests/kernels_cuda/cuda_memory.h"
#include "tests/melee_model/melee_kernel_checks.h"

namespace slipstream::melee::test {
namespace {

using K = cuda::Kernels;
using Mem = kernels::test::CudaMemory;

TEST(MeleeKernelsGpu, EmbeddingMatchesCpu) {
  REQUIRE_DEVICE();
  check_embedding<K, Mem>(3, 7, EmbedLayout{}, 1);
  check_embedding<K, Mem>(256, 60, EmbedLayout{}, 2);  // gpu_standard's batch
}

TEST(MeleeKernelsGpu, BcLossMatchesCpu) {
  REQUIRE_DEVICE();
  check_bc_loss<K, Mem>(4, 16, 0.1, 5);
  check_bc_loss<K, Mem>(256, 60, 0.05, 6);
}

TEST(MeleeKernelsGpu, AutoregressiveHeadsMatchCpu) {
  REQUIRE_DEVICE();
  check_autoregressive_heads<K, Mem>(3, 9, 7);
  check_autoregressive_heads<K, Mem>(256, 60, 8);  // gpu_standard's batch
}

TEST(MeleeKernelsGpu, HeadsSplitAndJoinAreExactCopies) {
  REQUIRE_DEVICE();
  check_heads_split_join<K, Mem>(37, 11);
  check_heads_split_join<K, Mem>(256 * 60, 12);  // gpu_standard's batch
}

// P 86: the direct path's width (the previous input's controller and its classes).
TEST(MeleeKernelsGpu, HeadsOfFewRowsMatchCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 21;
  for (const size_t M : {1, 2, 3, 5, 8})
    for (const bool bf16 : {false, true}) {
      check_heads_small_rows<K, Mem>(M, 128, 86, bf16, seed++);
      check_heads_small_rows<K, Mem>(M, 37, 0, bf16, seed++);
    }
}

TEST(MeleeKernelsGpu, PolicyDrawsMatchCpu) {
  REQUIRE_DEVICE();
  check_policy_choose<K, Mem>(1, 9, false);
  check_policy_choose<K, Mem>(1024, 10, false);  // a self-play batch
}

}  // namespace
}  // namespace slipstream::melee::test
#else
TEST(MeleeKernelsGpu, NeedsCudaBuild) {
  GTEST_SKIP() << "this build has no CUDA";
}
#endif
