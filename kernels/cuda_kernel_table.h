// The CUDA entry points gathered from one namespace into a struct, so code can be a template
// over the kernels it runs: `kernels::cuda` (the device build) or `kernels::cuda_emulated` (the
// same sources on the CPU emulator, kernels/emulation/emulated_kernels.h). The kernel tests and
// the models' device ops (stages/nn/device_ops.h) are written against such a table. `Emulated`
// says which of the two it is (true for cuda_emulated).
#pragma once

#include "kernels/adamw.h"
#include "kernels/causal_conv1d.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gru.h"
#include "kernels/rmsnorm.h"
#include "kernels/selective_scan.h"

#define SLIPSTREAM_CUDA_KERNEL_TABLE(Name, NS, Emulated)                                           \
  struct Name {                                                                                    \
    static constexpr bool kEmulated = Emulated;                                                    \
    using GemmContext = NS::GemmContext;                                                           \
    static constexpr int kScanMaxState = NS::kScanMaxState;                                        \
    template <class T>                                                                             \
    static constexpr auto scan_forward = &NS::selective_scan_forward<T>;                           \
    template <class T>                                                                             \
    static constexpr auto scan_backward = &NS::selective_scan_backward<T>;                         \
    template <class T>                                                                             \
    static constexpr auto scan_step = &NS::selective_scan_step<T>;                                 \
    static constexpr auto scan_backward_workspace_bytes =                                          \
        &NS::selective_scan_backward_workspace_bytes;                                              \
    template <class T>                                                                             \
    static constexpr auto conv_forward = &NS::causal_conv1d_forward<T>;                            \
    template <class T>                                                                             \
    static constexpr auto conv_backward = &NS::causal_conv1d_backward<T>;                          \
    template <class T>                                                                             \
    static constexpr auto conv_step = &NS::causal_conv1d_step<T>;                                  \
    static constexpr auto conv_backward_workspace_bytes =                                          \
        &NS::causal_conv1d_backward_workspace_bytes;                                               \
    template <class T>                                                                             \
    static constexpr auto rms_forward = &NS::rmsnorm_add_forward<T>;                               \
    template <class T>                                                                             \
    static constexpr auto rms_backward = &NS::rmsnorm_add_backward<T>;                             \
    static constexpr auto rms_backward_workspace_bytes =                                           \
        &NS::rmsnorm_add_backward_workspace_bytes;                                                 \
    static constexpr auto add_inplace = &NS::add_inplace<float>;                                   \
    static constexpr auto copy_cols = &NS::copy_cols<float>;                                       \
    static constexpr auto add_bias_rows = &NS::add_bias_rows;                                      \
    static constexpr auto neg_exp = &NS::neg_exp;                                                  \
    static constexpr auto mul_accumulate = &NS::mul_accumulate;                                    \
    static constexpr auto silu_forward = &NS::silu_forward;                                        \
    static constexpr auto silu_backward = &NS::silu_backward;                                      \
    static constexpr auto fill = &NS::fill;                                                        \
    static constexpr auto copy_bytes = &NS::copy_bytes;                                            \
    static constexpr auto to_bf16 = &NS::fp32_to_bf16;                                             \
    static constexpr auto from_bf16 = &NS::bf16_to_fp32;                                           \
    static constexpr auto accumulate_bf16 = &NS::accumulate_bf16;                                  \
    static constexpr auto column_sum = &NS::column_sum_accumulate;                                 \
    static constexpr auto column_sum_workspace_bytes = &NS::column_sum_accumulate_workspace_bytes; \
    using AdamWSegment = NS::AdamWSegment;                                                         \
    using AdamWHyper = NS::AdamWHyper;                                                             \
    using AdamWDeviceState = NS::AdamWDeviceState;                                                 \
    static constexpr auto adamw_step = &NS::adamw_step;                                            \
    static constexpr auto adamw_workspace_bytes = &NS::adamw_workspace_bytes;                      \
    static constexpr auto adamw_finish_gathered = &NS::adamw_finish_gathered;                      \
    static constexpr auto gru_forward = &NS::gru_forward;                                          \
    static constexpr auto gru_backward = &NS::gru_backward;                                        \
    static constexpr auto gru_forward_workspace_bytes = &NS::gru_forward_workspace_bytes;          \
    static constexpr auto gru_backward_workspace_bytes = &NS::gru_backward_workspace_bytes;        \
    template <class... Args>                                                                       \
    static void gemm(Args... args) {                                                               \
      NS::gemm(args...);                                                                           \
    }                                                                                              \
  }
