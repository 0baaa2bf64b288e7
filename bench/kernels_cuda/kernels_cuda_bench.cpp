// CUDA kernel benchmarks at the presets' shapes (gpu_standard: B256 W60 d_model 128, d_inner
// 256, d_state 16; production: d_model 256, d_inner 512, d_state 32). Times are CUDA events
// around 10 back-to-back launches after a warm-up, reported as manual time per launch. GB/s
// counts the fewest bytes each call must move (every input read once, every output written
// once): compare it with the device's copy bandwidth (about 3 TB/s on an H100).
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/causal_conv1d.h"
#include "kernels/cuda_kernels.h"
#include "kernels/gru.h"
#include "kernels/gru_cudnn.h"
#include "kernels/rmsnorm.h"
#include "kernels/selective_scan.h"
#include "stages/melee/melee_kernels.h"
#include "stages/melee/model_math.h"
#include "stages/nn/mamba_model.h"
#include "stages/ops/device_ops.h"

namespace sk = slipstream::kernels;
namespace melee = slipstream::melee;

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Shape {
  const char* name;
  int B, L, d_model, D, N;
};
const Shape kShapes[] = {{"gpu_standard", 256, 60, 128, 256, 16},
                         {"production", 256, 60, 256, 512, 32}};

// Device buffers of random values (never zeros: they can run faster than real data).
class Buffers {
 public:
  ~Buffers() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <class T>
  T* random(size_t n, float lo, float hi) {
    std::vector<float> h(n);
    std::uniform_real_distribution<float> d(lo, hi);
    for (auto& x : h) x = d(rng_);
    T* p = alloc<T>(n);
    if constexpr (std::is_same_v<T, float>) {
      ok(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    } else {
      std::vector<uint16_t> b(n);
      sk::fp32_to_bf16(h.data(), b.data(), n);
      ok(cudaMemcpy(p, b.data(), n * 2, cudaMemcpyHostToDevice), "upload");
    }
    return p;
  }
  template <class T>
  T* alloc(size_t n) {
    void* p = nullptr;
    ok(cudaMalloc(&p, n * sizeof(T) + 16), "cudaMalloc");
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::mt19937_64 rng_{42};
  std::vector<void*> ptrs_;
};

// A cuBLASLt handle and 32 MB of workspace from `m`, as a run's execution context holds them.
class LtContext {
 public:
  explicit LtContext(Buffers& m) {
    if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasLtCreate");
    gemm = {lt_, m.alloc<char>(kBytes), kBytes};
  }
  ~LtContext() { cublasLtDestroy(lt_); }
  LtContext(const LtContext&) = delete;
  LtContext& operator=(const LtContext&) = delete;
  sk::CudaKernels::GemmContext gemm;

 private:
  static constexpr size_t kBytes = size_t(32) << 20;
  cublasLtHandle_t lt_ = nullptr;
};

// Times `launch` (which enqueues on `s`) with events; sets manual time and the GB/s counter.
template <class F>
void time_launches(benchmark::State& st, cudaStream_t s, double bytes, F&& launch) {
  constexpr int kReps = 10;
  for (int i = 0; i < 3; ++i) launch();
  ok(cudaStreamSynchronize(s), "warm-up");
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "event");
  ok(cudaEventCreate(&b), "event");
  for (auto _ : st) {
    ok(cudaEventRecord(a, s), "record");
    for (int i = 0; i < kReps; ++i) launch();
    ok(cudaEventRecord(b, s), "record");
    ok(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    st.SetIterationTime(ms / 1e3 / kReps);
  }
  ok(cudaGetLastError(), "kernels");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  st.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
  st.counters["GB/s"].value /= 1e9;
}

// forward, backward alone, or the pair a training step runs: the backward finding its chunk
// states itself (pair) or reading the ones the forward kept (pair_kept_states);
// forward_kept_states: the forward alone writing them, as a training step's does.
enum class ScanTimed { forward, backward, pair, pair_kept_states, forward_kept_states };
template <class T>
void scan(benchmark::State& st, const Shape& sh, ScanTimed what) {
  const size_t bld = size_t(sh.B) * sh.L * sh.D, bln = size_t(sh.B) * sh.L * sh.N;
  Buffers m;
  const T *u = m.random<T>(bld, -1, 1), *delta = m.random<T>(bld, -1, 1);
  const T *z = m.random<T>(bld, -2, 2), *Bm = m.random<T>(bln, -1, 1),
          *Cm = m.random<T>(bln, -1, 1);
  // A_log, as the model passes it (the kernels make A = −exp(A_log): a_log below); A from
  // −e^1.4 ≈ −4 to −e^−0.7 ≈ −0.5.
  const float* A = m.random<float>(size_t(sh.D) * sh.N, -0.7f, 1.4f);
  const float *Dskip = m.random<float>(sh.D, -1, 1), *bias = m.random<float>(sh.D, -3, -1);
  const T* dout = m.random<T>(bld, -1, 1);
  T *out = m.alloc<T>(bld), *du = m.alloc<T>(bld), *ddelta = m.alloc<T>(bld), *dz = m.alloc<T>(bld);
  T *dB = m.alloc<T>(bln), *dC = m.alloc<T>(bln);
  float *dA = m.random<float>(size_t(sh.D) * sh.N, 0, 0), *dD = m.random<float>(sh.D, 0, 0);
  float* db = m.random<float>(sh.D, 0, 0);
  void* ws = m.alloc<char>(
      sk::CudaKernels::selective_scan_backward_workspace_bytes(sh.B, sh.L, sh.D, sh.N));
  float* states = what == ScanTimed::pair_kept_states || what == ScanTimed::forward_kept_states
                      ? m.alloc<float>(sk::CudaKernels::selective_scan_chunk_states_bytes(
                                           sh.B, sh.L, sh.D, sh.N) /
                                       sizeof(float))
                      : nullptr;
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  const double e = sizeof(T);
  auto forward = [&] {
    sk::CudaKernels::selective_scan_forward<T>(u, delta, A, Bm, Cm, Dskip, z, bias, true, nullptr,
                                               out, nullptr, nullptr, states, sh.B, sh.L, sh.D,
                                               sh.N, s, 0, 0, true);
  };
  auto backward = [&] {
    sk::CudaKernels::selective_scan_backward<T>(
        u, delta, A, Bm, Cm, Dskip, z, bias, true, nullptr, states, dout, du, ddelta, dA, dB, dC,
        dD, dz, db, nullptr, nullptr, ws, sh.B, sh.L, sh.D, sh.N, s, 0, true);
  };
  const double fwd_bytes = (4 * bld + 2 * bln) * e, bwd_bytes = (7 * bld + 4 * bln) * e;
  if (what == ScanTimed::forward || what == ScanTimed::forward_kept_states) {
    time_launches(st, s, fwd_bytes, forward);
  } else if (what == ScanTimed::backward) {
    time_launches(st, s, bwd_bytes, backward);
  } else {
    time_launches(st, s, fwd_bytes + bwd_bytes, [&] {
      forward();
      backward();
    });
  }
  cudaStreamDestroy(s);
}

// scan<T> in fp32 or bf16.
void scan_in(benchmark::State& st, const Shape& sh, ScanTimed what, bool bf16) {
  if (bf16)
    scan<sk::bfloat16>(st, sh, what);
  else
    scan<float>(st, sh, what);
}

// One frame of inference for the whole batch: the state is read and written once.
void scan_step(benchmark::State& st, const Shape& sh) {
  const size_t bd = size_t(sh.B) * sh.D, bn = size_t(sh.B) * sh.N;
  Buffers m;
  float* state = m.random<float>(bd * sh.N, -1, 1);
  const float *u = m.random<float>(bd, -1, 1), *delta = m.random<float>(bd, -1, 1);
  const float *z = m.random<float>(bd, -1, 1), *Bm = m.random<float>(bn, -1, 1);
  const float* Cm = m.random<float>(bn, -1, 1);
  const float* A = m.random<float>(size_t(sh.D) * sh.N, -4.0f, -0.5f);
  const float *Dskip = m.random<float>(sh.D, -1, 1), *bias = m.random<float>(sh.D, -3, -1);
  float* out = m.alloc<float>(bd);
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  time_launches(st, s, (2.0 * bd * sh.N + 4.0 * bd + 2.0 * bn) * 4, [&] {
    sk::CudaKernels::selective_scan_step<float>(state, u, delta, A, Bm, Cm, Dskip, z, bias, true,
                                                out, sh.B, sh.D, sh.N, s);
  });
  cudaStreamDestroy(s);
}

template <class T>
void conv(benchmark::State& st, const Shape& sh, bool backward) {
  const size_t n = size_t(sh.B) * sh.L * sh.D;
  const int K = 4;
  Buffers m;
  const T *x = m.random<T>(n, -1, 1), *dy = m.random<T>(n, -1, 1);
  const float *w = m.random<float>(size_t(sh.D) * K, -0.5, 0.5), *b = m.random<float>(sh.D, -1, 1);
  T *y = m.alloc<T>(n), *dx = m.alloc<T>(n);
  float *dw = m.random<float>(size_t(sh.D) * K, 0, 0), *dbias = m.random<float>(sh.D, 0, 0);
  void* ws = m.alloc<char>(
      sk::CudaKernels::causal_conv1d_backward_workspace_bytes(sh.B, sh.L, sh.D, K, true));
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  if (!backward) {
    time_launches(st, s, 2.0 * n * sizeof(T), [&] {
      sk::CudaKernels::causal_conv1d_forward<T>(x, nullptr, w, b, y, nullptr, sh.B, sh.L, sh.D, K,
                                                true, s);
    });
  } else {
    time_launches(st, s, 3.0 * n * sizeof(T), [&] {
      sk::CudaKernels::causal_conv1d_backward<T>(x, nullptr, w, b, dy, dx, nullptr, dw, dbias, ws,
                                                 sh.B, sh.L, sh.D, K, true, s);
    });
  }
  cudaStreamDestroy(s);
}

template <class T>
void norm(benchmark::State& st, const Shape& sh, bool backward) {
  const size_t M = size_t(sh.B) * sh.L, D = size_t(sh.d_model), n = M * D;
  Buffers m;
  const T *x = m.random<T>(n, -1, 1), *res = m.random<T>(n, -1, 1), *dy = m.random<T>(n, -1, 1);
  const float* w = m.random<float>(D, 0.5, 1.5);
  T *y = m.alloc<T>(n), *sum = m.random<T>(n, -1, 1), *ds = m.random<T>(n, -1, 1);
  float *rstd = m.random<float>(M, 0.5, 1.5), *dw = m.random<float>(D, 0, 0);
  void* ws = m.alloc<char>(sk::CudaKernels::rmsnorm_add_backward_workspace_bytes(M, D));
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  if (!backward) {
    time_launches(st, s, 4.0 * n * sizeof(T), [&] {
      sk::CudaKernels::rmsnorm_add_forward<T>(x, res, w, y, nullptr, sum, rstd, M, D, 1e-5f, s);
    });
  } else {
    time_launches(st, s, 4.0 * n * sizeof(T), [&] {
      sk::CudaKernels::rmsnorm_add_backward<T>(sum, w, rstd, dy, ds, ds, nullptr, dw, ws, M, D, s);
    });
  }
  cudaStreamDestroy(s);
}

// One GRU layer (In = H = d_model) over the whole window: the forward, or the backward after it
// (each step a cuBLASLt GEMM and a gate kernel), FP32 or the bf16 form (bf16 GEMM operands). GB/s
// counts the FP32 activations read and written once (x, y, the saved gates; and dy, dx, the gate
// gradients for the backward).
void gru(benchmark::State& st, const Shape& sh, bool backward, bool bf16) {
  const int B = sh.B, L = sh.L, In = sh.d_model, H = sh.d_model, G = 3 * H;
  const size_t M = size_t(B) * L;
  Buffers m;
  const float *x = m.random<float>(M * In, -1, 1), *dy = m.random<float>(M * H, -1, 1);
  const float *w_ih = m.random<float>(size_t(G) * In, -0.1f, 0.1f),
              *w_hh = m.random<float>(size_t(G) * H, -0.1f, 0.1f);
  const float *b_ih = m.random<float>(G, -0.1f, 0.1f), *b_hh = m.random<float>(G, -0.1f, 0.1f);
  float *y = m.alloc<float>(M * H), *saved = m.alloc<float>(M * 4 * H),
        *dx = m.alloc<float>(M * In);
  float *dw_ih = m.random<float>(size_t(G) * In, 0, 0),
        *dw_hh = m.random<float>(size_t(G) * H, 0, 0);
  float *db_ih = m.random<float>(G, 0, 0), *db_hh = m.random<float>(G, 0, 0);
  const sk::bfloat16* w_ih_bf =
      bf16 ? m.random<sk::bfloat16>(size_t(G) * In, -0.1f, 0.1f) : nullptr;
  const sk::bfloat16* w_hh_bf = bf16 ? m.random<sk::bfloat16>(size_t(G) * H, -0.1f, 0.1f) : nullptr;
  void* ws =
      m.alloc<char>(std::max(sk::CudaKernels::gru_forward_workspace_bytes(B, L, In, H, bf16),
                             sk::CudaKernels::gru_backward_workspace_bytes(B, L, In, H, bf16)));
  const LtContext lt(m);
  const sk::CudaKernels::GemmContext& gemm = lt.gemm;
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  const auto forward = [&] {
    sk::CudaKernels::gru_forward(gemm, x, w_ih, w_hh, w_ih_bf, w_hh_bf, b_ih, b_hh, nullptr, y,
                                 saved, ws, B, L, In, H, s);
  };
  forward();
  if (!backward) {
    time_launches(st, s, 4.0 * M * (In + 5 * H), forward);
  } else {
    time_launches(st, s, 4.0 * M * (2 * In + 8 * H + 2 * G), [&] {
      sk::CudaKernels::gru_backward(gemm, x, w_ih, w_hh, w_ih_bf, w_hh_bf, nullptr, y, saved, dy,
                                    dx, dw_ih, dw_hh, db_ih, db_hh, ws, B, L, In, H, s);
    });
  }
  cudaStreamDestroy(s);
}

// The same layer in cuDNN's RNN (kernels/gru_cudnn.h): the forward copies the weights into
// cuDNN's weight space, the backward adds cuDNN's weight gradients into ours, as the stage does;
// the bf16 form also rounds x and dy and widens y and dx (cuDNN 9.13 or later).
void gru_cudnn(benchmark::State& st, const Shape& sh, bool backward, bool bf16) {
  if (bf16) {
    const std::string why = sk::cuda::CudnnGru::bf16_unsupported();
    if (!why.empty()) return st.SkipWithError(why.c_str());
  }
  const int B = sh.B, L = sh.L, In = sh.d_model, H = sh.d_model, G = 3 * H;
  const size_t M = size_t(B) * L, nw = size_t(G) * (In + H) + 2 * size_t(G);
  Buffers m;
  const float *x = m.random<float>(M * In, -1, 1), *dy = m.random<float>(M * H, -1, 1);
  const float* w = m.random<float>(nw, -0.1f, 0.1f);
  const auto* wb = m.random<sk::bfloat16>(nw, -0.1f, 0.1f);
  float *y = m.alloc<float>(M * H), *dx = m.alloc<float>(M * In), *dw = m.random<float>(nw, 0, 0);
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  sk::cuda::CudnnGru gru(
      s, In, H, {{0, size_t(G) * In, size_t(G) * (In + H), size_t(G) * (In + H) + G}}, bf16);
  const auto needs = gru.describe_batch(B, L);
  const sk::cuda::CudnnGru::Buffers b{
      m.alloc<char>(gru.weight_space_bytes()), m.alloc<char>(gru.weight_space_bytes()),
      m.alloc<char>(needs.work_bytes),         m.alloc<char>(needs.reserve_bytes),
      m.alloc<char>(needs.staging_bytes + 1),  m.alloc<int>(B)};
  gru.set_batch(b.seq_lengths);
  gru.forward(x, w, wb, y, b, true);
  const double e = bf16 ? 2.0 : 4.0;  // cuDNN's element: its weights and staged data
  if (!backward) {
    time_launches(st, s, e * (M * (In + H) + nw), [&] { gru.forward(x, w, wb, y, b, true); });
  } else {
    time_launches(st, s, e * (M * (2 * In + 2 * H) + 2 * nw),
                  [&] { gru.backward(x, y, dy, dx, dw, b); });
  }
  cudaStreamDestroy(s);
}

// Host-to-device copy of a batch-sized buffer (prefetch's work) from page-locked memory (what
// the host pool hands out in a CUDA run) and from ordinary pageable memory: GB/s.
void host_to_device(benchmark::State& state, size_t bytes, bool pinned) {
  void* host = nullptr;
  std::vector<char> pageable;
  if (pinned) {
    ok(cudaMallocHost(&host, bytes), "cudaMallocHost");
  } else {
    pageable.assign(bytes, 1);
    host = pageable.data();
  }
  std::memset(host, 1, bytes);
  void* dev = nullptr;
  ok(cudaMalloc(&dev, bytes), "cudaMalloc");
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "cudaStreamCreate");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  ok(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s), "warm-up copy");
  for (auto _ : state) {
    cudaEventRecord(e0, s);
    ok(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    cudaEventRecord(e1, s);
    ok(cudaEventSynchronize(e1), "copy");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    state.SetIterationTime(ms * 1e-3);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  cudaFree(dev);
  if (pinned) cudaFreeHost(host);
}

// The floor under a policy's frame on this device (docs/policy.md: a frame is its inputs' copy
// in, one CUDA graph of 19 launches at gpu_standard's model, its answers' copy out and one wait):
// a graph of `nodes` dependent launches of one small kernel (add_inplace on 256 floats), launched
// and waited for from the host as a frame's graph is, with `copies` a 1 KB page-locked copy in
// before it and one out after it on the same stream. The time is the host's wall clock from the
// first call to the wait's return; device_us is the device's, from an event before the copy in
// (or the graph) to one after the last operation. Measures what the launches alone cost, which
// says how much of a frame's time fewer, fused kernels could take off.
void frame_floor(benchmark::State& st, int nodes, bool copies) {
  constexpr size_t kFloats = 256, kBytes = 1024;
  float *a = nullptr, *y = nullptr;
  void *host_in = nullptr, *host_out = nullptr, *dev_in = nullptr;
  ok(cudaMalloc(&a, kFloats * sizeof(float)), "cudaMalloc");
  ok(cudaMalloc(&y, kFloats * sizeof(float)), "cudaMalloc");
  ok(cudaMalloc(&dev_in, kBytes), "cudaMalloc");
  ok(cudaMallocHost(&host_in, kBytes), "cudaMallocHost");
  ok(cudaMallocHost(&host_out, kBytes), "cudaMallocHost");
  ok(cudaMemset(a, 0, kFloats * sizeof(float)), "cudaMemset");
  ok(cudaMemset(y, 0, kFloats * sizeof(float)), "cudaMemset");
  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph = nullptr;
  ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < nodes; ++i) sk::CudaKernels::add_inplace(y, a, kFloats, s);
  ok(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaEvent_t e0, e1;
  ok(cudaEventCreate(&e0), "cudaEventCreate");
  ok(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<double> device_us;
  auto frame = [&] {
    ok(cudaEventRecord(e0, s), "cudaEventRecord");
    if (copies) ok(cudaMemcpyAsync(dev_in, host_in, kBytes, cudaMemcpyHostToDevice, s), "copy in");
    ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    if (copies) ok(cudaMemcpyAsync(host_out, y, kBytes, cudaMemcpyDeviceToHost, s), "copy out");
    ok(cudaEventRecord(e1, s), "cudaEventRecord");
    ok(cudaEventSynchronize(e1), "cudaEventSynchronize");
  };
  for (int i = 0; i < 20; ++i) frame();  // warm-up
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    frame();
    st.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    device_us.push_back(ms * 1e3);
  }
  std::sort(device_us.begin(), device_us.end());
  if (!device_us.empty()) st.counters["device_us"] = device_us[device_us.size() / 2];
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  cudaFreeHost(host_in);
  cudaFreeHost(host_out);
  cudaFree(dev_in);
  cudaFree(a);
  cudaFree(y);
}

// A policy frame's GEMMs (one game, or eight, at gpu_standard's model): C (M, N) = A (M, K) Bᵀ
// by cuBLASLt or by the small-row kernel (kernels/gemm.h, gemm_small_rows), fp32 or bf16
// operands. GB/s: B (the weight) read once, the rest negligible.
template <class T>
void gemm_small(benchmark::State& st, int M, int N, int K, bool warps) {
  Buffers m;
  const T* A = m.random<T>(size_t(M) * K, -1, 1);
  const T* B = m.random<T>(size_t(N) * K, -1, 1);
  float* C = m.alloc<float>(size_t(M) * N);
  const LtContext lt(m);
  const sk::CudaKernels::GemmContext& gemm = lt.gemm;
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  const bool was = sk::CudaKernels::small_gemm();
  sk::CudaKernels::set_small_gemm(warps);
  time_launches(st, s, double(sizeof(T)) * N * K, [&] {
    sk::CudaKernels::gemm(gemm, false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, s);
  });
  sk::CudaKernels::set_small_gemm(was);
  cudaStreamDestroy(s);
}

// A Mamba model's frame (one step of `games` games from their carried state, no backward: a
// policy's frame; din the melee embedding's width) as the layers run it (1 + 6 a layer + 1
// launches: cuBLASLt GEMMs, norms, the convolution's and scan's kernels) or as one launch
// (kernels/mamba_frame.h), captured as a CUDA graph as a policy's frame is; the graph reads the
// same state each replay (the time of a frame, not its meaning). GB/s: the weights read once;
// `launches`: the graph's nodes.
void mamba_frame(benchmark::State& st, const Shape& sh, int layers, int games, bool bf16,
                 bool fused) {
  namespace nn = slipstream::nn;
  using Ops = slipstream::ops::DeviceOps<sk::CudaKernels>;
  nn::MambaConfig c;
  c.din = melee::EmbedLayout().width(), c.d_model = sh.d_model, c.d_state = sh.N;
  c.layers = layers;
  const nn::MambaLayout lay(c);
  std::vector<float> hw(lay.params.total());
  nn::mamba_init(c, lay, hw.data(), 3);
  std::vector<uint16_t> hwb(hw.size());
  sk::fp32_to_bf16(hw.data(), hwb.data(), hw.size());
  Buffers m;
  float* w = m.alloc<float>(hw.size());
  uint16_t* wb = m.alloc<uint16_t>(hw.size());
  ok(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice), "upload");
  ok(cudaMemcpy(wb, hwb.data(), hw.size() * 2, cudaMemcpyHostToDevice), "upload");
  const float* x = m.random<float>(size_t(games) * c.din, -1, 1);
  float* y = m.alloc<float>(size_t(games) * c.d_model);
  const LtContext lt(m);
  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  const bool was = sk::CudaKernels::mamba_frame_fused();
  sk::CudaKernels::set_mamba_frame_fused(fused);
  {
    nn::MambaModel<float, Ops> model(c, Ops(slipstream::Device::cuda(0), s, lt.gemm));
    model.set_carry(true);
    model.resize(games, 1, bf16);
    model.set_forward_only(true);
    model.forward(x, w, bf16 ? wb : nullptr, y);  // cuBLASLt's plans made before the capture
    ok(cudaStreamSynchronize(s), "first frame");
    cudaGraph_t graph = nullptr;
    ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    model.forward(x, w, bf16 ? wb : nullptr, y);
    ok(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    size_t nodes = 0;
    ok(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes");
    // The linear layers' weights at the precision's width, the rest fp32.
    const size_t di = size_t(c.d_inner()), dm = size_t(c.d_model);
    const size_t P = size_t(c.rank() + 2 * c.d_state);
    const size_t lin = dm * size_t(c.din) + size_t(layers) * (2 * di * dm + P * di + dm * di);
    time_launches(st, s, double(lin) * (bf16 ? 2 : 4) + double(hw.size() - lin) * 4,
                  [&] { ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch"); });
    st.counters["launches"] = double(nodes);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    ok(cudaStreamSynchronize(s), "frames");
  }
  sk::CudaKernels::set_mamba_frame_fused(was);
  cudaStreamDestroy(s);
}

// The embedding's table gradients (stages/melee/melee_cuda.inc) in one form, at the preset's
// batch (B × W positions, three slots each) with ids drawn as games have them: a few action
// states hold most items (u³ over the 399), two characters and one stage a window, the third
// slot (Nana) mostly absent. GB/s: dout's embedding columns read once, the tables written once.
void embed_backward(benchmark::State& st, const Shape& sh,
                    melee::cuda::Kernels::EmbedBackwardVariant v) {
  using K = melee::cuda::Kernels;
  const size_t rows = size_t(sh.B) * sh.L;
  const melee::EmbedLayout L;
  const auto dims = melee::embed_dims<K::EmbedDims>(L);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int32_t> action(rows * melee::kSlots), character(rows * melee::kSlots), stage(rows);
  std::vector<float> numeric(rows * melee::kSlots * melee::kNumericFeatures, 0.5f);
  for (size_t w = 0; w < size_t(sh.B); ++w) {
    const int32_t chars[2] = {int32_t(rng() % melee::kCharacters),
                              int32_t(rng() % melee::kCharacters)};
    const int32_t where = int32_t(rng() % 6);
    for (size_t t = 0; t < size_t(sh.L); ++t) {
      const size_t r = w * sh.L + t;
      stage[r] = where;
      for (int s = 0; s < melee::kSlots; ++s) {
        const size_t rs = r * melee::kSlots + s;
        const double x = u(rng);
        action[rs] = int32_t(x * x * x * (melee::kActionStates - 1));
        character[rs] = chars[s == 1 ? 1 : 0];
        numeric[rs * melee::kNumericFeatures + melee::kExists] =
            s < 2 || u(rng) < 0.1 ? 1.0f : 0.0f;
      }
    }
  }
  Buffers m;
  auto upload = [&](const auto& h) {
    using T = typename std::decay_t<decltype(h)>::value_type;
    T* p = m.alloc<T>(h.size());
    ok(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return p;
  };
  const float* g_num = upload(numeric);
  const int32_t *g_a = upload(action), *g_c = upload(character), *g_s = upload(stage);
  const float* dout = m.random<float>(rows * size_t(L.width()), -1, 1);
  float* da = m.alloc<float>(size_t(melee::kActionStates) * L.action_dim);
  float* dc = m.alloc<float>(size_t(melee::kCharacters) * L.character_dim);
  float* ds = m.alloc<float>(size_t(melee::kStages) * L.stage_dim);
  void* ws = m.alloc<char>(K::embed_backward_workspace_bytes(dims, rows));
  const auto was = K::embed_backward_variant();
  K::set_embed_backward_variant(v);
  const double bytes =
      double(rows) * (melee::kSlots * (L.action_dim + L.character_dim) + L.stage_dim) * 4.0 +
      (double(melee::kActionStates) * L.action_dim + double(melee::kCharacters) * L.character_dim +
       double(melee::kStages) * L.stage_dim) *
          4.0;
  cudaStream_t s;
  ok(cudaStreamCreate(&s), "stream");
  time_launches(st, s, bytes, [&] {
    K::embed_backward(dims, rows, g_num, g_a, g_c, g_s, dout, da, dc, ds, ws, s);
  });
  K::set_embed_backward_variant(was);
  cudaStreamDestroy(s);
}

template <class F>
void add(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("bench_kernels_cuda: no CUDA device (%s): nothing measured\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    return 0;
  }
  // A small copy and one the size of gpu_standard's loader batch (B256 W60, 352 bytes per
  // position over the eight tensors: 5.4 MB).
  // in_proj, x_proj, out_proj and the heads' output at gpu_standard's model, one game; in_proj
  // for eight.
  for (const auto& [M, N, K] :
       {std::array{1, 512, 128}, std::array{1, 40, 256}, std::array{1, 128, 256},
        std::array{1, 81, 128}, std::array{8, 512, 128}})
    for (bool warps : {false, true})
      for (bool bf16 : {false, true}) {
        const std::string name = std::string("gemm_small/") + (warps ? "warps/" : "cublaslt/") +
                                 (bf16 ? "bf16/" : "fp32/") + "M" + std::to_string(M) + "_N" +
                                 std::to_string(N) + "_K" + std::to_string(K);
        if (bf16)
          add(name, [=](benchmark::State& st) { gemm_small<sk::bfloat16>(st, M, N, K, warps); });
        else
          add(name, [=](benchmark::State& st) { gemm_small<float>(st, M, N, K, warps); });
      }
  // A model's frame by its layers or in one launch (kernels/mamba_frame.h), at gpu_standard's
  // model (2 layers) and production's (3): one game, 64, 1,024.
  for (const Shape& sh : kShapes)
    for (int games : {1, 64, 1024})
      for (bool bf16 : {false, true})
        for (bool fused : {false, true})
          add(std::string("mamba_frame/") + (fused ? "fused/" : "layers/") +
                  (bf16 ? "bf16/" : "fp32/") + sh.name + "/games:" + std::to_string(games),
              [=](benchmark::State& st) {
                mamba_frame(st, sh, sh.N > 16 ? 3 : 2, games, bf16, fused);
              });
  for (int nodes : {1, 8, 19, 32})
    for (bool copies : {false, true})
      add("frame_floor/" + std::to_string(nodes) + (copies ? "_launches_copies" : "_launches"),
          [=](benchmark::State& st) { frame_floor(st, nodes, copies); });
  for (size_t mb : {1, 6})
    for (bool pinned : {true, false})
      add(std::string("host_to_device/") + (pinned ? "pinned/" : "pageable/") + std::to_string(mb) +
              "MB",
          [=](benchmark::State& st) { host_to_device(st, mb << 20, pinned); });
  for (const Shape& sh : kShapes) {
    const std::string p = sh.name;
    for (bool bwd : {false, true}) {
      const std::string dir = bwd ? "backward" : "forward";
      const ScanTimed timed = bwd ? ScanTimed::backward : ScanTimed::forward;
      add("scan_" + dir + "/fp32/" + p, [=](benchmark::State& st) { scan<float>(st, sh, timed); });
      if (bwd && sh.N > 8)  // the backward's other forms (kernels/selective_scan.h)
        for (auto [variant, vname] :
             {std::pair{sk::CudaKernels::ScanBackwardVariant::shared_sums, "shared_sums"},
              std::pair{sk::CudaKernels::ScanBackwardVariant::shared_whole_chunks,
                        "shared_whole_chunks"},
              std::pair{sk::CudaKernels::ScanBackwardVariant::spread_steps, "spread_steps"}})
          for (bool bf16 : {false, true})
            add(std::string("scan_backward_") + vname + (bf16 ? "/bf16/" : "/fp32/") + p,
                [=](benchmark::State& st) {
                  const auto was = sk::CudaKernels::scan_backward_variant();
                  sk::CudaKernels::set_scan_backward_variant(variant);
                  scan_in(st, sh, ScanTimed::backward, bf16);
                  sk::CudaKernels::set_scan_backward_variant(was);
                });
      add("scan_" + dir + "/bf16/" + p,
          [=](benchmark::State& st) { scan<sk::bfloat16>(st, sh, timed); });
      add("conv1d_silu_" + dir + "/fp32/" + p,
          [=](benchmark::State& st) { conv<float>(st, sh, bwd); });
      add("conv1d_silu_" + dir + "/bf16/" + p,
          [=](benchmark::State& st) { conv<sk::bfloat16>(st, sh, bwd); });
      add("rmsnorm_add_" + dir + "/fp32/" + p,
          [=](benchmark::State& st) { norm<float>(st, sh, bwd); });
      add("rmsnorm_add_" + dir + "/bf16/" + p,
          [=](benchmark::State& st) { norm<sk::bfloat16>(st, sh, bwd); });
    }
    // A training step's forward + backward, the backward finding its chunk states itself or
    // reading the forward's (kernels/selective_scan.h: off by default until these two compare).
    for (bool kept : {false, true})
      for (bool bf16 : {false, true}) {
        const ScanTimed timed = kept ? ScanTimed::pair_kept_states : ScanTimed::pair;
        add(std::string(kept ? "scan_fwd_bwd_kept_states/" : "scan_fwd_bwd/") +
                (bf16 ? "bf16/" : "fp32/") + p,
            [=](benchmark::State& st) { scan_in(st, sh, timed, bf16); });
      }
    // A training step's forward (keeping the chunk states) in its default form and its lean
    // form (kernels/selective_scan.h, set_scan_forward_lean: not the default until these
    // compare on a GPU).
    for (bool lean : {false, true})
      for (bool bf16 : {false, true})
        add(std::string(lean ? "scan_forward_lean/" : "scan_forward_kept_states/") +
                (bf16 ? "bf16/" : "fp32/") + p,
            [=](benchmark::State& st) {
              const bool was = sk::CudaKernels::scan_forward_lean();
              sk::CudaKernels::set_scan_forward_lean(lean);
              scan_in(st, sh, ScanTimed::forward_kept_states, bf16);
              sk::CudaKernels::set_scan_forward_lean(was);
            });
    add("scan_step/fp32/" + p, [=](benchmark::State& st) { scan_step(st, sh); });
    // The embedding's table gradients: the default form against the sorted one (melee_cuda.inc).
    using EV = melee::cuda::Kernels::EmbedBackwardVariant;
    for (auto [v, vname] : {std::pair{EV::partials, "partials"}, std::pair{EV::sorted, "sorted"}})
      add(std::string("embed_backward_") + vname + "/" + p,
          [=](benchmark::State& st) { embed_backward(st, sh, v); });
    for (bool bf16 : {false, true}) {
      const std::string prec = bf16 ? "bf16/" : "fp32/";
      add("gru_layer_forward/" + prec + p, [=](benchmark::State& st) { gru(st, sh, false, bf16); });
      add("gru_layer_backward/" + prec + p, [=](benchmark::State& st) { gru(st, sh, true, bf16); });
    }
    for (bool bf16 : {false, true}) {
      const std::string prec = bf16 ? "bf16/" : "fp32/";
      add("gru_cudnn_forward/" + prec + p,
          [=](benchmark::State& st) { gru_cudnn(st, sh, false, bf16); });
      add("gru_cudnn_backward/" + prec + p,
          [=](benchmark::State& st) { gru_cudnn(st, sh, true, bf16); });
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
