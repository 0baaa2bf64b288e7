// The operations the model math (mamba_model.h) is written against, for the CPU: the kernels/
// references on host memory, T = float (the stage) or double (the gradient-check tests). The
// device form with the same interface is DeviceOps (device_ops.h); a model is a template over
// its ops, and the stage picks the ops by the run's device, once, in setup.
//
// Every op is enqueued in call order on one stream (here: run at once); pointers come from
// alloc(). bf16 copies are uint16_t storage (kernels/bf16.h). `scratch` is a buffer of
// scratch_bytes() the model hands to the ops that need one; no two ops hold it at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "kernels/activations.h"
#include "kernels/bf16.h"
#include "kernels/cuda_kernel_list.inc"  // every registered op's reference

namespace slipstream::ops {

// The sizes an ops' scratch must cover: every product (M rows, in -> out) and the sequence ops.
struct ScratchNeeds {
  size_t gemm_ws_elems = 0;  // max over GEMMs of gemm_bf16_workspace_elems
  int B = 0, L = 0, channels = 0, state = 0, conv_width = 0;
  size_t norm_rows = 0, norm_cols = 0;  // the widest RMSNorm / bias gradient
};

template <class T>
class CpuOps {
 public:
  using Scalar = T;
  static constexpr KernelBackend kBackend = KernelBackend::cpu;
  static constexpr int kMaxState = kernels::kScanMaxState;
  static constexpr bool kSavesConvInput = true;  // conv_silu keeps its pre-activation

  Device device() const { return Device::cpu(); }
  template <class E>
  Tensor alloc(size_t n, const char* what) const {
    return Tensor::zeros({static_cast<int64_t>(n)}, dtype_of<E>(), Device::cpu(), what);
  }
  size_t scratch_bytes(const ScratchNeeds& s) const {
    const size_t scan =
        kernels::selective_scan_backward_workspace_elems(s.B, s.L, s.channels, s.state) * sizeof(T);
    return std::max(scan, s.gemm_ws_elems * sizeof(float));
  }

  void copy(T* dst, const T* src, size_t n) const { std::memcpy(dst, src, n * sizeof(T)); }
  void zero(T* p, size_t n) const { std::fill(p, p + n, T(0)); }
  void column_sum_accumulate(const T* dy, T* db, size_t M, size_t N, void*) const {
    kernels::column_sum_accumulate(dy, db, M, N);
  }
  // The ops whose header declares their methods (kernels/OP.h's third part): the reference.
#define SLIPSTREAM_OP(name, params, args) \
  void name params const {                \
    kernels::name args;                   \
  }
#define SLIPSTREAM_OPS_METHODS
#include "kernels/cuda_kernel_list.inc"
#undef SLIPSTREAM_OPS_METHODS
#undef SLIPSTREAM_OP
  void to_bf16(const T* src, uint16_t* dst, size_t n) const {
    if constexpr (std::is_same_v<T, float>) kernels::fp32_to_bf16(src, dst, n);
  }
  // Two arrays (one launch on a device).
  void to_bf16(const T* a, uint16_t* a_bf, size_t n_a, const T* b, uint16_t* b_bf,
               size_t n_b) const {
    to_bf16(a, a_bf, n_a);
    to_bf16(b, b_bf, n_b);
  }

  // C = op(A) op(B) + beta C; the bf16 product (fp32 accumulate) when both copies are given.
  void gemm(bool ta, bool tb, int M, int N, int K, const T* A, const uint16_t* Ab, int lda,
            const T* B, const uint16_t* Bb, int ldb, T beta, T* C, int ldc, void* scratch) const {
    if constexpr (std::is_same_v<T, float>) {
      if (Ab && Bb) {
        kernels::gemm_bf16(ta, tb, M, N, K, 1.0f, Ab, lda, Bb, ldb, beta, C, ldc,
                           static_cast<float*>(scratch));
        return;
      }
    }
    kernels::gemm<T>(ta, tb, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
  }

  // y_bf (may be null): y rounded to bf16 too; x_copy (may be null): a copy of x; x_bias (may be
  // null): a row added to x's rows first (x_copy then holds x + x_bias). The model adds its bias
  // itself on the CPU (this form allocates); the backward's s_bias is the forward's x_bias.
  void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, size_t M, size_t D, double eps,
                       uint16_t* y_bf = nullptr, T* x_copy = nullptr,
                       const T* x_bias = nullptr) const {
    std::vector<T> xb;
    if (x_bias) x = biased(x, x_bias, M, D, xb);
    kernels::rmsnorm_add_forward<T>(x, nullptr, w, y, x_copy, rstd, M, D, T(eps));
    if (y_bf) to_bf16(y, y_bf, M * D);
  }
  // ds = RMSNorm'(dy) + dsum (dsum may be null; ds may alias dsum); dw +=. ds_bf (may be
  // null): ds rounded to bf16 too.
  void rmsnorm_backward(const T* s, const T* w, const T* rstd, const T* dy, const T* dsum, T* ds,
                        T* dw, size_t M, size_t D, void*, uint16_t* ds_bf = nullptr,
                        const T* s_bias = nullptr) const {
    std::vector<T> sb;
    if (s_bias) s = biased(s, s_bias, M, D, sb);
    kernels::rmsnorm_add_backward<T>(s, w, rstd, dy, dsum, ds, dw, M, D);
    if (ds_bf) to_bf16(ds, ds_bf, M * D);
  }

  // u = SiLU(conv(x) + b); `pre` receives conv(x) + b for the backward.
  // u_bf (may be null): u rounded to bf16 too. x_ld (0: C): x's rows that far apart (and, in the
  // backward, dx's and dx_bf's). last (may be null): the window's last K - 1 inputs, the next
  // window's prefix (kernels/causal_conv1d.h).
  void conv_silu_forward(const T* x, const T* prefix, const T* w, const T* b, T* pre, T* u, int B,
                         int L, int C, int K, uint16_t* u_bf = nullptr, int x_ld = 0,
                         T* last = nullptr) const {
    std::vector<T> xc;
    x = rows_of(x, B * L, C, x_ld, xc);
    kernels::causal_conv1d_forward(x, prefix, w, b, pre, B, L, C, K, last);
    kernels::silu_forward(pre, u, static_cast<size_t>(B) * L * C);
    if (u_bf) to_bf16(u, u_bf, static_cast<size_t>(B) * L * C);
  }
  // dx (=), dw and db (+=) from du; `dpre` is (B, L, C) scratch. dx_bf (may be null): dx
  // rounded to bf16 too.
  void conv_silu_backward(const T* x, const T* prefix, const T* w, const T* b, const T* pre,
                          const T* du, T* dpre, T* dx, T* dw, T* db, int B, int L, int C, int K,
                          void*, uint16_t* dx_bf = nullptr, int x_ld = 0) const {
    (void)b;
    const size_t n = static_cast<size_t>(B) * L * C;
    std::vector<T> xc, dxc;
    x = rows_of(x, B * L, C, x_ld, xc);
    const bool apart = x_ld != 0 && x_ld != C;
    if (apart) dxc.resize(n);
    T* d = apart ? dxc.data() : dx;
    kernels::silu_backward(pre, du, dpre, n);
    kernels::causal_conv1d_backward(x, prefix, w, dpre, d, dw, db, B, L, C, K);
    if (!apart) {
      if (dx_bf) to_bf16(dx, dx_bf, n);
      return;
    }
    to_rows(d, B * L, C, dx, x_ld);
    if (dx_bf) to_bf16_rows(d, B * L, C, dx_bf, x_ld);
  }

  // One GRU layer from h0 (B, H) or, null, a zero state (kernels/gru.h): y (B, L, H), saved
  // (B, L, 4H) for the backward; dx (=, may be null), weight and bias gradients (+=); h0 is a
  // constant to the backward (no dh0). w_ih_bf, w_hh_bf: the weights' bf16 copies for the bf16
  // form (both null: FP32). The workspace, of gru_workspace_bytes for the form, serves forward
  // and backward.
  size_t gru_workspace_bytes(int B, int L, int In, int H, bool bf16) const {
    return gru_fp32_bytes(B, L, H) + (bf16 ? kernels::gru_bf16_workspace_bytes(B, L, In, H) : 0);
  }
  void gru_forward(const T* x, const T* w_ih, const T* w_hh, const uint16_t* w_ih_bf,
                   const uint16_t* w_hh_bf, const T* b_ih, const T* b_hh, const T* h0, T* y,
                   T* saved, void* ws, int B, int L, int In, int H) const {
    const kernels::GruBf16 bf = bf16_form(w_ih_bf, w_hh_bf, ws, B, L, H);
    kernels::gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, y, saved, static_cast<T*>(ws), B, L, In, H,
                         w_ih_bf ? &bf : nullptr);
  }
  void gru_backward(const T* x, const T* w_ih, const T* w_hh, const uint16_t* w_ih_bf,
                    const uint16_t* w_hh_bf, const T* h0, const T* y, const T* saved, const T* dy,
                    T* dx, T* dw_ih, T* dw_hh, T* db_ih, T* db_hh, void* ws, int B, int L, int In,
                    int H) const {
    const kernels::GruBf16 bf = bf16_form(w_ih_bf, w_hh_bf, ws, B, L, H);
    kernels::gru_backward(x, h0, w_ih, w_hh, y, saved, dy, static_cast<const T*>(nullptr), dx,
                          static_cast<T*>(nullptr), dw_ih, dw_hh, db_ih, db_hh, static_cast<T*>(ws),
                          B, L, In, H, w_ih_bf ? &bf : nullptr);
  }

  // The CPU backward recomputes its states into the scratch: the forward keeps none for it.
  size_t scan_chunk_states_elems(int, int, int, int) const {
    return 0;
  }
  // With a_log, A holds A_log and A = −exp(A_log) is made here (a vector a call: the model makes
  // A itself on the CPU, whose steady state allocates nothing); in the backward dA is then
  // A_log's gradient (the sum times A). With dt_w, Δ is made here from its low-rank form (dt's
  // rows ldbc apart, dt_w (Dc, dt_rank)), as the device kernel makes it: the reference of that.
  void selective_scan_forward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                              const T* D, const T* z, const T* delta_bias, const T* initial_state,
                              T* out, T* last_state, T* /*chunk_states*/, int B, int L, int Dc,
                              int N, uint16_t* out_bf = nullptr, int ldbc = 0, int z_ld = 0,
                              bool a_log = false, const T* dt = nullptr, const T* dt_w = nullptr,
                              int dt_rank = 0) const {
    std::vector<T> bc, zc, a, made;
    if (a_log) A = a_of_log(A, Dc, N, a);
    if (dt_w) {
      const size_t M = static_cast<size_t>(B) * L, ld = static_cast<size_t>(ldbc ? ldbc : N);
      made.assign(M * static_cast<size_t>(Dc), T(0));
      for (size_t m = 0; m < M; ++m)
        for (size_t d = 0; d < static_cast<size_t>(Dc); ++d) {
          T acc = 0;
          for (int r = 0; r < dt_rank; ++r)
            acc += dt[m * ld + static_cast<size_t>(r)] * dt_w[d * static_cast<size_t>(dt_rank) + r];
          made[m * static_cast<size_t>(Dc) + d] = acc;
        }
      delta = made.data();
    }
    const T* Bc = rows_of(Bm, B * L, N, ldbc, bc);
    const T* Cc = rows_of(Cm, B * L, N, ldbc, bc);
    if (z) z = rows_of(z, B * L, Dc, z_ld, zc);
    kernels::selective_scan_forward(u, delta, A, Bc, Cc, D, z, delta_bias, true, initial_state, out,
                                    last_state, B, L, Dc, N);
    if (out_bf) to_bf16(out, out_bf, static_cast<size_t>(B) * L * Dc);
  }
  void selective_scan_backward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                               const T* D, const T* z, const T* delta_bias, const T* initial_state,
                               const T* /*chunk_states*/, const T* dout, T* du, T* ddelta, T* dA,
                               T* dBm, T* dCm, T* dD, T* dz, T* ddelta_bias, void* scratch, int B,
                               int L, int Dc, int N, uint16_t* ddelta_bf = nullptr,
                               uint16_t* dz_bf = nullptr, int ldbc = 0, bool a_log = false,
                               int z_ld = 0) const {
    std::vector<T> bc, dbc, dA_sum, zc, dzc, a;
    if (a_log) A = a_of_log(A, Dc, N, a);
    const bool z_apart = z && z_ld != 0 && z_ld != Dc;
    if (z) z = rows_of(z, B * L, Dc, z_ld, zc);
    if (z_apart && dz) dzc.resize(static_cast<size_t>(B) * L * Dc);
    T* const dz_out = dz;
    if (z_apart && dz) dz = dzc.data();
    // a_log: the sum first, then times A (the chain rule of A = −exp(A_log)).
    if (a_log && dA) dA_sum.assign(static_cast<size_t>(Dc) * N, T(0));
    const T* Bc = rows_of(Bm, B * L, N, ldbc, bc);
    const T* Cc = rows_of(Cm, B * L, N, ldbc, bc);
    const bool apart = ldbc != 0 && ldbc != N;
    const size_t bln = static_cast<size_t>(B) * L * N;
    if (apart) dbc.resize(2 * bln);
    kernels::selective_scan_backward(u, delta, A, Bc, Cc, D, z, delta_bias, true, initial_state,
                                     dout, du, ddelta, dA_sum.empty() ? dA : dA_sum.data(),
                                     apart ? dbc.data() : dBm, apart ? dbc.data() + bln : dCm, dD,
                                     dz, ddelta_bias, static_cast<T*>(scratch), B, L, Dc, N);
    for (size_t i = 0; i < dA_sum.size(); ++i) dA[i] += dA_sum[i] * A[i];
    for (size_t r = 0; apart && r < static_cast<size_t>(B) * L; ++r) {  // into the wider rows
      std::copy_n(dbc.data() + r * N, N, dBm + r * ldbc);
      std::copy_n(dbc.data() + bln + r * N, N, dCm + r * ldbc);
    }
    const size_t n = static_cast<size_t>(B) * L * Dc;
    if (ddelta_bf) to_bf16(ddelta, ddelta_bf, n);
    if (z_apart && dz) {  // into the wider rows
      to_rows(dz, B * L, Dc, dz_out, z_ld);
      if (dz_bf) to_bf16_rows(dz, B * L, Dc, dz_bf, z_ld);
      return;
    }
    if (dz_bf && dz) to_bf16(dz, dz_bf, n);
  }

 private:
  // Rows of N (Bm or Cm, z, x) from rows `ld` apart (0: N, as they are): gathered into `buf`
  // (appended, reserved for two first, so the first's pointer stays) when they are apart (the
  // backward scatters their gradients back the same way). The model passes them apart on a device
  // only (the CPU's steady state allocates nothing); this keeps the CPU's contract the same.
  // x (M, D) plus a bias row, into buf.
  static const T* biased(const T* x, const T* bias, size_t M, size_t D, std::vector<T>& buf) {
    buf.assign(x, x + M * D);
    kernels::add_bias_rows(buf.data(), bias, M, D);
    return buf.data();
  }
  // (rows, N) into rows `ld` apart, and the same rounded to bf16: the way back.
  static void to_rows(const T* src, int rows, int N, T* dst, int ld) {
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r)
      std::copy_n(src + r * N, N, dst + r * static_cast<size_t>(ld));
  }
  void to_bf16_rows(const T* src, int rows, int N, uint16_t* dst, int ld) const {
    for (size_t r = 0; r < static_cast<size_t>(rows); ++r)
      to_bf16(src + r * N, dst + r * static_cast<size_t>(ld), static_cast<size_t>(N));
  }
  // A = −exp(A_log) (D, N) into buf.
  static const T* a_of_log(const T* a_log, int D, int N, std::vector<T>& buf) {
    const size_t n = static_cast<size_t>(D) * N;
    buf.resize(n);
    kernels::neg_exp(a_log, n, buf.data(), 1, n);
    return buf.data();
  }
  static const T* rows_of(const T* p, int rows, int N, int ld, std::vector<T>& buf) {
    if (ld == 0 || ld == N) return p;
    const size_t n = static_cast<size_t>(rows) * N;
    if (buf.capacity() < 2 * n) buf.reserve(2 * n);
    const size_t at = buf.size();
    for (int r = 0; r < rows; ++r)
      buf.insert(buf.end(), p + static_cast<size_t>(r) * ld, p + static_cast<size_t>(r) * ld + N);
    return buf.data() + at;
  }
  // The FP32 workspace of a layer (forward or backward), rounded up so the bf16 form's part
  // after it starts aligned.
  static size_t gru_fp32_bytes(int B, int L, int H) {
    const size_t elems = std::max(kernels::gru_forward_workspace_elems(B, L, H),
                                  kernels::gru_backward_workspace_elems(B, L, H));
    return (elems * sizeof(T) + 63) / 64 * 64;
  }
  static kernels::GruBf16 bf16_form(const uint16_t* w_ih_bf, const uint16_t* w_hh_bf, void* ws,
                                    int B, int L, int H) {
    return {w_ih_bf, w_hh_bf, static_cast<char*>(ws) + gru_fp32_bytes(B, L, H)};
  }

  template <class E>
  static DType dtype_of() {
    if constexpr (std::is_same_v<E, double>) return DType::f64;
    if constexpr (std::is_same_v<E, uint16_t>) return DType::bf16;
    if constexpr (std::is_same_v<E, uint8_t>) return DType::u8;
    return DType::f32;
  }
};

}  // namespace slipstream::ops
