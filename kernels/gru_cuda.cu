// One GRU layer on CUDA: the math of kernels/gru_cpu.cpp (PyTorch nn.GRU's gates r, z, n; from a
// given or a zero initial state), against which it is tested. The recurrence is sequential in time,
// so each step is a cuBLASLt GEMM of the previous state and one element-wise gate kernel (thread
// per (batch row, unit)); the projections that do not depend on the recurrence are single GEMMs
// over every step. No atomics: the bias gradients are column sums in a fixed order. The bf16 form
// (gru.h) rounds each GEMM's activation operand where it is written: the gate kernels write the
// rounded state and gate-input gradients beside the FP32 ones, so no extra pass reads them again.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
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

// Step t: gi = x W_ih^T (row (b, t)), gh = h_{t-1} W_hh^T (row b; null when h_{t-1} is zero:
// t = 0 without h0).
// y_bf (the bf16 form, else null) gets h_t rounded, what the next step's GEMM multiplies.
__global__ void gru_gates_forward_kernel(const float* __restrict__ gi, const float* __restrict__ gh,
                                         const float* __restrict__ b_ih,
                                         const float* __restrict__ b_hh,
                                         const float* __restrict__ h0, float* __restrict__ y,
                                         uint16_t* __restrict__ y_bf, float* __restrict__ saved,
                                         int B, int L, int H, int t) {
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
  const float hp = t > 0 ? y[(row - 1) * size_t(H) + j] : h0 ? h0[i] : 0.0f;
  const float h = (1.0f - z) * n + z * hp;
  y[row * size_t(H) + j] = h;
  if (y_bf) y_bf[row * size_t(H) + j] = fp32_to_bf16_bits(h);
  float* s = saved + row * 4 * size_t(H);
  s[j] = r;
  s[H + j] = z;
  s[2 * H + j] = n;
  s[3 * H + j] = hn;
}

// Step t of the adjoint: from dy_t + the carried dL/dh_t, the gate-input gradients of row (b, t)
// and next = dL/dh_{t-1} through the blend (the W_hh path is added by a GEMM after). dgi_bf and
// dgh_bf (the bf16 form, else null) get the gradients rounded.
__global__ void gru_gates_backward_kernel(const float* __restrict__ saved,
                                          const float* __restrict__ h0, const float* __restrict__ y,
                                          const float* __restrict__ dy,
                                          const float* __restrict__ carry, float* __restrict__ dgi,
                                          float* __restrict__ dgh, uint16_t* __restrict__ dgi_bf,
                                          uint16_t* __restrict__ dgh_bf, float* __restrict__ next,
                                          int B, int L, int H, int t) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * H) return;
  const size_t b = i / size_t(H), j = i - b * size_t(H);
  const size_t row = b * size_t(L) + size_t(t), G = 3 * size_t(H);
  const float* s = saved + row * 4 * size_t(H);
  const float r = s[j], z = s[H + j], n = s[2 * H + j], hn = s[3 * H + j];
  const float hp = t > 0 ? y[(row - 1) * size_t(H) + j] : h0 ? h0[i] : 0.0f;
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
  if (dgi_bf) {
    uint16_t* gib = dgi_bf + row * G;
    uint16_t* ghb = dgh_bf + row * G;
    gib[j] = ghb[j] = fp32_to_bf16_bits(dar);
    gib[H + j] = ghb[H + j] = fp32_to_bf16_bits(daz);
    gib[2 * H + j] = fp32_to_bf16_bits(dan);
    ghb[2 * H + j] = fp32_to_bf16_bits(dan * r);
  }
  next[i] = dh * z;
}

// hprev[b, t] = h_{t-1} = y[b, t-1], h0[b] (or zero) at t = 0: what W_hh multiplied at each
// step, in FP32 or (the bf16 form) rounded.
template <class Out>
__global__ void gru_previous_states_kernel(const float* __restrict__ h0,
                                           const float* __restrict__ y, Out* __restrict__ hprev,
                                           int B, int L, int H) {
  const size_t n = size_t(B) * L * H;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t t = (i / size_t(H)) % size_t(L);
    const size_t b = i / (size_t(H) * L), j = i % size_t(H);
    const float h = t > 0 ? y[i - size_t(H)] : h0 ? h0[b * size_t(H) + j] : 0.0f;
    if constexpr (std::is_same_v<Out, uint16_t>) {
      hprev[i] = fp32_to_bf16_bits(h);
    } else {
      hprev[i] = h;
    }
  }
}

void check_shape(const char* op, int B, int L, int In, int H) {
  if (B < 1 || L < 1 || In < 1 || H < 1)
    throw std::invalid_argument(std::string(op) + ": sizes must be positive (B " +
                                std::to_string(B) + ", L " + std::to_string(L) + ", In " +
                                std::to_string(In) + ", H " + std::to_string(H) + ")");
}

void check_bf16_form(const char* op, const bfloat16* w_ih_bf, const bfloat16* w_hh_bf) {
  if ((w_ih_bf == nullptr) != (w_hh_bf == nullptr))
    throw std::invalid_argument(std::string(op) +
                                ": the bf16 form needs both weight copies (w_ih_bf, w_hh_bf)");
}

// Hands out 256-byte aligned pieces of a workspace in order; from a null base it only sizes one
// (offsets, no pointer arithmetic on null).
class WorkspaceCursor {
 public:
  explicit WorkspaceCursor(void* base) : base_(static_cast<char*>(base)) {}
  template <class E>
  E* take(size_t n) {
    E* p = at<E>();
    used_ += align_up(n * sizeof(E));
    return p;
  }
  template <class E = void>
  E* at() const {
    return base_ ? reinterpret_cast<E*>(base_ + used_) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// Forward workspace: gi (B, L, 3H), gh (B, 3H); the bf16 form adds x, every state and the
// initial state rounded.
struct ForwardSpace {
  float *gi, *gh;
  uint16_t *x_bf = nullptr, *y_bf = nullptr, *h0_bf = nullptr;
  size_t bytes;
  ForwardSpace(void* base, int B, int L, int In, int H, bool bf16) {
    const size_t M = size_t(B) * L, G = 3 * size_t(H);
    WorkspaceCursor c(base);
    gi = c.take<float>(M * G);
    gh = c.take<float>(size_t(B) * G);
    if (bf16) {
      x_bf = c.take<uint16_t>(M * size_t(In));
      y_bf = c.take<uint16_t>(M * size_t(H));
      h0_bf = c.take<uint16_t>(size_t(B) * H);
    }
    bytes = c.used();
  }
};

}  // namespace

size_t Kernels::gru_forward_workspace_bytes(int B, int L, int In, int H, bool bf16) {
  return ForwardSpace(nullptr, B, L, In, H, bf16).bytes;
}

void Kernels::gru_forward(const GemmContext& gemm_ctx, const float* x, const float* w_ih,
                          const float* w_hh, const bfloat16* w_ih_bf, const bfloat16* w_hh_bf,
                          const float* b_ih, const float* b_hh, const float* h0, float* y,
                          float* saved, void* workspace, int B, int L, int In, int H,
                          cudaStream_t stream) {
  check_shape("gru_forward", B, L, In, H);
  check_bf16_form("gru_forward", w_ih_bf, w_hh_bf);
  const int G = 3 * H;
  const bool bf16 = w_ih_bf != nullptr;
  const ForwardSpace ws(workspace, B, L, In, H, bf16);
  auto bf = [](const uint16_t* p) { return reinterpret_cast<const bfloat16*>(p); };
  if (bf16) {
    fp32_to_bf16(x, reinterpret_cast<bfloat16*>(ws.x_bf), size_t(B) * L * In, stream);
    gemm(gemm_ctx, false, true, B * L, G, In, 1.0f, bf(ws.x_bf), In, w_ih_bf, In, 0.0f, ws.gi, G,
         stream);
    if (h0) fp32_to_bf16(h0, reinterpret_cast<bfloat16*>(ws.h0_bf), size_t(B) * H, stream);
  } else {
    gemm(gemm_ctx, false, true, B * L, G, In, 1.0f, x, In, w_ih, In, 0.0f, ws.gi, G, stream);
  }
  const dim3 grid(ceil_div(size_t(B) * H, kThreads));
  for (int t = 0; t < L; ++t) {
    // h_{t-1}: the previous step's output, h0 at t = 0 (ld H), or nothing (zero).
    const bool recurrent = t > 0 || h0;
    const int ldh = t > 0 ? L * H : H;
    if (recurrent && bf16)
      gemm(gemm_ctx, false, true, B, G, H, 1.0f, bf(t > 0 ? ws.y_bf + size_t(t - 1) * H : ws.h0_bf),
           ldh, w_hh_bf, H, 0.0f, ws.gh, G, stream);
    else if (recurrent)
      gemm(gemm_ctx, false, true, B, G, H, 1.0f, t > 0 ? y + size_t(t - 1) * H : h0, ldh, w_hh, H,
           0.0f, ws.gh, G, stream);
    SLIPSTREAM_LAUNCH(gru_gates_forward_kernel, grid, dim3(kThreads), stream, ws.gi,
                      recurrent ? ws.gh : nullptr, b_ih, b_hh, h0, y, ws.y_bf, saved, B, L, H, t);
    check_launch("gru_forward");
  }
}

namespace {
// Backward workspace: dgi, dgh (B, L, 3H), hprev (B, L, H), carry and next (B, H), the column
// sums' partials; the bf16 form adds x, hprev (instead of the FP32 one), dgi and dgh rounded.
struct BackwardSpace {
  float *dgi, *dgh, *hprev = nullptr, *carry, *next;
  uint16_t *x_bf = nullptr, *hprev_bf = nullptr, *dgi_bf = nullptr, *dgh_bf = nullptr;
  void* sums;
  size_t bytes;
  BackwardSpace(void* base, int B, int L, int In, int H, bool bf16) {
    const size_t M = size_t(B) * L, G = 3 * size_t(H);
    WorkspaceCursor c(base);
    dgi = c.take<float>(M * G);
    dgh = c.take<float>(M * G);
    if (bf16) {
      x_bf = c.take<uint16_t>(M * size_t(In));
      hprev_bf = c.take<uint16_t>(M * size_t(H));
      dgi_bf = c.take<uint16_t>(M * G);
      dgh_bf = c.take<uint16_t>(M * G);
    } else {
      hprev = c.take<float>(M * size_t(H));
    }
    carry = c.take<float>(size_t(B) * H);
    next = c.take<float>(size_t(B) * H);
    sums = c.at();
    bytes = c.used() + Kernels::column_sum_accumulate_workspace_bytes(M, G);
  }
};
}  // namespace

size_t Kernels::gru_backward_workspace_bytes(int B, int L, int In, int H, bool bf16) {
  return BackwardSpace(nullptr, B, L, In, H, bf16).bytes;
}

void Kernels::gru_backward(const GemmContext& gemm_ctx, const float* x, const float* w_ih,
                           const float* w_hh, const bfloat16* w_ih_bf, const bfloat16* w_hh_bf,
                           const float* h0, const float* y, const float* saved, const float* dy,
                           float* dx, float* dw_ih, float* dw_hh, float* db_ih, float* db_hh,
                           void* workspace, int B, int L, int In, int H, cudaStream_t stream) {
  check_shape("gru_backward", B, L, In, H);
  check_bf16_form("gru_backward", w_ih_bf, w_hh_bf);
  const int G = 3 * H;
  const size_t M = size_t(B) * L;
  const bool bf16 = w_ih_bf != nullptr;
  BackwardSpace ws(workspace, B, L, In, H, bf16);
  auto bf = [](const uint16_t* p) { return reinterpret_cast<const bfloat16*>(p); };

  const dim3 state_grid(std::min(ceil_div(M * size_t(H), kThreads), 4096u));
  if (bf16)
    SLIPSTREAM_LAUNCH(gru_previous_states_kernel<uint16_t>, state_grid, dim3(kThreads), stream, h0,
                      y, ws.hprev_bf, B, L, H);
  else
    SLIPSTREAM_LAUNCH(gru_previous_states_kernel<float>, state_grid, dim3(kThreads), stream, h0, y,
                      ws.hprev, B, L, H);
  check_launch("gru_backward");
  float *carry = ws.carry, *next = ws.next;
  fill(carry, 0.0f, size_t(B) * H, stream);
  const dim3 grid(ceil_div(size_t(B) * H, kThreads));
  for (int t = L - 1; t >= 0; --t) {
    SLIPSTREAM_LAUNCH(gru_gates_backward_kernel, grid, dim3(kThreads), stream, saved, h0, y, dy,
                      carry, ws.dgi, ws.dgh, ws.dgi_bf, ws.dgh_bf, next, B, L, H, t);
    check_launch("gru_backward");
    // dL/dh_{t-1} += dgh_t W_hh; nothing flows past t = 0 (the initial state is a constant).
    if (t > 0 && bf16)
      gemm(gemm_ctx, false, false, B, H, G, 1.0f, bf(ws.dgh_bf + size_t(t) * G), L * G, w_hh_bf, H,
           1.0f, next, H, stream);
    else if (t > 0)
      gemm(gemm_ctx, false, false, B, H, G, 1.0f, ws.dgh + size_t(t) * G, L * G, w_hh, H, 1.0f,
           next, H, stream);
    std::swap(carry, next);
  }
  if (bf16) {
    fp32_to_bf16(x, reinterpret_cast<bfloat16*>(ws.x_bf), M * size_t(In), stream);
    if (dx)
      gemm(gemm_ctx, false, false, B * L, In, G, 1.0f, bf(ws.dgi_bf), G, w_ih_bf, In, 0.0f, dx, In,
           stream);
    gemm(gemm_ctx, true, false, G, In, B * L, 1.0f, bf(ws.dgi_bf), G, bf(ws.x_bf), In, 1.0f, dw_ih,
         In, stream);
    gemm(gemm_ctx, true, false, G, H, B * L, 1.0f, bf(ws.dgh_bf), G, bf(ws.hprev_bf), H, 1.0f,
         dw_hh, H, stream);
  } else {
    if (dx)
      gemm(gemm_ctx, false, false, B * L, In, G, 1.0f, ws.dgi, G, w_ih, In, 0.0f, dx, In, stream);
    gemm(gemm_ctx, true, false, G, In, B * L, 1.0f, ws.dgi, G, x, In, 1.0f, dw_ih, In, stream);
    gemm(gemm_ctx, true, false, G, H, B * L, 1.0f, ws.dgh, G, ws.hprev, H, 1.0f, dw_hh, H, stream);
  }
  if (db_ih) column_sum_accumulate(ws.dgi, db_ih, M, size_t(G), ws.sums, stream);
  if (db_hh) column_sum_accumulate(ws.dgh, db_hh, M, size_t(G), ws.sums, stream);
}

}  // namespace slipstream::kernels::SLIPSTREAM_KERNEL_NS
