// The elementwise and copy operations between the model's kernels, on CUDA; math of the CPU
// references (kernels/elementwise_cpu.cpp, gemm_cpu.cpp's column_sum_accumulate, bf16.h's
// rounding), against which they are tested. Grid-stride loops: one launch covers any n.
#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.h"

#include <cstring>

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

constexpr int kThreads = kGridThreads;
constexpr int kSumCols = 32;          // columns per column-sum block (one warp wide)
constexpr int kSumRows = 8;           // row lanes per column-sum block
constexpr size_t kSumRowBlock = 256;  // rows per column-sum partial

template <class DT>
__global__ void add_inplace_kernel(DT* y, const DT* a, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride())
    y[i] = from_f32<DT>(to_f32(y[i]) + to_f32(a[i]));
}

template <class DT>
__global__ void copy_cols_kernel(const DT* src, size_t src_ld, DT* dst, size_t dst_ld, size_t rows,
                                 size_t cols) {
  const size_t n = rows * cols;
  for (size_t i = grid_start(); i < n; i += grid_stride()) {
    const size_t r = i / cols, c = i - r * cols;
    dst[r * dst_ld + c] = src[r * src_ld + c];
  }
}

__global__ void add_bias_rows_kernel(float* y, const float* b, size_t M, size_t N) {
  const size_t n = M * N;
  for (size_t i = grid_start(); i < n; i += grid_stride()) y[i] += b[i % N];
}

__global__ void neg_exp_kernel(const float* x, size_t x_ld, float* y, size_t cols, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride())
    y[i] = neg_expf_(x[i / cols * x_ld + i % cols]);
}

__global__ void mul_accumulate_kernel(float* y, const float* a, const float* b, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) y[i] += a[i] * b[i];
}

// Elements [0, n) of x into y, then [n, n + n2) of x2 into y2 (rows N2 long).
__global__ void scale_rows_kernel(const float* x, const float* s, float* y, size_t M, size_t N,
                                  size_t n, const float* x2, float* y2, size_t N2, size_t n2) {
  for (size_t i = grid_start(); i < n + n2; i += grid_stride()) {
    if (i < n) {
      y[i] = x[i] * s[i / N % M];
    } else {
      const size_t j = i - n;
      y2[j] = x2[j] * s[j / N2 % M];
    }
  }
}

__global__ void silu_forward_kernel(const float* x, float* y, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) y[i] = siluf_(x[i]);
}

__global__ void silu_backward_kernel(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) dx[i] = dy[i] * silu_gradf_(x[i]);
}

__global__ void fill_kernel(float* y, float value, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) y[i] = value;
}

__global__ void fp32_to_bf16_kernel(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) dst[i] = fp32_to_bf16_bits(src[i]);
}

__global__ void fp32_to_bf16_two_kernel(const float* a, uint16_t* a_bf, size_t n_a, const float* b,
                                        uint16_t* b_bf, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) {
    if (i < n_a)
      a_bf[i] = fp32_to_bf16_bits(a[i]);
    else
      b_bf[i - n_a] = fp32_to_bf16_bits(b[i - n_a]);
  }
}

__global__ void bf16_to_fp32_kernel(const __nv_bfloat16* src, float* dst, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) dst[i] = to_f32(src[i]);
}

__global__ void accumulate_bf16_kernel(float* y, const __nv_bfloat16* a, size_t n) {
  for (size_t i = grid_start(); i < n; i += grid_stride()) y[i] += to_f32(a[i]);
}

SLIPSTREAM_BLOCK_COUNTER(column_sum_blocks);

// Partial column sums of rows [blockIdx.y * kSumRowBlock, +kSumRowBlock): each of the kSumRows
// lanes of a column sums every kSumRows-th row, then lane 0 adds the lanes in order. The last
// block to finish adds the partials onto db (sum_partials_in_block's order).
__global__ void __launch_bounds__(kSumCols* kSumRows)
    column_sum_kernel(const float* dy, float* part, float* db, size_t M, size_t N) {
  __shared__ float lanes[kSumRows][kSumCols];
  const size_t j = size_t(blockIdx.x) * kSumCols + threadIdx.x;
  const size_t r0 = size_t(blockIdx.y) * kSumRowBlock;
  const size_t r1 = M < r0 + kSumRowBlock ? M : r0 + kSumRowBlock;
  float acc = 0.f;
  if (j < N)
    for (size_t i = r0 + threadIdx.y; i < r1; i += kSumRows) acc += dy[i * N + j];
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < N) {
    float s = 0.f;
    for (int k = 0; k < kSumRows; ++k) s += lanes[k][threadIdx.x];
    part[size_t(blockIdx.y) * N + j] = s;
  }
  if (last_block(&column_sum_blocks))
    sum_partials_in_block(part, int(gridDim.y), N, db, true, &lanes[0][0]);
}

}  // namespace

template <class T>
void Kernels::add_inplace(T* y, const T* a, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const auto kernel = &add_inplace_kernel<dev_t<T>>;
  SLIPSTREAM_LAUNCH_AS("add_inplace_kernel", kernel, grid_for(n), dim3(kThreads), stream, dev(y),
                       dev(a), n);
  check_launch("add_inplace");
}

template <class T>
void Kernels::copy_cols(const T* src, size_t src_ld, T* dst, size_t dst_ld, size_t rows,
                        size_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  const auto kernel = &copy_cols_kernel<dev_t<T>>;
  SLIPSTREAM_LAUNCH_AS("copy_cols_kernel", kernel, grid_for(rows * cols), dim3(kThreads), stream,
                       dev(src), src_ld, dev(dst), dst_ld, rows, cols);
  check_launch("copy_cols");
}

void Kernels::add_bias_rows(float* y, const float* b, size_t M, size_t N, cudaStream_t stream) {
  if (M * N == 0) return;
  SLIPSTREAM_LAUNCH(add_bias_rows_kernel, grid_for(M * N), dim3(kThreads), stream, y, b, M, N);
  check_launch("add_bias_rows");
}

void Kernels::neg_exp(const float* x, size_t x_ld, float* y, size_t rows, size_t cols,
                      cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("neg_exp", neg_exp_kernel, rows * cols, stream, x, x_ld, y, cols,
                                rows * cols);
}

void Kernels::mul_accumulate(float* y, const float* a, const float* b, size_t n,
                             cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("mul_accumulate", mul_accumulate_kernel, n, stream, y, a, b, n);
}

void Kernels::scale_rows(const float* x, const float* s, float* y, size_t G, size_t M, size_t N,
                         const float* x2, float* y2, size_t N2, cudaStream_t stream) {
  const size_t n = G * M * N, n2 = x2 ? G * M * N2 : 0;
  if (n + n2 == 0) return;
  SLIPSTREAM_LAUNCH(scale_rows_kernel, grid_for(n + n2), dim3(kThreads), stream, x, s, y, M, N, n,
                    x2, y2, N2, n2);
  check_launch("scale_rows");
}

void Kernels::silu_forward(const float* x, float* y, size_t n, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("silu_forward", silu_forward_kernel, n, stream, x, y, n);
}

void Kernels::silu_backward(const float* x, const float* dy, float* dx, size_t n,
                            cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("silu_backward", silu_backward_kernel, n, stream, x, dy, dx, n);
}

void Kernels::fill(float* y, float value, size_t n, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("fill", fill_kernel, n, stream, y, value, n);
}

void Kernels::fp32_to_bf16(const float* src, bfloat16* dst, size_t n, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("fp32_to_bf16", fp32_to_bf16_kernel, n, stream, src,
                                reinterpret_cast<uint16_t*>(dst), n);
}

void Kernels::fp32_to_bf16_two(const float* a, bfloat16* a_bf, size_t n_a, const float* b,
                               bfloat16* b_bf, size_t n_b, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("fp32_to_bf16_two", fp32_to_bf16_two_kernel, n_a + n_b, stream, a,
                                reinterpret_cast<uint16_t*>(a_bf), n_a, b,
                                reinterpret_cast<uint16_t*>(b_bf), n_a + n_b);
}

void Kernels::bf16_to_fp32(const bfloat16* src, float* dst, size_t n, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("bf16_to_fp32", bf16_to_fp32_kernel, n, stream, dev(src), dst, n);
}

void Kernels::accumulate_bf16(float* y, const bfloat16* a, size_t n, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("accumulate_bf16", accumulate_bf16_kernel, n, stream, y, dev(a), n);
}

void Kernels::copy_bytes(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  capture::enqueue(
      "copy_bytes", stream, [&] { return capture::key_of(dst, src, bytes); },
      [=] {
#if defined(SLIPSTREAM_CUDA_EMULATION)
        std::memcpy(dst, src, bytes);
#else
        const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess)
          throw std::runtime_error(std::string("copy_bytes: cudaMemcpyAsync failed: ") +
                                   cudaGetErrorString(e));
#endif
      });
}

size_t Kernels::column_sum_accumulate_workspace_bytes(size_t M, size_t N) {
  return ((M + kSumRowBlock - 1) / kSumRowBlock) * N * sizeof(float);
}

void Kernels::column_sum_accumulate(const float* dy, float* db, size_t M, size_t N, void* workspace,
                                    cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  const unsigned row_blocks = ceil_div(M, kSumRowBlock);
  float* part = static_cast<float*>(workspace);
  SLIPSTREAM_LAUNCH(column_sum_kernel, dim3(ceil_div(N, kSumCols), row_blocks),
                    dim3(kSumCols, kSumRows), stream, dy, part, db, M, N);
  check_launch("column_sum_accumulate");
}

template void Kernels::add_inplace<float>(float*, const float*, size_t, cudaStream_t);
template void Kernels::add_inplace<bfloat16>(bfloat16*, const bfloat16*, size_t, cudaStream_t);
template void Kernels::copy_cols<float>(const float*, size_t, float*, size_t, size_t, size_t,
                                        cudaStream_t);
template void Kernels::copy_cols<bfloat16>(const bfloat16*, size_t, bfloat16*, size_t, size_t,
                                           size_t, cudaStream_t);

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
