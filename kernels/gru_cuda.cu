// One GRU layer on CUDA: the math of kernels/gru_cpu.cpp (PyTorch nn.GRU's gates r, z, n; zero
// initial state), against which it is tested. The recurrence is sequential in time, so each step
// is a cuBLASLt GEMM of the previous state and one element-wise gate kernel (thread per
// (batch row, unit)); the projections that do not depend on the recurrence are single GEMMs over
// every step. No atomics: the bias gradients are column sums in a fixed order.
#include <algorithm>
#include <utility>

#include "kernels/cuda_common.cuh"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gru.h"

namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS {

namespace {

constexpr int kThreads = 256;

size_t align_up(size_t n) {
  return (n + 255) / 256 * 256;
}

// Step t: gi = x W_ih^T (row (b, t)), gh = h_{t-1} W_hh^T (row b; null at t = 0: h_{-1} = 0).
__global__ void gru_gates_forward_kernel(const float* __restrict__ gi, const float* __restrict__ gh,
                                         const float* __restrict__ b_ih,
                                         const float* __restrict__ b_hh, float* __restrict__ y,
                                         float* __restrict__ saved, int B, int L, int H, int t) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * H) return;
  const size_t b = i / size_t(H), j = i - b * size_t(H);
  const size_t row = b * size_t(L) + size_t(t), G = 3 * size_t(H);
  const float* gir = gi + row * G;
  const float* ghr = gh ? gh + b * G : nullptr;
  const float bir = b_ih ? b_ih[j] : 0.0f, biz = b_ih ? b_ih[H + j] : 0.0f,
              bin = b_ih ? b_ih[2 * H + j] : 0.0f;
  const float bhr = b_hh ? b_hh[j] : 0.0f, bhz = b_hh ? b_hh[H + j] : 0.0f,
              bhn = b_hh ? b_hh[2 * H + j] : 0.0f;
  const float r = sigmoidf_(gir[j] + bir + (ghr ? ghr[j] : 0.0f) + bhr);
  const float z = sigmoidf_(gir[H + j] + biz + (ghr ? ghr[H + j] : 0.0f) + bhz);
  const float hn = (ghr ? ghr[2 * H + j] : 0.0f) + bhn;
  const float n = tanhf(gir[2 * H + j] + bin + r * hn);
  const float hp = t > 0 ? y[(row - 1) * size_t(H) + j] : 0.0f;
  y[row * size_t(H) + j] = (1.0f - z) * n + z * hp;
  float* s = saved + row * 4 * size_t(H);
  s[j] = r;
  s[H + j] = z;
  s[2 * H + j] = n;
  s[3 * H + j] = hn;
}

// Step t of the adjoint: from dy_t + the carried dL/dh_t, the gate-input gradients of row (b, t)
// and next = dL/dh_{t-1} through the blend (the W_hh path is added by a GEMM after).
__global__ void gru_gates_backward_kernel(const float* __restrict__ saved,
                                          const float* __restrict__ y, const float* __restrict__ dy,
                                          const float* __restrict__ carry, float* __restrict__ dgi,
                                          float* __restrict__ dgh, float* __restrict__ next, int B,
                                          int L, int H, int t) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * H) return;
  const size_t b = i / size_t(H), j = i - b * size_t(H);
  const size_t row = b * size_t(L) + size_t(t), G = 3 * size_t(H);
  const float* s = saved + row * 4 * size_t(H);
  const float r = s[j], z = s[H + j], n = s[2 * H + j], hn = s[3 * H + j];
  const float hp = t > 0 ? y[(row - 1) * size_t(H) + j] : 0.0f;
  const float dh = dy[row * size_t(H) + j] + carry[i];
  const float dn = dh * (1.0f - z);
  const float dz = dh * (hp - n);
  const float dan = dn * (1.0f - n * n);
  const float dr = dan * hn;
  const float dar = dr * r * (1.0f - r);
  const float daz = dz * z * (1.0f - z);
  float* gi = dgi + row * G;
  float* gh = dgh + row * G;
  gi[j] = dar;
  gi[H + j] = daz;
  gi[2 * H + j] = dan;
  gh[j] = dar;
  gh[H + j] = daz;
  gh[2 * H + j] = dan * r;
  next[i] = dh * z;
}

// hprev[b, t] = h_{t-1} = y[b, t-1], zero at t = 0: what W_hh multiplied at each step.
__global__ void gru_previous_states_kernel(const float* __restrict__ y, float* __restrict__ hprev,
                                           int B, int L, int H) {
  const size_t n = size_t(B) * L * H;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t t = (i / size_t(H)) % size_t(L);
    hprev[i] = t > 0 ? y[i - size_t(H)] : 0.0f;
  }
}

void check_shape(const char* op, int B, int L, int In, int H) {
  if (B < 1 || L < 1 || In < 1 || H < 1)
    throw std::invalid_argument(std::string(op) + ": sizes must be positive (B " +
                                std::to_string(B) + ", L " + std::to_string(L) + ", In " +
                                std::to_string(In) + ", H " + std::to_string(H) + ")");
}

}  // namespace

size_t gru_forward_workspace_bytes(int B, int L, int H) {
  return align_up(size_t(B) * L * 3 * H * sizeof(float)) + size_t(B) * 3 * H * sizeof(float);
}

void gru_forward(const GemmContext& gemm_ctx, const float* x, const float* w_ih, const float* w_hh,
                 const float* b_ih, const float* b_hh, float* y, float* saved, void* workspace,
                 int B, int L, int In, int H, cudaStream_t stream) {
  check_shape("gru_forward", B, L, In, H);
  const int G = 3 * H;
  float* gi = static_cast<float*>(workspace);
  float* gh = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                       align_up(size_t(B) * L * G * sizeof(float)));
  gemm(gemm_ctx, false, true, B * L, G, In, 1.0f, x, In, w_ih, In, 0.0f, gi, G, stream);
  const dim3 grid(ceil_div(size_t(B) * H, kThreads));
  for (int t = 0; t < L; ++t) {
    if (t > 0)
      gemm(gemm_ctx, false, true, B, G, H, 1.0f, y + size_t(t - 1) * H, L * H, w_hh, H, 0.0f, gh, G,
           stream);
    SLIPSTREAM_LAUNCH(gru_gates_forward_kernel, grid, dim3(kThreads), stream, gi,
                      t > 0 ? gh : nullptr, b_ih, b_hh, y, saved, B, L, H, t);
    check_launch("gru_forward");
  }
}

size_t gru_backward_workspace_bytes(int B, int L, int H) {
  const size_t M = size_t(B) * L, G = 3 * size_t(H);
  return 2 * align_up(M * G * sizeof(float)) + align_up(M * H * sizeof(float)) +
         2 * align_up(size_t(B) * H * sizeof(float)) + column_sum_accumulate_workspace_bytes(M, G);
}

void gru_backward(const GemmContext& gemm_ctx, const float* x, const float* w_ih, const float* w_hh,
                  const float* y, const float* saved, const float* dy, float* dx, float* dw_ih,
                  float* dw_hh, float* db_ih, float* db_hh, void* workspace, int B, int L, int In,
                  int H, cudaStream_t stream) {
  check_shape("gru_backward", B, L, In, H);
  const int G = 3 * H;
  const size_t M = size_t(B) * L;
  char* p = static_cast<char*>(workspace);
  auto take = [&p](size_t bytes) {
    char* q = p;
    p += align_up(bytes);
    return reinterpret_cast<float*>(q);
  };
  float* dgi = take(M * G * sizeof(float));
  float* dgh = take(M * G * sizeof(float));
  float* hprev = take(M * H * sizeof(float));
  float* carry = take(size_t(B) * H * sizeof(float));
  float* next = take(size_t(B) * H * sizeof(float));
  void* sums = p;

  const dim3 state_grid(std::min(ceil_div(M * size_t(H), kThreads), 4096u));
  SLIPSTREAM_LAUNCH(gru_previous_states_kernel, state_grid, dim3(kThreads), stream, y, hprev, B, L,
                    H);
  check_launch("gru_backward");
  fill(carry, 0.0f, size_t(B) * H, stream);
  const dim3 grid(ceil_div(size_t(B) * H, kThreads));
  for (int t = L - 1; t >= 0; --t) {
    SLIPSTREAM_LAUNCH(gru_gates_backward_kernel, grid, dim3(kThreads), stream, saved, y, dy, carry,
                      dgi, dgh, next, B, L, H, t);
    check_launch("gru_backward");
    // dL/dh_{t-1} += dgh_t W_hh; nothing flows past t = 0 (the initial state is zero).
    if (t > 0)
      gemm(gemm_ctx, false, false, B, H, G, 1.0f, dgh + size_t(t) * G, L * G, w_hh, H, 1.0f, next,
           H, stream);
    std::swap(carry, next);
  }
  if (dx) gemm(gemm_ctx, false, false, B * L, In, G, 1.0f, dgi, G, w_ih, In, 0.0f, dx, In, stream);
  gemm(gemm_ctx, true, false, G, In, B * L, 1.0f, dgi, G, x, In, 1.0f, dw_ih, In, stream);
  gemm(gemm_ctx, true, false, G, H, B * L, 1.0f, dgh, G, hprev, H, 1.0f, dw_hh, H, stream);
  if (db_ih) column_sum_accumulate(dgi, db_ih, M, size_t(G), sums, stream);
  if (db_hh) column_sum_accumulate(dgh, db_hh, M, size_t(G), sums, stream);
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
