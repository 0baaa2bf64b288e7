// One frame of a whole Mamba stack in one launch, for inference (a policy's frames): the input
// projection, every layer (RMSNorm, in_proj, the convolution's step, x_proj, Δ from dt_proj,
// the scan's step gated by SiLU(z), out_proj onto the residual stream) and the final norm, a
// block a row. A frame's rows are independent games, so a block carries its row through every
// layer with no other block to wait for: one launch where the layer-by-layer path takes six a
// layer and two more (stages/nn/mamba_model.h's forward with L = 1).
//
// Its CPU reference is the model's own frame on the CPU, stages/nn/mamba_recurrent.h (the same
// math as MambaModel's forward over one step); tests/nn/mamba_frame_checks.h checks the kernel
// against it and against the layer-by-layer device forward, in both precisions, on the emulator
// (mamba_frame_emulated_test.cpp) and on a GPU (mamba_device_gpu_test.cpp).
//
// Declared in the three parts every op header has; only the CUDA part has content.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_MAMBA_FRAME_H
#define SLIPSTREAM_KERNELS_MAMBA_FRAME_H
#endif  // SLIPSTREAM_KERNELS_MAMBA_FRAME_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// kernels/mamba_frame_cuda.cu. The model's sizes and where each weight lies in its flat buffer
// (stages/nn/mamba_model.h's MambaLayout: layer l's tensor at the layer-0 offset plus
// l · layer_stride), in elements. `wb`, when given, is the bf16 shadow in the same layout: the
// four linear layers' weights are read from it and their inputs rounded to bf16 first, as the
// bf16 GEMMs of the layer-by-layer path take them; dt_proj, the norms, the convolution and the
// scan read the fp32 weights in both precisions, as that path does.
struct MambaFrame {
  int rows = 0, din = 0, d_model = 0, d_inner = 0, d_state = 0, dt_rank = 0, d_conv = 0, layers = 0;
  float eps = 0.f;
  // 1 where din != d_model: h_0 = x W_inᵀ + b; 0: h_0 = x. An int, so the struct has no padding
  // (a launch's key hashes its bytes).
  int input_proj = 0;
  size_t input_proj_w = 0, input_proj_b = 0, norm_f = 0, layer_stride = 0;
  // Layer 0's.
  size_t norm = 0, in_proj = 0, conv_w = 0, conv_b = 0, x_proj = 0, dt_w = 0, dt_b = 0, A_log = 0,
         D = 0, out_proj = 0;
};
// The largest sizes the kernel keeps in shared memory (a row's activations: about 21 KB).
static constexpr int kFrameMaxModel = 512, kFrameMaxInner = 1024, kFrameMaxInput = 2048;
// Whether mamba_frame_forward takes this model (sizes within the limits above, d_state and dt_rank
// within the scan's, d_conv within the convolution's); the caller runs the layers otherwise.
static bool mamba_frame_fits(const MambaFrame& m);
// x (rows, din) -> y (rows, d_model), and y_bf (may be null) y rounded to bf16. The carried
// state of row r, layer l: conv_in/conv_out (layers, rows, d_conv - 1, d_inner), the last
// d_conv - 1 inputs of the convolution, oldest first, and scan_in/scan_out (layers, rows,
// d_inner, d_state); an `_in` null is zeros (the first frame), an `_out` null is not written,
// and an `_out` may be its `_in` (each thread reads its channel's state before writing it).
static void mamba_frame_forward(const MambaFrame& m, const float* x, const float* w,
                                const bfloat16* wb, const float* conv_in, float* conv_out,
                                const float* scan_in, float* scan_out, float* y, bfloat16* y_bf,
                                cudaStream_t stream);
// Whether the model's frames take it (MambaModel::forward with L = 1 and no backward): off by
// default until a GPU times it against the layer-by-layer frame (bench_kernels_cuda's
// mamba_frame/*, gpu-check's GPU_CHECK_INFER_FORMS=fused_frame); set_mamba_frame_fused, or
// SLIPSTREAM_MAMBA_FRAME=fused in the environment for a process (layers: the default; another name
// is the first frame's error). Not thread-safe.
static void set_mamba_frame_fused(bool on);
static bool mamba_frame_fused();

#else   // SLIPSTREAM_OPS_METHODS: none (the model calls the table through DeviceOps)
#endif  // the parts
