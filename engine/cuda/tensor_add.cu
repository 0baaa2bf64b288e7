// out = a + b on the device (engine/tensor.h's add_f32): the one element-wise op the engine
// itself needs (two consumers' gradients of one tensor), so it does not depend on kernels/.
#include <cuda_runtime.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "kernels/step_recorder.h"

namespace slipstream::cuda_rt {

namespace {
__global__ void add_f32_kernel(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}
}  // namespace

void add_f32(int index, void* stream, const float* a, const float* b, float* out, size_t n) {
  if (n == 0) return;
  DeviceGuard guard(index);
  constexpr unsigned kThreads = 256;
  const size_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = unsigned(blocks < 4096 ? blocks : 4096);
  capture::enqueue(
      "add_f32_kernel", stream, [&] { return capture::key_of(index, grid, a, b, out, n); },
      [=] {
        DeviceGuard guard(index);
        add_f32_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, b, out, n);
        check(cudaGetLastError(), "add_f32 kernel launch", "cuda:" + std::to_string(index));
      });
}

}  // namespace slipstream::cuda_rt
