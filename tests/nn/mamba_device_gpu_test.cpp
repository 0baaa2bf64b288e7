// The Mamba model on a CUDA device (DeviceOps over kernels::CudaKernels, cuBLASLt GEMMs) against
// the CPU model in float64. Label gpu; SKIPPED without a device or in builds without CUDA.
#include <gtest/gtest.h>

#if SLIPSTREAM_KERNELS_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "engine/device.h"
#include "kernels/cuda_kernels.h"
#include "kernels/gemm.h"
#include "tests/nn/mamba_device_checks.h"

namespace slipstream::nn::test {
namespace {

using kernels::CudaKernels;

TEST(MambaGpu, MatchesCpuModel) {
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cublasLtHandle_t lt = nullptr;
  ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
  const Device dev = Device::cuda(0);
  Tensor ws = Tensor::empty({int64_t{32} << 20}, DType::u8, dev, "gemm workspace");
  const CudaKernels::GemmContext gemm{lt, ws.raw(), size_t(ws.numel())};
  uint64_t seed = 1;
  for (const auto& k : mamba_device_cases())
    check_mamba_on_device<CudaKernels>(k, dev, stream, gemm, seed++);
  // The gpu_standard shape, fp32 and bf16.
  check_mamba_on_device<CudaKernels>({128, 128, 16, 2, 32, 60, false}, dev, stream, gemm, 11);
  check_mamba_on_device<CudaKernels>({128, 128, 16, 2, 32, 60, true}, dev, stream, gemm, 12);
  // With the scan's forward keeping the chunk states its backward reads.
  const bool was = CudaKernels::scan_forward_keeps_states();
  CudaKernels::set_scan_forward_keeps_states(true);
  for (const auto& k : mamba_device_cases())
    check_mamba_on_device<CudaKernels>(k, dev, stream, gemm, seed++);
  check_mamba_on_device<CudaKernels>({128, 128, 16, 2, 32, 60, true}, dev, stream, gemm, 13);
  CudaKernels::set_scan_forward_keeps_states(was);
  cudaStreamSynchronize(stream);
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace slipstream::nn::test

#else
TEST(MambaGpu, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (nvcc not found at configure)";
}
#endif
