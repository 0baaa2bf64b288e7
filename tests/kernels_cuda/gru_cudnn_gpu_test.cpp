// cuDNN's GRU stack (kernels/gru_cudnn.h) on a real device against the CPU layer: fp32, and the
// bf16 form where the cuDNN has one. Label `gpu`: every test reports SKIPPED when the build has
// no CUDA or the machine has no device. (Our own kernels' tests are in tests/kernel_ops/.)
#include <gtest/gtest.h>

#include <iostream>

#if SLIPSTREAM_KERNELS_CUDA
#include "kernels/gru_cudnn.h"
#include "tests/kernels_cuda/cuda_memory.h"
#include "tests/kernels_cuda/gru_cudnn_checks.h"

namespace slipstream::kernels::test {
namespace {

using Mem = CudaMemory;

TEST(GpuGru, CudnnStackMatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 521;
  for (const GruStackShape& s : std::vector<GruStackShape>{
           {1, 1, 3, 2, 1}, {3, 5, 7, 4, 1}, {2, 13, 6, 9, 2}, {5, 4, 4, 70, 3}})
    check_cudnn_gru<Mem>(s, seed++);
  check_cudnn_gru<Mem>({64, 60, 128, 128, 2}, 531);  // gpu_standard-sized layers
}

// Which cuDNN has a bf16 RNN, and what the stage's note says of one that has none (no device
// needed).
TEST(GpuGru, CudnnBf16NeedsCuDnn913) {
  EXPECT_EQ(cuda::CudnnGru::bf16_unsupported(91300), "");
  EXPECT_EQ(cuda::CudnnGru::bf16_unsupported(91900), "");
  EXPECT_EQ(cuda::CudnnGru::bf16_unsupported(91002),
            "cuDNN 9.10.2 has no bf16 RNN (cuDNN 9.13 and later have)");
}

// cuDNN's bf16 RNN: bf16 states, so within bf16's tolerance of the reference given the same
// rounded weights and inputs. A cuDNN older than 9.13 has none: then the stack must refuse the
// bf16 form with that reason (the stage's note), and the test says the form was not run.
TEST(GpuGru, CudnnStackBf16IsCloseToCpu) {
  REQUIRE_DEVICE();
  const std::string why = cuda::CudnnGru::bf16_unsupported();
  if (!why.empty()) {
    std::cout << "note: " << why << ": the bf16 form was not run; its refusal is checked\n";
    try {
      Mem mem;
      cuda::CudnnGru gru(mem.stream(), 4, 4, {{0, 48, 96, 108}}, true);
      FAIL() << "the bf16 form was built on a cuDNN without a bf16 RNN";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    return;
  }
  uint64_t seed = 541;
  for (const GruStackShape& s : std::vector<GruStackShape>{
           {1, 1, 3, 2, 1}, {3, 5, 7, 4, 1}, {2, 13, 6, 9, 2}, {5, 4, 4, 70, 3}})
    check_cudnn_gru<Mem>(s, seed++, true);
  check_cudnn_gru<Mem>({64, 60, 128, 128, 2}, 551, true);
}

}  // namespace
}  // namespace slipstream::kernels::test

#else

TEST(GpuKernels, NeedCuda) {
  GTEST_SKIP() << "built without CUDA (nvcc not found at configure)";
}

#endif
