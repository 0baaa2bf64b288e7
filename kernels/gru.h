// Single-layer GRU over a sequence, PyTorch nn.GRU semantics (batch_first) and weight layout:
//   r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
//   z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
//   n  = tanh(W_in x + b_in + r * (W_hn h + b_hn))
//   h' = (1 - z) * n + z * h
// x (B, L, In); h0 (B, H) or null for zeros; w_ih (3H, In) and w_hh (3H, H) with gate blocks in
// the order r, z, n; b_ih, b_hh (3H) or null. Output y (B, L, H) holds every h_t; the final
// state is y[:, L-1, :].
#pragma once

#include <cstddef>

#include "kernels/cuda_api.h"
#include "kernels/gemm.h"  // cuda::GemmContext

namespace slipstream::kernels {

// Saved activations for the backward: r, z, n and hn = W_hn h + b_hn per step, (B, L, 4H).
size_t gru_saved_elems(int B, int L, int H);
// Forward scratch: the input projection of all steps (B, L, 3H) and one step's recurrent
// projection (B, 3H).
size_t gru_forward_workspace_elems(int B, int L, int H);
// Backward scratch: gate-input gradients (B, L, 3H) twice, the previous states (B, L, H) and
// two (B, H) state-gradient buffers.
size_t gru_backward_workspace_elems(int B, int L, int H);

// saved may be null (inference: nothing kept for the backward).
template <class T>
void gru_forward(const T* x, const T* h0, const T* w_ih, const T* w_hh, const T* b_ih,
                 const T* b_hh, T* y, T* saved, T* workspace, int B, int L, int In, int H);

// dy (B, L, H) is the gradient of every output step; dh_last (B, H), or null, an extra gradient
// on the final state (PyTorch's h_n output).
//   dx (B, L, In) and dh0 (B, H) overwritten (=); dh0 may be null.
//   dw_ih, dw_hh, db_ih, db_hh accumulated (+=); the biases may be null.
template <class T>
void gru_backward(const T* x, const T* h0, const T* w_ih, const T* w_hh, const T* y, const T* saved,
                  const T* dy, const T* dh_last, T* dx, T* dh0, T* dw_ih, T* dw_hh, T* db_ih,
                  T* db_hh, T* workspace, int B, int L, int In, int H);

// The CUDA GRU layer (kernels/gru_cuda.cu): the math above from a zero initial state, fp32,
// each step a cuBLASLt GEMM and a gate kernel on the caller's stream.
namespace cuda {
#include "kernels/gru_cuda.inc"
}  // namespace cuda

}  // namespace slipstream::kernels
