// Runs our CUDA kernels on the CPU, for tests on machines without a GPU (CI has none).
//
// A kernel source (`kernels/*_cuda.cu`) compiled as C++ with SLIPSTREAM_CUDA_EMULATION defined
// includes this header instead of the CUDA runtime. Each block runs as one fiber per thread
// (a stack of its own, switched by _setjmp/_longjmp), all on the calling OS thread, blocks one
// after another; `__syncthreads`, `__syncwarp` and the warp shuffles switch fibers at the
// barrier, so the indexing, the barriers, the shared-memory traffic and the warp reductions of the
// real kernel are executed and can be compared with the CPU reference. A barrier that not every
// live thread reaches is reported as a deadlock. It is no race detector (fibers interleave only at
// barriers) and no timing model: compute-sanitizer on a real GPU covers those.
//
// Supported: 3-D grids and blocks, static `__shared__` arrays (one copy per kernel, valid since
// blocks run one at a time), __syncthreads, __syncwarp, __shfl_xor_sync / __shfl_sync on 32-bit
// and 64-bit values, __threadfence and atomicInc (a launch's blocks counting themselves done),
// the float math the kernels use, and __nv_bfloat16 conversions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include "kernels/bf16.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline const char* cudaGetErrorString(cudaError_t) {
  return "no error";
}
inline const char* cudaGetErrorName(cudaError_t) {
  return "cudaSuccess";
}

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace slipstream::cuda_emu {

const dim3& thread_idx();
const dim3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void sync_threads();
void sync_warp();
// Publishes `bits` for this lane, waits for the warp, returns lane `src_lane`'s value (the
// caller's own when src_lane is outside the warp), and waits again so slots can be reused.
uint64_t exchange(uint64_t bits, int src_lane);
int lane_id();
// Runs body once per thread of every block.
void launch(dim3 grid, dim3 block, const std::function<void()>& body);
// Kernel launches so far on this OS thread (tests check that a call launched what it should).
uint64_t launches();

template <class T>
T shuffle(T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffle of at most 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = exchange(bits, src_lane);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace slipstream::cuda_emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (::slipstream::cuda_emu::thread_idx())
#define blockIdx (::slipstream::cuda_emu::block_idx())
#define blockDim (::slipstream::cuda_emu::block_dim())
#define gridDim (::slipstream::cuda_emu::grid_dim())

inline void __syncthreads() {
  ::slipstream::cuda_emu::sync_threads();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::slipstream::cuda_emu::sync_warp();
}

template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const int lane = ::slipstream::cuda_emu::lane_id();
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;
  return ::slipstream::cuda_emu::shuffle(v, src);
}
template <class T>
T __shfl_sync(unsigned, T v, int src_lane, int width = 32) {
  const int lane = ::slipstream::cuda_emu::lane_id();
  return ::slipstream::cuda_emu::shuffle(v, (lane / width) * width + src_lane % width);
}

inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __fmul_rn(float a, float b) {  // a product nvcc may not fuse into an fma
  return a * b;
}
using std::isfinite;

inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcg(const T* p) {
  return *p;
}
// Blocks run one after another on one OS thread: the fence has nothing to order, and the
// atomic has no other writer.
inline void __threadfence() {}
inline unsigned atomicInc(unsigned* address, unsigned limit) {
  const unsigned old = *address;
  *address = old >= limit ? 0u : old + 1u;
  return old;
}

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  return slipstream::kernels::bf16_to_fp32(h.bits);
}
inline __nv_bfloat16 __float2bfloat16(float f) {
  return {slipstream::kernels::fp32_to_bf16(f)};
}
