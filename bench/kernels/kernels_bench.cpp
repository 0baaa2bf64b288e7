// CPU kernel benchmarks at the model's shapes. Multithreaded kernels report wall time.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/bf16.h"
#include "kernels/gemm.h"
#include "kernels/gru.h"
#include "kernels/selective_scan.h"

namespace sk = slipstream::kernels;

namespace {

std::vector<float> randf(size_t n, float lo = -1.0f, float hi = 1.0f, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// y (M, N) = x (M, K) W^T, W (N, K): the linear layer's GEMM, M = B * L = 256 * 30.
void BM_Sgemm(benchmark::State& st) {
  const int M = 7680, K = int(st.range(0)), N = int(st.range(1));
  auto x = randf(size_t(M) * K), W = randf(size_t(N) * K);
  std::vector<float> y(size_t(M) * N);
  for (auto _ : st) {
    sk::gemm<float>(false, true, M, N, K, 1.0f, x.data(), K, W.data(), K, 0.0f, y.data(), N);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      2.0 * M * N * K * st.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Sgemm)
    ->Args({64, 128})
    ->Args({128, 256})
    ->Args({256, 512})
    ->Args({512, 1024})
    ->Args({256, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_GemmBf16(benchmark::State& st) {
  const int M = 7680, K = int(st.range(0)), N = int(st.range(1));
  auto x = randf(size_t(M) * K), W = randf(size_t(N) * K);
  std::vector<uint16_t> xh(x.size()), Wh(W.size());
  sk::fp32_to_bf16(x.data(), xh.data(), x.size());
  sk::fp32_to_bf16(W.data(), Wh.data(), W.size());
  std::vector<float> y(size_t(M) * N), ws(sk::gemm_bf16_workspace_elems(M, N, K));
  for (auto _ : st) {
    sk::gemm_bf16(false, true, M, N, K, 1.0f, xh.data(), K, Wh.data(), K, 0.0f, y.data(), N,
                  ws.data());
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOPS"] = benchmark::Counter(
      2.0 * M * N * K * st.iterations(), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_GemmBf16)->Args({256, 512})->Unit(benchmark::kMillisecond)->UseRealTime();

struct ScanData {
  int B, L, D, N = 16;
  std::vector<float> u, delta, A, Bm, Cm, Dk, z, bias, out, dout, du, ddelta, dA, dB, dC, dD, dz,
      dbias, ws;
  ScanData(int B_, int L_, int D_) : B(B_), L(L_), D(D_) {
    const size_t bld = size_t(B) * L * D, bln = size_t(B) * L * N;
    u = randf(bld, -1, 1, 1);
    delta = randf(bld, -3, 0, 2);
    A = randf(size_t(D) * N, -4, -0.5f, 3);
    Bm = randf(bln, -1, 1, 4);
    Cm = randf(bln, -1, 1, 5);
    Dk = randf(D, -1, 1, 6);
    z = randf(bld, -1, 1, 7);
    bias = randf(D, -1, 1, 8);
    out.resize(bld);
    dout = randf(bld, -1, 1, 9);
    du.resize(bld);
    ddelta.resize(bld);
    dz.resize(bld);
    dA.resize(A.size());
    dB.resize(bln);
    dC.resize(bln);
    dD.resize(D);
    dbias.resize(D);
    ws.resize(sk::selective_scan_backward_workspace_elems(B, L, D, N));
  }
  void forward() {
    sk::selective_scan_forward(u.data(), delta.data(), A.data(), Bm.data(), Cm.data(), Dk.data(),
                               z.data(), bias.data(), true, static_cast<const float*>(nullptr),
                               out.data(), static_cast<float*>(nullptr), B, L, D, N);
  }
  void backward() {
    sk::selective_scan_backward(
        u.data(), delta.data(), A.data(), Bm.data(), Cm.data(), Dk.data(), z.data(), bias.data(),
        true, static_cast<const float*>(nullptr), dout.data(), du.data(), ddelta.data(), dA.data(),
        dB.data(), dC.data(), dD.data(), dz.data(), dbias.data(), ws.data(), B, L, D, N);
  }
};

void BM_ScanForward(benchmark::State& st) {
  ScanData s(int(st.range(0)), int(st.range(1)), int(st.range(2)));
  for (auto _ : st) s.forward();
  st.counters["Gstate/s"] =
      benchmark::Counter(double(s.B) * s.L * s.D * s.N * st.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
void BM_ScanBackward(benchmark::State& st) {
  ScanData s(int(st.range(0)), int(st.range(1)), int(st.range(2)));
  for (auto _ : st) s.backward();
  st.counters["Gstate/s"] =
      benchmark::Counter(double(s.B) * s.L * s.D * s.N * st.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
#define SCAN_SHAPES                   \
  Args({32, 30, 128})                 \
      ->Args({256, 30, 256})          \
      ->Args({256, 60, 256})          \
      ->Unit(benchmark::kMillisecond) \
      ->UseRealTime()
BENCHMARK(BM_ScanForward)->SCAN_SHAPES;
BENCHMARK(BM_ScanBackward)->SCAN_SHAPES;

struct GruData {
  int B = 256, L = 30, In = 256, H = 256;
  std::vector<float> x, h0, wih, whh, bih, bhh, y, saved, fws, dy, dx, dh0, dwih, dwhh, dbih, dbhh,
      bws;
  GruData() {
    x = randf(size_t(B) * L * In, -1, 1, 1);
    h0 = randf(size_t(B) * H, -1, 1, 2);
    wih = randf(size_t(3) * H * In, -0.06f, 0.06f, 3);
    whh = randf(size_t(3) * H * H, -0.06f, 0.06f, 4);
    bih = randf(3 * H, -0.06f, 0.06f, 5);
    bhh = randf(3 * H, -0.06f, 0.06f, 6);
    y.resize(size_t(B) * L * H);
    saved.resize(sk::gru_saved_elems(B, L, H));
    fws.resize(sk::gru_forward_workspace_elems(B, L, H));
    dy = randf(y.size(), -1, 1, 7);
    dx.resize(x.size());
    dh0.resize(h0.size());
    dwih.resize(wih.size());
    dwhh.resize(whh.size());
    dbih.resize(bih.size());
    dbhh.resize(bhh.size());
    bws.resize(sk::gru_backward_workspace_elems(B, L, H));
  }
  void forward() {
    sk::gru_forward(x.data(), h0.data(), wih.data(), whh.data(), bih.data(), bhh.data(), y.data(),
                    saved.data(), fws.data(), B, L, In, H);
  }
  void backward() {
    sk::gru_backward(x.data(), h0.data(), wih.data(), whh.data(), y.data(), saved.data(), dy.data(),
                     (const float*)nullptr, dx.data(), dh0.data(), dwih.data(), dwhh.data(),
                     dbih.data(), dbhh.data(), bws.data(), B, L, In, H);
  }
};

void BM_GruForward(benchmark::State& st) {
  GruData g;
  for (auto _ : st) g.forward();
}
void BM_GruBackward(benchmark::State& st) {
  GruData g;
  g.forward();
  for (auto _ : st) g.backward();
}
BENCHMARK(BM_GruForward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GruBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

// Single-threaded conversion throughput (bytes read + written), the two paths side by side.
constexpr size_t kConvN = size_t(1) << 22;  // 16 MiB of fp32
void BM_Bf16Scalar(benchmark::State& st) {
  auto x = randf(kConvN);
  std::vector<uint16_t> h(kConvN);
  for (auto _ : st) {
    sk::fp32_to_bf16_scalar(x.data(), h.data(), kConvN);
    benchmark::DoNotOptimize(h.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * kConvN * 6);
}
void BM_Bf16Avx512(benchmark::State& st) {
  if (!sk::cpu_has_avx512bf16()) {
    st.SkipWithError("no AVX-512 BF16");
    return;
  }
  auto x = randf(kConvN);
  std::vector<uint16_t> h(kConvN);
  for (auto _ : st) {
    sk::fp32_to_bf16_avx512bf16(x.data(), h.data(), kConvN);
    benchmark::DoNotOptimize(h.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * kConvN * 6);
}
BENCHMARK(BM_Bf16Scalar)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16Avx512)->Unit(benchmark::kMicrosecond);

void BM_AdamW(benchmark::State& st) {
  const size_t n = size_t(st.range(0));
  auto p = randf(n, -1, 1, 1), g = randf(n, -1, 1, 2);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<uint16_t> shadow(n);
  int64_t step = 0;
  for (auto _ : st)
    sk::adamw_step(p.data(), g.data(), m.data(), v.data(), shadow.data(), n, 1e-3f, 0.9f, 0.999f,
                   1e-8f, 0.01f, true, ++step);
  // bytes: p, g, m, v read; p, m, v written; shadow written
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n) * (4 * 7 + 2));
}
BENCHMARK(BM_AdamW)->Arg(10'000'000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
