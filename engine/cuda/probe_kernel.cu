// `slipstream doctor`'s last link: can this binary launch a kernel on the device and read back
// what it wrote? Catches "no kernel image for this architecture" and broken driver installs that
// survive cudaGetDeviceCount.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "engine/cuda/cuda_backend.h"

namespace slipstream::cuda_rt {

namespace {
__global__ void probe_write(int* out, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = base + i;
}

std::string err_text(const char* call, cudaError_t e) {
  cudaGetLastError();
  return std::string(call) + " failed: " + cudaGetErrorString(e) + " [" + cudaGetErrorName(e) + "]";
}
}  // namespace

std::string run_probe_kernel(int index) {
  constexpr int kBlocks = 4, kThreads = 64, kN = kBlocks * kThreads, kBase = 0x5117;
  int prev = 0;
  cudaError_t e = cudaGetDevice(&prev);
  if (e != cudaSuccess) return err_text("cudaGetDevice", e);
  if ((e = cudaSetDevice(index)) != cudaSuccess) return err_text("cudaSetDevice", e);
  int* d = nullptr;
  std::string problem;
  std::vector<int> host(kN, 0);
  if ((e = cudaMalloc(&d, kN * sizeof(int))) != cudaSuccess) {
    problem = err_text("cudaMalloc", e);
  } else {
    probe_write<<<kBlocks, kThreads>>>(d, kBase);
    if ((e = cudaGetLastError()) != cudaSuccess)
      problem = err_text("kernel launch", e);
    else if ((e = cudaMemcpy(host.data(), d, kN * sizeof(int), cudaMemcpyDeviceToHost)) !=
             cudaSuccess)
      problem = err_text("cudaMemcpy after the kernel", e);
    else
      for (int i = 0; i < kN && problem.empty(); ++i)
        if (host[i] != kBase + i)
          problem = "kernel ran but wrote " + std::to_string(host[i]) + " at " + std::to_string(i) +
                    ", expected " + std::to_string(kBase + i);
    cudaFree(d);
  }
  cudaSetDevice(prev);
  return problem;
}

}  // namespace slipstream::cuda_rt
