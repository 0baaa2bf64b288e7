// The one-launch Mamba frame (kernels/mamba_frame.h) on a CUDA device: the checks of
// tests/nn/mamba_frame_checks.h, against the CPU and the layers' frame (cuBLASLt GEMMs), and at
// gpu_standard's and production's model. Label gpu; SKIPPED without a device or CUDA.
#include <gtest/gtest.h>

#if SLIPSTREAM_KERNELS_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "engine/device.h"
#include "kernels/cuda_kernels.h"
#include "tests/nn/mamba_frame_checks.h"

namespace slipstream::nn::test {
namespace {

using kernels::CudaKernels;

TEST(MambaFrameGpu, MatchesTheLayersAndTheCpu) {
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const Device dev = Device::cuda(0);
  Tensor ws = Tensor::empty({int64_t{32} << 20}, DType::u8, dev, "gemm workspace");
  const CudaKernels::GemmContext gemm{lt, ws.raw(), size_t(ws.numel())};
  uint64_t seed = 31;
  for (const auto& k : mamba_frame_cases())
    check_mamba_frame<CudaKernels>(k, dev, stream, gemm, seed++);
  // gpu_standard's model and production's (din 264: the melee embedding's width), 1 and 64 games.
  for (const bool bf16 : {false, true}) {
    check_mamba_frame<CudaKernels>({264, 128, 16, 2, 4, 1, bf16}, dev, stream, gemm, seed++);
    check_mamba_frame<CudaKernels>({264, 256, 32, 3, 4, 64, bf16}, dev, stream, gemm, seed++);
  }
  cudaStreamSynchronize(stream);
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace slipstream::nn::test

#else
TEST(MambaFrameGpu, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (nvcc not found at configure)";
}
#endif
