// The entry points the checks call, gathered from one namespace: `cuda` (the real kernels) or
// `cuda_emulated` (the same sources compiled for the CPU emulator).
#pragma once

#define SLIPSTREAM_DEFINE_CUDA_OPS(Name, NS)                               \
  struct Name {                                                            \
    template <class T>                                                     \
    static constexpr auto scan_forward = &NS::selective_scan_forward<T>;   \
    template <class T>                                                     \
    static constexpr auto scan_backward = &NS::selective_scan_backward<T>; \
    template <class T>                                                     \
    static constexpr auto scan_step = &NS::selective_scan_step<T>;         \
    static constexpr auto scan_backward_workspace_bytes =                  \
        &NS::selective_scan_backward_workspace_bytes;                      \
  }
