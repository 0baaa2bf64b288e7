// The model ops (the interface of cpu_ops.h's CpuOps<float>) on a CUDA device: the kernels of
// a kernel table (kernels/cuda_kernels.h) enqueued on one stream, GEMMs through cuBLASLt.
// `Kernels` is a CUDA table (kernels::CudaKernels, or a table extending it) in a real run, or its
// emulated twin where the device path runs on the CPU (there, "device" memory is host memory).
//
// Same math as the CPU ops, with two differences the tests allow for: the convolution's SiLU is
// fused (its backward recomputes the pre-activation instead of reading a saved one), and sums
// run in the kernels' fixed orders rather than the CPU's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "kernels/cuda_api.h"
#include "stages/ops/cpu_ops.h"

namespace slipstream::ops {

template <class Kernels>
class DeviceOps {
 public:
  using Scalar = float;
  using Table = Kernels;
  static constexpr KernelBackend kBackend =
      Kernels::kEmulated ? KernelBackend::emulated : KernelBackend::cuda;
  static constexpr int kMaxState = Kernels::kScanMaxState;
  static constexpr bool kSavesConvInput = false;

  // `memory` is where alloc() places buffers: the CUDA device in a real run, the host under the
  // emulator. `gemm` holds the cuBLASLt handle and workspace (empty under the emulator).
  DeviceOps(Device memory, cudaStream_t stream, typename Kernels::GemmContext gemm)
      : memory_(memory), stream_(stream), gemm_(gemm) {}

  Device device() const { return memory_; }
  cudaStream_t stream() const { return stream_; }
  template <class E>
  Tensor alloc(size_t n, const char* what) const {
    const DType dt = sizeof(E) == 2 ? DType::bf16 : sizeof(E) == 1 ? DType::u8 : DType::f32;
    return Tensor::zeros({static_cast<int64_t>(n)}, dt, memory_, what);
  }
  // Sizes left at 0 need nothing (a stage without a scan, a convolution or norms).
  size_t scratch_bytes(const ScratchNeeds& s) const {
    size_t b = 0;
    if (s.state > 0)
      b = Kernels::selective_scan_backward_workspace_bytes(s.B, s.L, s.channels, s.state);
    if (s.conv_width > 0)
      b = std::max(b, Kernels::causal_conv1d_backward_workspace_bytes(s.B, s.L, s.channels,
                                                                      s.conv_width, true));
    if (s.norm_rows > 0 && s.norm_cols > 0)
      b = std::max({b, Kernels::rmsnorm_add_backward_workspace_bytes(s.norm_rows, s.norm_cols),
                    Kernels::column_sum_accumulate_workspace_bytes(s.norm_rows, s.norm_cols)});
    return b;
  }

  void copy(float* dst, const float* src, size_t n) const {
    Kernels::copy_bytes(dst, src, n * sizeof(float), stream_);
  }
  void zero(float* p, size_t n) const { Kernels::fill(p, 0.0f, n, stream_); }
  void column_sum_accumulate(const float* dy, float* db, size_t M, size_t N, void* scratch) const {
    Kernels::column_sum_accumulate(dy, db, M, N, scratch, stream_);
  }
  // The ops whose header declares their methods (kernels/OP.h's third part): the entry point
  // with the same arguments, on this stream.
#define SLIPSTREAM_OP_ON_STREAM(...) (__VA_ARGS__, stream_)
#define SLIPSTREAM_OP(name, params, args)       \
  void name params const {                      \
    Kernels::name SLIPSTREAM_OP_ON_STREAM args; \
  }
#define SLIPSTREAM_OPS_METHODS
#include "kernels/cuda_kernel_list.inc"
#undef SLIPSTREAM_OPS_METHODS
#undef SLIPSTREAM_OP
#undef SLIPSTREAM_OP_ON_STREAM
  void to_bf16(const float* src, uint16_t* dst, size_t n) const {
    Kernels::fp32_to_bf16(src, bf(dst), n, stream_);
  }
  // Two arrays in one launch.
  void to_bf16(const float* a, uint16_t* a_bf, size_t n_a, const float* b, uint16_t* b_bf,
               size_t n_b) const {
    Kernels::fp32_to_bf16_two(a, bf(a_bf), n_a, b, bf(b_bf), n_b, stream_);
  }

  void gemm(bool ta, bool tb, int M, int N, int K, const float* A, const uint16_t* Ab, int lda,
            const float* B, const uint16_t* Bb, int ldb, float beta, float* C, int ldc,
            void*) const {
    if (Ab && Bb)
      Kernels::gemm(gemm_, ta, tb, M, N, K, 1.0f, bf(Ab), lda, bf(Bb), ldb, beta, C, ldc, stream_);
    else
      Kernels::gemm(gemm_, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc, stream_);
  }

  // y_bf (may be null): y rounded to bf16 too, by the norm's own kernel; x_copy (may be null): a
  // copy of x, written as the norm reads it (the residual stream's next layer, without a copy);
  // x_bias (may be null): a row added to x's rows first (and x_copy holds x + x_bias).
  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, size_t M, size_t D,
                       double eps, uint16_t* y_bf = nullptr, float* x_copy = nullptr,
                       const float* x_bias = nullptr) const {
    Kernels::template rmsnorm_add_forward<float>(x, nullptr, w, y, bf(y_bf), x_copy, rstd, M, D,
                                                 float(eps), stream_, x_bias);
  }
  // ds_bf (may be null): ds rounded to bf16 too, by the norm's own kernel; s_bias: the forward's
  // x_bias (s without it).
  void rmsnorm_backward(const float* s, const float* w, const float* rstd, const float* dy,
                        const float* dsum, float* ds, float* dw, size_t M, size_t D, void* scratch,
                        uint16_t* ds_bf = nullptr, const float* s_bias = nullptr) const {
    Kernels::template rmsnorm_add_backward<float>(s, w, rstd, dy, dsum, ds, bf(ds_bf), dw, scratch,
                                                  M, D, stream_, s_bias);
  }

  // u_bf (may be null): u rounded to bf16 too, by the convolution's own kernel. x_ld (0: C): rows
  // of x that far apart (x columns of a wider tensor), in the backward dx's and dx_bf's too.
  // last (may be null): the window's last K - 1 inputs, written by the same kernel.
  void conv_silu_forward(const float* x, const float* prefix, const float* w, const float* b,
                         float* pre, float* u, int B, int L, int C, int K, uint16_t* u_bf = nullptr,
                         int x_ld = 0, float* last = nullptr) const {
    (void)pre;
    Kernels::template causal_conv1d_forward<float>(x, prefix, w, b, u, bf(u_bf), B, L, C, K, true,
                                                   stream_, x_ld, last);
  }
  // dx_bf (may be null): dx rounded to bf16 too, by the convolution's own kernel.
  void conv_silu_backward(const float* x, const float* prefix, const float* w, const float* b,
                          const float* pre, const float* du, float* dpre, float* dx, float* dw,
                          float* db, int B, int L, int C, int K, void* scratch,
                          uint16_t* dx_bf = nullptr, int x_ld = 0) const {
    (void)pre, (void)dpre;
    Kernels::template causal_conv1d_backward<float>(x, prefix, w, b, du, dx, bf(dx_bf), dw, db,
                                                    scratch, B, L, C, K, true, stream_, x_ld);
  }

  size_t gru_workspace_bytes(int B, int L, int In, int H, bool bf16) const {
    return std::max(Kernels::gru_forward_workspace_bytes(B, L, In, H, bf16),
                    Kernels::gru_backward_workspace_bytes(B, L, In, H, bf16));
  }
  void gru_forward(const float* x, const float* w_ih, const float* w_hh, const uint16_t* w_ih_bf,
                   const uint16_t* w_hh_bf, const float* b_ih, const float* b_hh, const float* h0,
                   float* y, float* saved, void* ws, int B, int L, int In, int H) const {
    Kernels::gru_forward(gemm_, x, w_ih, w_hh, bf(w_ih_bf), bf(w_hh_bf), b_ih, b_hh, h0, y, saved,
                         ws, B, L, In, H, stream_);
  }
  void gru_backward(const float* x, const float* w_ih, const float* w_hh, const uint16_t* w_ih_bf,
                    const uint16_t* w_hh_bf, const float* h0, const float* y, const float* saved,
                    const float* dy, float* dx, float* dw_ih, float* dw_hh, float* db_ih,
                    float* db_hh, void* ws, int B, int L, int In, int H) const {
    Kernels::gru_backward(gemm_, x, w_ih, w_hh, bf(w_ih_bf), bf(w_hh_bf), h0, y, saved, dy, dx,
                          dw_ih, dw_hh, db_ih, db_hh, ws, B, L, In, H, stream_);
  }

  // A Mamba stack's frame in one launch (kernels/mamba_frame.h), where the table's switch is on
  // and the model fits the kernel.
  using MambaFrame = typename Kernels::MambaFrame;
  bool takes_mamba_frame(const MambaFrame& m) const {
    return Kernels::mamba_frame_fused() && Kernels::mamba_frame_fits(m);
  }
  void mamba_frame_forward(const MambaFrame& m, const float* x, const float* w, const uint16_t* wb,
                           const float* conv_in, float* conv_out, const float* scan_in,
                           float* scan_out, float* y, uint16_t* y_bf) const {
    Kernels::mamba_frame_forward(m, x, w, bf(wb), conv_in, conv_out, scan_in, scan_out, y, bf(y_bf),
                                 stream_);
  }

  // Elements of the scan states a training forward keeps for its backward (the start of each of
  // the backward's chunks), or 0 where the backward finds them itself (the kernel table's
  // scan_forward_keeps_states).
  size_t scan_chunk_states_elems(int B, int L, int Dc, int N) const {
    if (!Kernels::scan_forward_keeps_states()) return 0;
    return Kernels::selective_scan_chunk_states_bytes(B, L, Dc, N) / sizeof(float);
  }
  void selective_scan_forward(const float* u, const float* delta, const float* A, const float* Bm,
                              const float* Cm, const float* D, const float* z,
                              const float* delta_bias, const float* initial_state, float* out,
                              float* last_state, float* chunk_states, int B, int L, int Dc, int N,
                              uint16_t* out_bf = nullptr, int ldbc = 0, int z_ld = 0,
                              bool a_log = false, const float* dt = nullptr,
                              const float* dt_w = nullptr, int dt_rank = 0) const {
    Kernels::template selective_scan_forward<float>(
        u, delta, A, Bm, Cm, D, z, delta_bias, true, initial_state, out, bf(out_bf), last_state,
        chunk_states, B, L, Dc, N, stream_, ldbc, z_ld, a_log, dt, dt_w, dt_rank);
  }
  void selective_scan_backward(const float* u, const float* delta, const float* A, const float* Bm,
                               const float* Cm, const float* D, const float* z,
                               const float* delta_bias, const float* initial_state,
                               const float* chunk_states, const float* dout, float* du,
                               float* ddelta, float* dA, float* dBm, float* dCm, float* dD,
                               float* dz, float* ddelta_bias, void* scratch, int B, int L, int Dc,
                               int N, uint16_t* ddelta_bf = nullptr, uint16_t* dz_bf = nullptr,
                               int ldbc = 0, bool a_log = false, int z_ld = 0) const {
    Kernels::template selective_scan_backward<float>(
        u, delta, A, Bm, Cm, D, z, delta_bias, true, initial_state, chunk_states, dout, du, ddelta,
        dA, dBm, dCm, dD, dz, ddelta_bias, bf(ddelta_bf), bf(dz_bf), scratch, B, L, Dc, N, stream_,
        ldbc, a_log, z_ld);
  }

 private:
  static kernels::bfloat16* bf(uint16_t* p) {
    return reinterpret_cast<kernels::bfloat16*>(p);
  }
  static const kernels::bfloat16* bf(const uint16_t* p) {
    return reinterpret_cast<const kernels::bfloat16*>(p);
  }

  Device memory_;
  cudaStream_t stream_;
  typename Kernels::GemmContext gemm_;
};

}  // namespace slipstream::ops
