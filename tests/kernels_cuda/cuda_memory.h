// Device memory and a stream for the gpu-labelled tests (the *_checks.h memory interface of
// device_checks.h on a real GPU), and REQUIRE_DEVICE(), which skips a test without one. CUDA
// builds only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.h"

namespace slipstream::kernels::test {

inline void cuda_ok(cudaError_t e, const char* call) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(e));
}

// Device memory on its own (non-default) stream, freed with the object. Fills and uploads are
// enqueued on that stream: the legacy stream's cudaMemset and a pageable cudaMemcpy may still be
// running when they return, and a non-blocking stream does not wait for them.
class CudaMemory {
 public:
  CudaMemory() { cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream"); }
  ~CudaMemory() {
    cudaStreamSynchronize(stream_);
    if (lt_) cublasLtDestroy(lt_);
    for (void* p : ptrs_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  void* alloc_bytes(size_t bytes) {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, bytes + 1), "cudaMalloc");
    ptrs_.push_back(p);
    cuda_ok(cudaMemsetAsync(p, 0xff, bytes + 1, stream_), "cudaMemsetAsync");
    return p;
  }
  template <class T>
  T* alloc(size_t n) {
    return static_cast<T*>(alloc_bytes(n * sizeof(T)));
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    // From pageable memory the call returns once v is staged, so v may go out of scope after.
    cuda_ok(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream_),
            "upload");
    return p;
  }
  template <class T>
  std::vector<T> download(const T* p, size_t n) {
    sync();
    std::vector<T> v(n);
    cuda_ok(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  void sync() {
    cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after the kernels");
  }
  cudaStream_t stream() const { return stream_; }
  // A cuBLASLt handle and 32 MiB of workspace, made on first use.
  CudaKernels::GemmContext gemm_context() {
    if (!lt_) {
      if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasLtCreate");
      ctx_.lt_handle = lt_;
      ctx_.workspace_bytes = size_t{32} << 20;
      ctx_.workspace = alloc_bytes(ctx_.workspace_bytes);
    }
    return ctx_;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  CudaKernels::GemmContext ctx_;
  std::vector<void*> ptrs_;
};

#define REQUIRE_DEVICE()                                                                  \
  do {                                                                                    \
    int n_ = 0;                                                                           \
    const cudaError_t e_ = cudaGetDeviceCount(&n_);                                       \
    if (e_ != cudaSuccess || n_ == 0)                                                     \
      GTEST_SKIP() << "no CUDA device: "                                                  \
                   << (e_ != cudaSuccess ? cudaGetErrorString(e_) : "device count is 0"); \
  } while (0)

}  // namespace slipstream::kernels::test
