// The Mamba model on a CUDA device (DeviceOps over kernels::CudaKernels, cuBLASLt GEMMs) against
// the CPU model in float64, and its one-launch frame. Label gpu; SKIPPED without a device or in
// builds without CUDA.
#include <gtest/gtest.h>

#if SLIPSTREAM_KERNELS_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "engine/device.h"
#include "kernels/cuda_kernels.h"
#include "kernels/gemm.h"
#include "tests/nn/mamba_device_checks.h"
#include "tests/nn/mamba_frame_checks.h"

namespace slipstream::nn::test {
namespace {

using kernels::CudaKernels;

// A stream, a cuBLASLt handle and 32 MB of GEMM workspace on device 0, as a run's context holds
// them.
struct GpuContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  const Device dev = Device::cuda(0);
  Tensor ws;
  CudaKernels::GemmContext gemm{};
  GpuContext() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    ws = Tensor::empty({int64_t{32} << 20}, DType::u8, dev, "gemm workspace");
    gemm = {lt, ws.raw(), size_t(ws.numel())};
  }
  ~GpuContext() {
    cudaStreamSynchronize(stream);
    cublasLtDestroy(lt);
    cudaStreamDestroy(stream);
  }
};

TEST(MambaGpu, MatchesCpuModel) {
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  GpuContext g;
  uint64_t seed = 1;
  for (const auto& k : mamba_device_cases())
    check_mamba_on_device<CudaKernels>(k, g.dev, g.stream, g.gemm, seed++);
  // The gpu_standard shape, fp32 and bf16.
  check_mamba_on_device<CudaKernels>({128, 128, 16, 2, 32, 60, false}, g.dev, g.stream, g.gemm, 11);
  check_mamba_on_device<CudaKernels>({128, 128, 16, 2, 32, 60, true}, g.dev, g.stream, g.gemm, 12);
  // With the scan's forward keeping the chunk states its backward reads.
  const bool was = CudaKernels::scan_forward_keeps_states();
  CudaKernels::set_scan_forward_keeps_states(true);
  for (const auto& k : mamba_device_cases())
    check_mamba_on_device<CudaKernels>(k, g.dev, g.stream, g.gemm, seed++);
  check_mamba_on_device<CudaKernels>({128, 128, 16, 2, 32, 60, true}, g.dev, g.stream, g.gemm, 13);
  CudaKernels::set_scan_forward_keeps_states(was);
}

// The one-launch frame (kernels/mamba_frame.h): tests/nn/mamba_frame_checks.h against the CPU
// and the layers' frame (cuBLASLt GEMMs), and at gpu_standard's and production's model (din 264:
// the melee embedding's width), 1 and 64 games.
TEST(MambaFrameGpu, MatchesTheLayersAndTheCpu) {
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  GpuContext g;
  uint64_t seed = 31;
  for (const auto& k : mamba_frame_cases())
    check_mamba_frame<CudaKernels>(k, g.dev, g.stream, g.gemm, seed++);
  for (const bool bf16 : {false, true}) {
    check_mamba_frame<CudaKernels>({264, 128, 16, 2, 4, 1, bf16}, g.dev, g.stream, g.gemm, seed++);
    check_mamba_frame<CudaKernels>({264, 256, 32, 3, 4, 64, bf16}, g.dev, g.stream, g.gemm, seed++);
  }
}

}  // namespace
}  // namespace slipstream::nn::test

#else
TEST(MambaGpu, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (nvcc not found at configure)";
}
#endif
