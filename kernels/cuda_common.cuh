// Shared by every kernels/*_cuda.cu: CUDA (or, for the emulated tests, the CPU emulator),
// element conversion, warp reductions, the launch macro and its error check, and the
// deterministic reduction of per-block partial sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda_api.h"
#include "kernels/cuda_kernels.h"

#include "kernels/step_recorder.h"

// SLIPSTREAM_LAUNCH(kernel, grid, block, stream, args...) enqueues kernel(args...) on `stream`
// through the step recorder (kernels/step_recorder.h): launched at once, or kept with its
// arguments (copied) while the step is recorded for a CUDA graph. The key is the kernel, the
// launch shape and the arguments' bytes — padding included, so a struct passed by value is
// built zero-filled (zero_filled<T>(), then its fields): garbage in its padding would make every
// step's key differ, and the step would never replay.
// SLIPSTREAM_LAUNCH_AS(name, kernel, ...) is the same for a kernel held in a variable: `name`
// (the kernel's, not the variable's) is what a failure and the step's operation list show.
#define SLIPSTREAM_LAUNCH_KEY(kernel, grid, block, ...)                                           \
  [&] {                                                                                           \
    return ::slipstream::capture::key_of(::slipstream::capture::function_key(kernel), dim3(grid), \
                                         dim3(block), __VA_ARGS__);                               \
  }
#if defined(SLIPSTREAM_CUDA_EMULATION)
#include "kernels/emulation/cuda_emulator.h"
#define SLIPSTREAM_KERNEL_NS cuda_emulated
// kernel(args...) for every thread of the grid, on the CPU.
#define SLIPSTREAM_LAUNCH_AS(name, kernel, grid, block, stream, ...)           \
  ::slipstream::capture::enqueue(                                              \
      name, (stream), SLIPSTREAM_LAUNCH_KEY(kernel, grid, block, __VA_ARGS__), \
      [=] { ::slipstream::cuda_emu::launch(grid, block, [&] { kernel(__VA_ARGS__); }); })
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define SLIPSTREAM_KERNEL_NS cuda
#define SLIPSTREAM_LAUNCH_AS(name, kernel, grid, block, stream, ...)                            \
  ::slipstream::capture::enqueue(name, (stream),                                                \
                                 SLIPSTREAM_LAUNCH_KEY(kernel, grid, block, __VA_ARGS__), [=] { \
                                   kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__);       \
                                   ::slipstream::kernels::cuda::check_launch(name);             \
                                 })
#endif
#define SLIPSTREAM_LAUNCH(kernel, grid, block, stream, ...) \
  SLIPSTREAM_LAUNCH_AS(#kernel, kernel, grid, block, stream, __VA_ARGS__)

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

// The device element type of an entry point's T.
template <class T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<bfloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using dev_t = typename DeviceType<T>::type;

template <class T>
dev_t<T>* dev(T* p) {
  return reinterpret_cast<dev_t<T>*>(p);
}
template <class T>
const dev_t<T>* dev(const T* p) {
  return reinterpret_cast<const dev_t<T>*>(p);
}

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// Sum over aligned groups of kWidth lanes (a power of two <= 32); every lane of a group gets
// the group's sum. The order of additions is fixed, so results are deterministic.
template <int kWidth>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = kWidth / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// acc[m] += sum_k A[m, k] b[k] for the rows m < M <= kRows of A (rows lda apart): a warp's
// lanes stride over K (coalesced reads of b, a weight's row, and of A's rows), each keeping its
// partial sums; the caller adds the lanes (group_sum<32>, a fixed order). The small-row products'
// loop (gemm_small_rows, the Melee heads' few-row forward).
template <class DT, int kRows>
__device__ __forceinline__ void lanes_dot_rows(int M, const DT* A, size_t lda, const DT* b, int K,
                                               float (&acc)[kRows]) {
#pragma unroll 4  // four strides' loads in flight (K = 128 is four)
  for (int k = int(threadIdx.x) & 31; k < K; k += 32) {
    const float bk = to_f32(b[k]);
#pragma unroll
    for (int m = 0; m < kRows; ++m)
      if (m < M) acc[m] = fmaf(to_f32(A[size_t(m) * lda + size_t(k)]), bk, acc[m]);
  }
}

// `p ? a : b` as a select instruction. Where a and b are values computed for the choice, the
// compiler may compute them on two branches instead; with p differing between the lanes of a
// warp that splits the warp, and a shuffle after it then runs in its slow collective form on
// each half. PTX's selp is opaque to that rewrite.
__device__ __forceinline__ float lane_select(bool p, float a, float b) {
#if defined(SLIPSTREAM_CUDA_EMULATION)
  return p ? a : b;
#else
  float r;
  asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %3, 0;\n\tselp.f32 %0, %1, %2, q;\n\t}"
      : "=f"(r)
      : "f"(a), "f"(b), "r"(unsigned(p)));
  return r;
#endif
}

// Four floats to p (16-byte aligned) in one 128-bit shared or global store: a quarter-warp's
// stores take one pass over the banks where 32-bit ones take four (under the emulator, four
// scalar stores).
__device__ __forceinline__ void store_float4(float* p, float a, float b, float c, float d) {
#if defined(SLIPSTREAM_CUDA_EMULATION)
  p[0] = a, p[1] = b, p[2] = c, p[3] = d;
#else
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
#endif
}

// Four floats from p (16-byte aligned) in one 128-bit load (under the emulator, four scalar
// loads).
__device__ __forceinline__ void load_float4(const float* p, float* v) {
#if defined(SLIPSTREAM_CUDA_EMULATION)
  v[0] = p[0], v[1] = p[1], v[2] = p[2], v[3] = p[3];
#else
  const float4 x = *reinterpret_cast<const float4*>(p);
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
#endif
}

// a / b in 32-bit arithmetic where both fit (a 64-bit division is a software routine of
// several dozen instructions on the GPU, a 32-bit one about twenty), else in 64 bits: the same
// quotient either way.
__device__ __forceinline__ size_t quotient(size_t a, size_t b) {
  if ((a | b) >> 32 == 0) return size_t(uint32_t(a) / uint32_t(b));
  return a / b;
}

// 2^x as the SFU's ex2.approx.ftz gives it: exp2f's own bits wherever 2^x is a normal float
// (exp2f wraps the same MUFU.EX2 in a compare and two predicated multiplies, sm_90 SASS, to make
// denormal results), 0 below 2^-126 instead of a denormal. The scan's decays exp(dt A) take it:
// three instructions of every state-step's exp, a decay under 1e-38 being no decay at all.
__device__ __forceinline__ float exp2_ftz(float x) {
#if defined(SLIPSTREAM_CUDA_EMULATION)
  const float r = exp2f(x);
  return r < 1.17549435e-38f ? 0.0f : r;  // FLT_MIN: the flush
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#endif
}

// Numerics shared with the CPU reference (kernels/activations.h): PyTorch's softplus
// threshold 20, silu = x sigmoid(x).
__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float softplusf_(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}
__device__ __forceinline__ float softplus_gradf_(float x) {
  return x > 20.0f ? 1.0f : sigmoidf_(x);
}
__device__ __forceinline__ float siluf_(float x) {
  return x * sigmoidf_(x);
}
// Mamba's A = −exp(A_log): one expression wherever it is made (the elementwise op, the scan's
// lanes, the sum that applies its chain rule), so the same bits.
__device__ __forceinline__ float neg_expf_(float x) {
  return -expf(x);
}
__device__ __forceinline__ float silu_gradf_(float x) {
  const float s = sigmoidf_(x);
  return s * (1.0f + x * (1.0f - s));
}

// kernels/bf16.h's fp32_to_bf16, bit for bit (nearest-even, NaN quietened, denormals to
// zero), so device and CPU round the same operands the same way.
__device__ __forceinline__ uint16_t fp32_to_bf16_bits(float f) {
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  if ((u & 0x7f800000u) == 0) return uint16_t((u >> 16) & 0x8000u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline unsigned ceil_div(size_t a, size_t b) {
  return unsigned((a + b - 1) / b);
}

// Grid-stride loops for elementwise kernels: kGridThreads threads a block, grid_for(n) blocks
// (at most kGridMaxBlocks), each thread from grid_start() in steps of grid_stride(); one launch
// covers any n.
constexpr int kGridThreads = 256;
constexpr size_t kGridMaxBlocks = 4096;
inline dim3 grid_for(size_t n) {
  const size_t blocks = (n + kGridThreads - 1) / kGridThreads;
  return dim3(unsigned(blocks < kGridMaxBlocks ? (blocks ? blocks : 1) : kGridMaxBlocks));
}
__device__ __forceinline__ size_t grid_start() {
  return size_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t grid_stride() {
  return size_t(gridDim.x) * blockDim.x;
}

// The launch of an elementwise entry point: one grid-stride launch of `kernel(args...)` over n
// elements (none for n = 0), a failure named by `op`. A macro because SLIPSTREAM_LAUNCH is.
#define SLIPSTREAM_LAUNCH_ELEMENTWISE(op, kernel, n, stream, ...)                      \
  do {                                                                                 \
    if ((n) > 0) {                                                                     \
      SLIPSTREAM_LAUNCH(kernel, grid_for(n), dim3(kGridThreads), stream, __VA_ARGS__); \
      check_launch(op);                                                                \
    }                                                                                  \
  } while (0)

// A struct for a kernel's arguments with every byte zero, padding included, its fields to be set
// after: SLIPSTREAM_LAUNCH's key hashes the bytes it is passed.
template <class T>
T zero_filled() {
  static_assert(std::is_trivially_copyable_v<T>, "kernel arguments are plain values");
  T t;
  std::memset(static_cast<void*>(&t), 0, sizeof t);
  return t;
}

// Throws when the last launch failed, naming the op (the kernel ran asynchronously: errors
// inside it surface at the stream's next synchronisation).
inline void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(op) + ": kernel launch failed: " + cudaGetErrorString(e) +
                             " [" + cudaGetErrorName(e) + "]");
}

// A kernel's two forms chosen by an environment variable (for a whole-step A/B of one build):
// false where `var` is unset, empty or `off`, true where it is `on`; another value throws,
// naming `what` and both forms. Callers keep the answer in a function-local static, so a throw
// leaves it unset and the next call asks again.
inline bool second_form_from_environment(const char* var, const char* off, const char* on,
                                         const char* what) {
  const char* e = std::getenv(var);
  if (!e || !*e || std::string(e) == off) return false;
  if (std::string(e) == on) return true;
  throw std::invalid_argument(std::string(var) + "=" + e + " names no form of " + what + " (" +
                              off + ", " + on + ")");
}

// out[i] = (accumulate ? out[i] : 0) + sum_{k < K} part[k * n + i], as a fixed-shape tree: a
// block of kPartialThreads is `lanes` rows of kPartialThreads / lanes columns; lane l of a column
// sums partials l, l + lanes, ... in order, then lane 0 adds the lanes in order. `lanes` follows
// from K alone (the largest power of two <= K, at most kPartialMaxLanes), so the result is the
// same on every run and every GPU; the serial chain per thread is K / lanes long, not K.
constexpr int kPartialThreads = 256;
constexpr int kPartialMaxLanes = 16;
inline int partial_lanes(int K) {
  int lanes = 1;
  while (lanes * 2 <= K && lanes < kPartialMaxLanes) lanes *= 2;
  return lanes;
}

// Up to kMaxPartialSums such sums in one launch (blockIdx.y picks the sum), each the tree above
// for its own n and K (its own lanes: a block's kPartialThreads threads laid out for it), so the
// bits of separate launches: one launch where an op sums several gradients.
constexpr int kMaxPartialSums = 5;
template <class Out>
struct PartialSums {
  const float* part[kMaxPartialSums];
  Out* out[kMaxPartialSums];
  size_t n[kMaxPartialSums];
  size_t cols[kMaxPartialSums], ld[kMaxPartialSums];  // cols 0: out contiguous
  const float* scale[kMaxPartialSums];                // null: 1
  int scale_neg_exp[kMaxPartialSums];                 // 1: the scale is −exp(scale[i])
  int K[kMaxPartialSums], lanes[kMaxPartialSums];     // partials of each, and its tree's lanes
  int accumulate[kMaxPartialSums];
};

// Sum e's element i done: times its scale where it has one, stored or added at its place.
template <class Out>
__device__ __forceinline__ void finish_partial_sum(const PartialSums<Out>& sums, int e, size_t i,
                                                   float total) {
  const size_t cols_out = sums.cols[e];
  const size_t o = cols_out ? i / cols_out * sums.ld[e] + i % cols_out : i;
  const float* scale = sums.scale[e];
  if (scale) total *= sums.scale_neg_exp[e] ? neg_expf_(scale[i]) : scale[i];
  Out* out = sums.out[e];
  out[o] = from_f32<Out>(sums.accumulate[e] ? to_f32(out[o]) + total : total);
}

// A sum of at most kPartialMaxLanes partials (the scan's dB and dC over its channel tiles: n
// is B·L·N, K a few tiles): the same tree, each element's in one thread's registers, four
// elements a thread (one 128-bit load a partial where n and part allow). With a column of the
// block's layout per element, a block would read a few hundred bytes for sixteen elements: 162
// µs for the scan's 63 MB of partials at production on an H200 (12 launches a step), latency
// more than bandwidth; 41 µs in this form. Same bits as the block's tree: lane l's sum 0 + p_l (+
// p_{l+lanes}), then the lanes added in order onto 0.
constexpr int kDirectPerThread = 4;
template <int kLanes, class Out>
__device__ __forceinline__ void sum_partials_direct(const PartialSums<Out>& sums, int e) {
  // K is in [kLanes, 2 kLanes) and at most kPartialMaxLanes: lane l has partial l, and partial
  // l + kLanes where K reaches it.
  constexpr int kItems = 2 * kLanes - 1 < kPartialMaxLanes ? 2 * kLanes - 1 : kPartialMaxLanes;
  const int K = sums.K[e];
  const size_t n = sums.n[e];
  const size_t i0 = (size_t(blockIdx.x) * kPartialThreads + threadIdx.x) * kDirectPerThread;
  if (i0 >= n) return;
  const float* part = sums.part[e];
  const bool vec = i0 + kDirectPerThread <= n && n % kDirectPerThread == 0 &&
                   (reinterpret_cast<uintptr_t>(part) & 15) == 0;
  float v[kItems][kDirectPerThread];
  // Every load first, then the adds.
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const float* p = part + size_t(k) * n + i0;
    if (k < K && vec) {
      load_float4(p, v[k]);
    } else {
#pragma unroll
      for (int q = 0; q < kDirectPerThread; ++q) v[k][q] = k < K && i0 + q < n ? p[q] : 0.0f;
    }
  }
#pragma unroll
  for (int q = 0; q < kDirectPerThread; ++q) {
    if (i0 + q >= n) break;
    float total = 0.0f;
#pragma unroll
    for (int l = 0; l < kLanes; ++l) {
      float s = 0.0f + v[l][q];
      // Lane l's second partial, where there is one (the index is known once unrolled).
      if (l + kLanes < kItems && l + kLanes < K) s += v[(l + kLanes) % kItems][q];
      total += s;
    }
    finish_partial_sum(sums, e, i0 + q, total);
  }
}

__host__ __device__ inline bool partial_sum_direct(int K) {
  return K <= kPartialMaxLanes;
}

template <class Out>
__global__ void __launch_bounds__(kPartialThreads)
    sum_partials_group_kernel(PartialSums<Out> sums) {
  __shared__ float lane_sums[kPartialThreads];
  const int e = int(blockIdx.y), lanes = sums.lanes[e], cols = kPartialThreads / lanes;
  if (partial_sum_direct(sums.K[e])) {
    switch (lanes) {
      case 1:
        return sum_partials_direct<1>(sums, e);
      case 2:
        return sum_partials_direct<2>(sums, e);
      case 4:
        return sum_partials_direct<4>(sums, e);
      case 8:
        return sum_partials_direct<8>(sums, e);
      default:
        return sum_partials_direct<kPartialMaxLanes>(sums, e);
    }
  }
  const int tx = int(threadIdx.x) % cols, ty = int(threadIdx.x) / cols;
  const float* part = sums.part[e];
  const size_t n = sums.n[e];
  const int K = sums.K[e];
  if (size_t(blockIdx.x) * cols >= n) return;  // the whole block: this sum is shorter
  const size_t i = size_t(blockIdx.x) * cols + tx;
  float s = 0.0f;
  if (i < n)
    for (int k = ty; k < K; k += lanes) s += part[size_t(k) * n + i];
  lane_sums[ty * cols + tx] = s;
  __syncthreads();
  if (ty != 0 || i >= n) return;
  float total = 0.0f;
  for (int l = 0; l < lanes; ++l) total += lane_sums[l * cols + tx];
  finish_partial_sum(sums, e, i, total);
}

// One sum of a group: n values from K partials into out, element i at out[i]; or, with cols,
// into rows `ld` apart: element i at out[i / cols * ld + i % cols] (columns of a wider tensor).
// With `scale`, element i's sum is multiplied by scale[i] first (a chain rule applied on the way
// out: (Σ) · scale, then added or stored); with `scale_neg_exp` by −exp(scale[i]) (Mamba's
// A = −exp(A_log): dA_log's gradient from dA's sum). K: its own count of partials (0: the
// group's); accumulate: 0 stores, 1 adds (-1: as the group).
template <class Out>
struct PartialSum {
  const float* part;
  size_t n;
  Out* out;
  size_t cols = 0, ld = 0;
  const float* scale = nullptr;
  int K = 0;
  int accumulate = -1;
  bool scale_neg_exp = false;
};

// Each of `sums` (entries with a null out or n = 0 are skipped), over K partials or their own,
// in one launch.
template <class Out>
void sum_partials_group(std::initializer_list<PartialSum<Out>> sums, int K, bool accumulate,
                        cudaStream_t stream, const char* op) {
  auto group = zero_filled<PartialSums<Out>>();
  int count = 0;
  size_t blocks = 0;
  for (const PartialSum<Out>& s : sums) {
    if (s.n == 0 || s.out == nullptr) continue;
    if (count == kMaxPartialSums) throw std::logic_error(std::string(op) + ": too many sums");
    group.part[count] = s.part;
    group.out[count] = s.out;
    group.n[count] = s.n;
    group.cols[count] = s.cols;
    group.ld[count] = s.ld;
    group.scale[count] = s.scale;
    group.scale_neg_exp[count] = s.scale_neg_exp ? 1 : 0;
    group.K[count] = s.K > 0 ? s.K : K;
    group.lanes[count] = partial_lanes(group.K[count]);
    group.accumulate[count] = s.accumulate < 0 ? (accumulate ? 1 : 0) : s.accumulate;
    const size_t b = partial_sum_direct(group.K[count])
                         ? ceil_div(s.n, size_t(kPartialThreads * kDirectPerThread))
                         : ceil_div(s.n, size_t(kPartialThreads / group.lanes[count]));
    blocks = b > blocks ? b : blocks;
    ++count;
  }
  if (count == 0) return;
  const auto kernel = &sum_partials_group_kernel<Out>;
  SLIPSTREAM_LAUNCH_AS("sum_partials_group_kernel", kernel, dim3(unsigned(blocks), unsigned(count)),
                       dim3(kPartialThreads), stream, group);
  check_launch(op);
}

// A launch's last block: a kernel whose blocks write partials can sum them itself, in its last
// block to finish, instead of a second launch. A counter is a word of device memory for one
// kernel, zero when the module loads and put back to zero by each launch's last block (atomicInc
// wraps), so launches of that kernel on one stream (a step's compute stream, a CUDA graph's
// replays) take turns with it; two launches of it running at once on two streams of one device
// would share it, which is why only the training step's kernels use one. Under the emulator a
// word per OS thread.
#if defined(SLIPSTREAM_CUDA_EMULATION)
#define SLIPSTREAM_BLOCK_COUNTER(name) thread_local unsigned name = 0
#else
#define SLIPSTREAM_BLOCK_COUNTER(name) __device__ unsigned name = 0
#endif

// True in the one block that finishes last. Every thread of every block calls it (none may
// have left the kernel), after its writes; the last block then sees every block's writes, read
// through L2 (__ldcg: no L1 line of this SM can be older). The fences pair as release and
// acquire around the count: each thread's writes before its block counts itself, the last
// block's reads after it has seen the others' counts.
__device__ __forceinline__ bool last_block(unsigned* counter) {
  __shared__ int last;
  __threadfence();  // this thread's writes reach the device before the block counts itself
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    const unsigned done = atomicInc(counter, blocks - 1);
    __threadfence();
    last = done == blocks - 1 ? 1 : 0;
  }
  __syncthreads();
  if (last) __threadfence();  // the block's reads of the partials after the count it saw
  return last != 0;
}

// In one block (every thread calls it, the block's threads a multiple of 32): out[i] =
// (accumulate ? out[i] : 0) + sum_{k < K} part[k * n + i], in a fixed order: 32 columns at a
// time, warp w sums partials w, w + warps, ... in order, then the first warp adds the warps'
// sums in order. `lanes` is shared memory of one float a thread.
template <class Out>
__device__ void sum_partials_in_block(const float* part, int K, size_t n, Out* out, bool accumulate,
                                      float* lanes) {
  const int threads = int(blockDim.x * blockDim.y * blockDim.z);
  const int t = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int lane = t & 31, warp = t >> 5, warps = threads >> 5;
  for (size_t c0 = 0; c0 < n; c0 += 32) {
    const size_t i = c0 + size_t(lane);
    float s = 0.0f;
    if (i < n)
      for (int k = warp; k < K; k += warps) s += __ldcg(part + size_t(k) * n + i);
    lanes[t] = s;
    __syncthreads();
    if (warp == 0 && i < n) {
      float total = 0.0f;
      for (int w = 0; w < warps; ++w) total += lanes[w * 32 + lane];
      out[i] = from_f32<Out>(accumulate ? to_f32(out[i]) + total : total);
    }
    __syncthreads();
  }
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
