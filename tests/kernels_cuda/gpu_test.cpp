// The CUDA kernels on a real device against the CPU references: the checks the emulated tests
// run, plus what only hardware shows (bit-identical reruns, the gpu_standard shape). Label
// `gpu`: every test reports SKIPPED when the build has no CUDA or the machine has no device.
#include <gtest/gtest.h>

#include <iostream>

#if SLIPSTREAM_KERNELS_CUDA
#include "kernels/causal_conv1d.h"
#include "kernels/cuda_kernels.h"
#include "kernels/gru_cudnn.h"
#include "kernels/rmsnorm.h"
#include "kernels/selective_scan.h"
#include "tests/kernels_cuda/adamw_checks.h"
#include "tests/kernels_cuda/conv_checks.h"
#include "tests/kernels_cuda/cuda_memory.h"
#include "tests/kernels_cuda/elementwise_checks.h"
#include "tests/kernels_cuda/gru_checks.h"
#include "tests/kernels_cuda/gru_cudnn_checks.h"
#include "tests/kernels_cuda/scan_checks.h"

namespace slipstream::kernels::test {
namespace {

using Kernels = CudaKernels;
using Mem = CudaMemory;

TEST(GpuScan, ForwardMatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 1;
  for (const auto& s : scan_shapes()) {
    check_scan_forward<Kernels, Mem, float>(s, seed++);
    check_scan_forward<Kernels, Mem, bfloat16>(s, seed++);
  }
}
TEST(GpuScan, BackwardMatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 21;
  for (const auto& s : scan_shapes()) {
    check_scan_backward<Kernels, Mem, float>(s, seed++);
    check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
  // The default shape gives a thread 8 states: 8 + 4 pads the second thread of a channel.
  check_scan_backward<Kernels, Mem, float>({2, 21, 45, 12}, 90);
  check_scan_backward<Kernels, Mem, float>({256, 60, 256, 16}, 91);
}
// The backward's other shape for d_state 9..32 (16 states a thread), which the benchmarks
// compare with the default.
TEST(GpuScan, BackwardRegistersVariantMatchesCpu) {
  REQUIRE_DEVICE();
  const auto was = Kernels::scan_backward_variant();
  Kernels::set_scan_backward_variant(Kernels::ScanBackwardVariant::registers);
  uint64_t seed = 71;
  for (const auto& s : scan_shapes()) {
    check_scan_backward<Kernels, Mem, float>(s, seed++);
    check_scan_backward<Kernels, Mem, bfloat16>(s, seed++);
  }
  check_scan_backward<Kernels, Mem, float>({256, 60, 256, 16}, 92);
  Kernels::set_scan_backward_variant(was);
}
TEST(GpuScan, StepEqualsParallelForm) {
  REQUIRE_DEVICE();
  uint64_t seed = 41;
  for (const auto& s : scan_shapes()) check_scan_step<Kernels, Mem, float>(s, seed++);
}
TEST(GpuScan, GpuStandardShape) {
  REQUIRE_DEVICE();
  check_scan_forward<Kernels, Mem, float>({256, 60, 256, 16}, 51);
  check_scan_backward<Kernels, Mem, float>({256, 60, 256, 16}, 52);
}
// Same inputs twice: bit-identical gradients (no atomics anywhere in the backward).
TEST(GpuScan, BackwardIsDeterministic) {
  REQUIRE_DEVICE();
  const ScanShape s{8, 60, 256, 16};
  const ScanData<float> d(s, 61);
  const size_t bld = size_t(s.B) * s.L * s.D, bln = size_t(s.B) * s.L * s.N;
  Mem mem;
  auto run = [&] {
    std::vector<float> dA_init(size_t(s.D) * s.N, 0.0f);
    float* dA = mem.upload(dA_init);
    float* dD = mem.upload(std::vector<float>(size_t(s.D), 0.0f));
    float* db = mem.upload(std::vector<float>(size_t(s.D), 0.0f));
    float *du = mem.alloc<float>(bld), *ddelta = mem.alloc<float>(bld), *dz = mem.alloc<float>(bld);
    float *dB = mem.alloc<float>(bln), *dC = mem.alloc<float>(bln);
    void* ws =
        mem.alloc_bytes(Kernels::selective_scan_backward_workspace_bytes(s.B, s.L, s.D, s.N));
    Kernels::selective_scan_backward<float>(
        up<Mem, float>(mem, d.u), up<Mem, float>(mem, d.delta), up<Mem, float>(mem, d.A),
        up<Mem, float>(mem, d.Bm), up<Mem, float>(mem, d.Cm), up<Mem, float>(mem, d.Dskip),
        up<Mem, float>(mem, d.z), up<Mem, float>(mem, d.bias), true, up<Mem, float>(mem, d.dout),
        du, ddelta, dA, dB, dC, dD, dz, db, ws, s.B, s.L, s.D, s.N, mem.stream());
    std::vector<float> all = mem.download(du, bld);
    for (auto [p, n] : {std::pair<float*, size_t>{ddelta, bld},
                        {dz, bld},
                        {dB, bln},
                        {dC, bln},
                        {dA, size_t(s.D) * s.N},
                        {dD, size_t(s.D)},
                        {db, size_t(s.D)}}) {
      const auto v = mem.download(p, n);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(GpuConv, ForwardBackwardStepMatchCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 101;
  for (const auto& s : conv_shapes()) {
    check_conv_forward<Kernels, Mem, float>(s, seed++);
    check_conv_forward<Kernels, Mem, bfloat16>(s, seed++);
    check_conv_backward<Kernels, Mem, float>(s, seed++);
    check_conv_backward<Kernels, Mem, bfloat16>(s, seed++);
    check_conv_step<Kernels, Mem, float>(s, seed++);
  }
  check_conv_backward<Kernels, Mem, float>({256, 60, 256, 4}, seed++);
}

TEST(GpuElementwise, MatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 301;
  for (auto [M, N] : {std::pair<size_t, size_t>{1, 1}, {37, 40}, {300, 7}, {256 * 60, 256}})
    check_elementwise<Kernels, Mem>(M, N, seed++);
  check_bf16_rounding<Kernels, Mem>(311);
}

TEST(GpuGemm, CublasLtMatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 321;
  auto shapes = gemm_shapes();
  shapes.push_back({false, true, 256 * 60, 512, 128, 0.0, 0});  // gpu_standard in_proj
  shapes.push_back({true, false, 512, 128, 256 * 60, 1.0, 0});  // its weight gradient
  for (const auto& s : shapes) {
    check_gemm<Kernels, Mem, float>(s, seed++);
    check_gemm<Kernels, Mem, bfloat16>(s, seed++);
  }
}

TEST(GpuAdamW, MatchesCpuOptimizer) {
  REQUIRE_DEVICE();
  check_adamw<Kernels, Mem>({1000, 37, 4096, 5}, 0.0f, 4, -1, 401);
  check_adamw<Kernels, Mem>({300, 2000}, 1.0f, 5, 2, 402);
  check_adamw<Kernels, Mem>({65536 * 8, 128, 256 * 16}, 1.0f, 3, -1, 403);  // gpu_standard-sized
}

TEST(GpuScan, BadStateSizeNamesTheOp) {
  REQUIRE_DEVICE();
  try {
    Kernels::selective_scan_forward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                           nullptr, nullptr, true, nullptr, nullptr, 1, 1, 1, 64,
                                           nullptr);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("selective_scan_forward"), std::string::npos);
  }
}

TEST(GpuGru, LayerMatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 501;
  for (const auto& s : gru_shapes()) check_gru<Kernels, Mem>(s, seed++);
  check_gru<Kernels, Mem>({64, 60, 128, 128}, 511);  // a gpu_standard-sized layer
}

TEST(GpuGru, Bf16FormMatchesCpu) {
  REQUIRE_DEVICE();
  uint64_t seed = 521;
  for (const auto& s : gru_shapes()) check_gru_bf16<Kernels, Mem>(s, seed++);
  check_gru_bf16<Kernels, Mem>({64, 60, 128, 128}, 531);
}

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
