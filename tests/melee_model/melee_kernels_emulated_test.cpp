// The Melee stages' CUDA kernels on the CPU emulator against model_math.h's references.
#include "stages/melee/melee_kernels.h"
#include "tests/melee_model/melee_kernel_checks.h"

namespace slipstream::melee::test {
namespace {

using K = cuda_emulated::Kernels;
using Mem = kernels::test::EmulatedMemory;

TEST(MeleeKernelsEmulated, EmbeddingMatchesCpu) {
  check_embedding<K, Mem>(3, 7, EmbedLayout{}, 1);
  check_embedding<K, Mem>(2, 5, EmbedLayout{5, 3, 2}, 2);  // odd widths, padding columns
}

TEST(MeleeKernelsEmulated, EmbeddingTableGradientsOverManyChunks) {
  check_embedding<K, Mem>(40, 30, EmbedLayout{4, 2, 2}, 3);  // 3600 items: several chunks
}

TEST(MeleeKernelsEmulated, BcLossMatchesCpu) {
  check_bc_loss<K, Mem>(3, 9, 0.0, 4);
  check_bc_loss<K, Mem>(4, 16, 0.1, 5);
  check_bc_loss<K, Mem>(13, 60, 0.05, 6);  // 780 positions: the column sums over 4 blocks
}

TEST(MeleeKernelsEmulated, AutoregressiveHeadsMatchCpu) {
  check_autoregressive_heads<K, Mem>(3, 9, 7);
}

TEST(MeleeKernelsEmulated, HeadsSplitAndJoinAreExactCopies) {
  check_heads_split_join<K, Mem>(37, 11);
}

// P 86: the direct path's width (the previous input's controller and its classes).
TEST(MeleeKernelsEmulated, HeadsOfFewRowsMatchCpu) {
  uint64_t seed = 21;
  for (const size_t M : {1, 2, 3, 5, 8})
    for (const bool bf16 : {false, true}) {
      check_heads_small_rows<K, Mem>(M, 128, 86, bf16, seed++);
      check_heads_small_rows<K, Mem>(M, 37, 0, bf16, seed++);
    }
}

TEST(MeleeKernelsEmulated, PolicyDrawsMatchCpu) {
  check_policy_choose<K, Mem>(1, 9, true);
  check_policy_choose<K, Mem>(37, 10, true);  // a partial last block
}

}  // namespace
}  // namespace slipstream::melee::test
