// Single-layer GRU over a sequence, PyTorch nn.GRU semantics (batch_first) and weight layout:
//   r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
//   z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
//   n  = tanh(W_in x + b_in + r * (W_hn h + b_hn))
//   h' = (1 - z) * n + z * h
// x (B, L, In); h0 (B, H) or null for zeros; w_ih (3H, In) and w_hh (3H, H) with gate blocks in
// the order r, z, n; b_ih, b_hh (3H) or null. Output y (B, L, H) holds every h_t; the final
// state is y[:, L-1, :].
//
// Declared once for both builds: the CPU reference below, and the CUDA entry points in the
// second part, which kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels
// and kernels::cuda_emulated::Kernels) as static members.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_GRU_H
#define SLIPSTREAM_KERNELS_GRU_H

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_api.h"
#include "kernels/gemm.h"

namespace slipstream::kernels {

// Saved activations for the backward: r, z, n and hn = W_hn h + b_hn per step, (B, L, 4H).
size_t gru_saved_elems(int B, int L, int H);
// Forward scratch: the input projection of all steps (B, L, 3H) and one step's recurrent
// projection (B, 3H).
size_t gru_forward_workspace_elems(int B, int L, int H);
// Backward scratch: gate-input gradients (B, L, 3H) twice, the previous states (B, L, H) and
// two (B, H) state-gradient buffers.
size_t gru_backward_workspace_elems(int B, int L, int H);

// The bf16 form of a layer (precision bf16, T = float): every GEMM multiplies bf16 operands with
// FP32 accumulation (gemm_bf16): the weights' bf16 copies (the optimizer's shadow, nn.GRU's
// layout) and the activations rounded to bf16 at the product (x, the states W_hh multiplies, the
// gate-input gradients), as the Mamba GEMMs do. The gates, the states, the saved activations and
// every sum stay FP32. `workspace` holds those rounded copies and gemm_bf16's own workspace,
// beside (not inside) the FP32 workspace; one size serves forward and backward.
struct GruBf16 {
  const uint16_t* w_ih = nullptr;  // (3H, In)
  const uint16_t* w_hh = nullptr;  // (3H, H)
  void* workspace = nullptr;       // gru_bf16_workspace_bytes
};
size_t gru_bf16_workspace_bytes(int B, int L, int In, int H);

// saved may be null (inference: nothing kept for the backward). bf16: null for the FP32 form.
template <class T>
void gru_forward(const T* x, const T* h0, const T* w_ih, const T* w_hh, const T* b_ih,
                 const T* b_hh, T* y, T* saved, T* workspace, int B, int L, int In, int H,
                 const GruBf16* bf16 = nullptr);

// dy (B, L, H) is the gradient of every output step; dh_last (B, H), or null, an extra gradient
// on the final state (PyTorch's h_n output).
//   dx (B, L, In) and dh0 (B, H) overwritten (=); dh0 may be null.
//   dw_ih, dw_hh, db_ih, db_hh accumulated (+=); the biases may be null.
// bf16: the forward's form (the weights' bf16 copies; w_ih and w_hh are then not read).
template <class T>
void gru_backward(const T* x, const T* h0, const T* w_ih, const T* w_hh, const T* y, const T* saved,
                  const T* dy, const T* dh_last, T* dx, T* dh0, T* dw_ih, T* dw_hh, T* db_ih,
                  T* db_hh, T* workspace, int B, int L, int In, int H,
                  const GruBf16* bf16 = nullptr);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_GRU_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA GRU layer (kernels/gru_cuda.cu): gru_forward / gru_backward of gru.h from h0 (B, H)
// or, null, a zero state, FP32 or the bf16 form, each step a cuBLASLt GEMM and a gate kernel on
// the caller's stream. The state is a constant to the backward (no dh0, no dh_last): a carried
// state is where truncated backpropagation stops. The input projection of all steps is one GEMM;
// each step is one (B, H) x (H, 3H) GEMM and one gate kernel (both biases added there). saved
// (B, L, 4H) as the CPU's.
// w_ih_bf, w_hh_bf: the weights' bf16 copies for gru.h's bf16 form (both, or both null for
// FP32); the workspace sizes say which form they are for (`bf16`), the bf16 form's holding the
// rounded activations too. In the bf16 form w_ih and w_hh are not read.
static size_t gru_forward_workspace_bytes(int B, int L, int In, int H, bool bf16);
static void gru_forward(const GemmContext& gemm, const float* x, const float* w_ih,
                        const float* w_hh, const bfloat16* w_ih_bf, const bfloat16* w_hh_bf,
                        const float* b_ih, const float* b_hh, const float* h0, float* y,
                        float* saved, void* workspace, int B, int L, int In, int H,
                        cudaStream_t stream);
// dx (=) may be null; dw_ih, dw_hh (+=) and db_ih, db_hh (+=, may be null). Each step one gate
// kernel and one GEMM; then dx, the weight gradients (GEMMs over all steps) and the bias
// gradients (column sums in a fixed order).
static size_t gru_backward_workspace_bytes(int B, int L, int In, int H, bool bf16);
static void gru_backward(const GemmContext& gemm, const float* x, const float* w_ih,
                         const float* w_hh, const bfloat16* w_ih_bf, const bfloat16* w_hh_bf,
                         const float* h0, const float* y, const float* saved, const float* dy,
                         float* dx, float* dw_ih, float* dw_hh, float* db_ih, float* db_hh,
                         void* workspace, int B, int L, int In, int H, cudaStream_t stream);

#endif  // the parts
