// A stack of GRU layers run by cuDNN 9's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8): the math of kernels/gru.h (PyTorch nn.GRU, batch_first, zero
// initial state, gates r, z, n), every layer of the stack in one call. Two forms:
// - fp32: fp32 data with fp32 FMA math (no TF32), so it can be held to the CPU reference's fp32
//   tolerance as the per-step CUDA layer is (GpuGru.CudnnStackMatchesCpu).
// - bf16 (cuDNN 9.13 or later: bf16_unsupported() says when the loaded one is older): cuDNN's
//   own bf16 RNN, which keeps x, every layer's states, the weights and their gradients in bf16
//   and computes in fp32 on tensor cores. The caller's tensors stay fp32: x, dy are rounded into
//   staging buffers, y, dx widened back, and the weight gradients added into the caller's fp32
//   ones (GpuGru.CudnnStackBf16IsCloseToCpu). This is not kernels/gru.h's bf16 form (fp32
//   states, bf16 product operands): cuDNN's rounds the states too.
//
// The weights stay where and how the caller keeps them, in nn.GRU's layout: per layer
// weight_ih (3H, In), weight_hh (3H, H), bias_ih (3H), bias_hh (3H), fp32, and for the bf16 form
// their bf16 copies at the same offsets (a parameter store's shadow). Each forward copies them
// into cuDNN's weight space (cudnnGetRNNWeightParams says where each gate's matrix and bias
// lie; neighbouring pieces go as one copy), and each backward adds cuDNN's weight gradients into
// the caller's. Every call is enqueued through the step recorder (kernels/step_recorder.h), so a
// training step that runs the stack can be captured in a CUDA graph. libcudnn.so.9 is opened at
// run time, as the engine's version probe does, so binaries that never choose this start without
// it. CUDA builds only.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda_api.h"

namespace slipstream::kernels::cuda {

class CudnnGru {
 public:
  // Offsets (in floats) of one layer's tensors within the caller's flat weights.
  struct LayerOffsets {
    size_t w_ih, w_hh, b_ih, b_hh;
  };
  // Creates the cuDNN handle (on the current device, issuing on `stream`) and the descriptors of
  // the fp32 or the bf16 form. Throws naming the call when libcudnn.so.9 or a function is
  // missing, or a call fails.
  CudnnGru(cudaStream_t stream, int in, int hidden, std::vector<LayerOffsets> layers,
           bool bf16 = false);
  ~CudnnGru();
  CudnnGru(const CudnnGru&) = delete;
  CudnnGru& operator=(const CudnnGru&) = delete;

  // Why the loaded cuDNN has no bf16 RNN ("" when it has one: 9.13 and later). Loads cuDNN.
  static std::string bf16_unsupported();
  // The same for a cuDNN of version `version` (cudnnGetVersion's major·10000 + minor·100 +
  // patch).
  static std::string bf16_unsupported(size_t version);

  int layers() const { return static_cast<int>(layers_.size()); }
  bool bf16() const { return bf16_; }
  size_t weight_space_bytes() const { return weight_bytes_; }

  // Describes batches of B sequences of L steps and says what they need: a workspace, a
  // reserve (kept from the forward for the backward), for the bf16 form staging (the rounded x,
  // y, dy and dx; the forward's x and y are kept for the backward), and `seq_lengths`, device
  // memory of B int32 that `set_batch` fills (synchronously: setup and resize only).
  struct Needs {
    size_t work_bytes = 0, reserve_bytes = 0, staging_bytes = 0;
  };
  Needs describe_batch(int B, int L);
  void set_batch(int* seq_lengths);

  // The device buffers of one batch shape (the caller's allocations, sized as above).
  struct Buffers {
    void* weight_space;   // weight_space_bytes()
    void* dweight_space;  // weight_space_bytes(); backward only
    void* work;
    void* reserve;
    void* staging;  // staging_bytes; null for the fp32 form
    int* seq_lengths;
  };
  // x (B, L, In) -> y (B, L, H), the last layer's states; w the caller's flat fp32 weights (fp32
  // form) or w_bf their bf16 copies (bf16 form); the other one may be null.
  void forward(const float* x, const float* w, const bfloat16* w_bf, float* y, const Buffers& b,
               bool training);
  // dy (B, L, H) -> dx (B, L, In) (=; required: cuDNN always writes it); dw (+=, fp32) in the
  // caller's layout. x, y: the forward's (the bf16 form reads its staged copies). Call after
  // forward(training) of the same batch.
  void backward(const float* x, const float* y, const float* dy, float* dx, float* dw,
                const Buffers& b);

 private:
  struct Descriptors;  // cuDNN's handles, opaque to includers
  // One copy between the caller's weights and cuDNN's weight space, in elements (floats, or
  // bf16s for the bf16 form).
  struct Piece {
    size_t ours, theirs, n;
  };
  // The bf16 form's staged tensors within Buffers::staging.
  struct Staged {
    bfloat16 *x, *y, *dy, *dx;
  };
  void map_weights(const void* weight_space);
  Staged staged(const Buffers& b) const;
  size_t elem_bytes() const { return bf16_ ? 2 : 4; }

  std::unique_ptr<Descriptors> d_;
  cudaStream_t stream_;
  int in_, hidden_, B_ = 0, L_ = 0;
  bool bf16_;
  std::vector<LayerOffsets> layers_;
  size_t weight_bytes_ = 0;
  std::vector<Piece> pieces_;  // set by map_weights on first use
  const void* mapped_for_ = nullptr;
};

}  // namespace slipstream::kernels::cuda
