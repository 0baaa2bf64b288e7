// A stack of GRU layers run by cuDNN 9's RNN API (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8): the math of kernels/gru.h (PyTorch nn.GRU, batch_first, zero
// initial state, gates r, z, n), every layer of the stack in one call, fp32 data with fp32 FMA
// math (no TF32), so it can be held to the CPU reference's fp32 tolerance as the per-step CUDA
// layer is (GpuGru.CudnnStackMatchesCpu; not yet run on a GPU).
//
// The weights stay where and how the caller keeps them, in nn.GRU's layout: per layer
// weight_ih (3H, In), weight_hh (3H, H), bias_ih (3H), bias_hh (3H). Each forward copies them
// into cuDNN's weight space (cudnnGetRNNWeightParams says where each gate's matrix and bias
// lie; neighbouring pieces go as one copy), and each backward adds cuDNN's weight gradients into
// the caller's. libcudnn.so.9 is opened at run time, as the engine's version probe does, so
// binaries that never choose this start without it. CUDA builds only.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/cuda_api.h"

namespace slipstream::kernels::cuda {

class CudnnGru {
 public:
  // Offsets (in floats) of one layer's tensors within the caller's flat weights.
  struct LayerOffsets {
    size_t w_ih, w_hh, b_ih, b_hh;
  };
  // Creates the cuDNN handle (on the current device, issuing on `stream`) and the descriptors.
  // Throws naming the call when libcudnn.so.9 or a function is missing, or a call fails.
  CudnnGru(cudaStream_t stream, int in, int hidden, std::vector<LayerOffsets> layers);
  ~CudnnGru();
  CudnnGru(const CudnnGru&) = delete;
  CudnnGru& operator=(const CudnnGru&) = delete;

  int layers() const { return static_cast<int>(layers_.size()); }
  size_t weight_space_bytes() const { return weight_bytes_; }

  // Describes batches of B sequences of L steps and says what they need: a workspace and a
  // reserve (kept from the forward for the backward), and `seq_lengths`, device memory of B
  // int32 that `set_batch` fills (synchronously: setup and resize only).
  struct Needs {
    size_t work_bytes = 0, reserve_bytes = 0;
  };
  Needs describe_batch(int B, int L);
  void set_batch(int* seq_lengths);

  // The device buffers of one batch shape (the caller's allocations, sized as above).
  struct Buffers {
    void* weight_space;   // weight_space_bytes()
    void* dweight_space;  // weight_space_bytes(); backward only
    void* work;
    void* reserve;
    int* seq_lengths;
  };
  // x (B, L, In) -> y (B, L, H), the last layer's states; w the caller's flat weights.
  void forward(const float* x, const float* w, float* y, const Buffers& b, bool training);
  // dy (B, L, H) -> dx (B, L, In) (=; required: cuDNN always writes it); dw (+=) in the caller's
  // layout. x, y: the forward's. Call after forward(training) of the same batch.
  void backward(const float* x, const float* y, const float* dy, const float* w, float* dx,
                float* dw, const Buffers& b);

 private:
  struct Descriptors;  // cuDNN's handles, opaque to includers
  // One copy between the caller's weights and cuDNN's weight space, in floats.
  struct Piece {
    size_t ours, theirs, n;
  };
  void map_weights(const void* weight_space);

  std::unique_ptr<Descriptors> d_;
  cudaStream_t stream_;
  int in_, hidden_, B_ = 0, L_ = 0;
  std::vector<LayerOffsets> layers_;
  size_t weight_bytes_ = 0;
  std::vector<Piece> pieces_;  // set by map_weights on first use
  const void* mapped_for_ = nullptr;
};

}  // namespace slipstream::kernels::cuda
