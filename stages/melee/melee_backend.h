// The Melee kernels of a kernel backend, as a type: MeleeKernels<KernelBackend::cuda> calls
// melee::cuda, MeleeKernels<KernelBackend::emulated> melee::cuda_emulated. A Melee stage's
// device path is a template over the model ops (stages/nn/ops_backend.h) and takes its game
// kernels from MeleeKernels<Ops::kBackend>, so one source serves the GPU and the emulator.
#pragma once

#include "stages/melee/melee_kernels.h"
#include "stages/nn/ops_backend.h"

namespace slipstream::melee {

template <KernelBackend B>
struct MeleeKernels;

#define SLIPSTREAM_MELEE_KERNELS_OF(NS)                                                       \
  using EmbedDims = NS::EmbedDims;                                                            \
  using HeadPointers = NS::HeadPointers;                                                      \
  using HeadGradPointers = NS::HeadGradPointers;                                              \
  using HeadWeights = NS::HeadWeights;                                                        \
  static constexpr auto embed_mirror_flags = &NS::embed_mirror_flags;                         \
  static constexpr auto embed_forward = &NS::embed_forward;                                   \
  static constexpr auto embed_add_noise = &NS::embed_add_noise;                               \
  static constexpr auto embed_backward_workspace_bytes = &NS::embed_backward_workspace_bytes; \
  static constexpr auto embed_backward = &NS::embed_backward;                                 \
  static constexpr auto bc_loss_rows = &NS::bc_loss_rows;                                     \
  static constexpr auto bc_loss_backward = &NS::bc_loss_backward;

#if SLIPSTREAM_KERNELS_CUDA
template <>
struct MeleeKernels<KernelBackend::cuda> {
  SLIPSTREAM_MELEE_KERNELS_OF(cuda)
};
#endif
#if SLIPSTREAM_CUDA_EMULATOR
template <>
struct MeleeKernels<KernelBackend::emulated> {
  SLIPSTREAM_MELEE_KERNELS_OF(cuda_emulated)
};
#endif
#undef SLIPSTREAM_MELEE_KERNELS_OF

}  // namespace slipstream::melee
