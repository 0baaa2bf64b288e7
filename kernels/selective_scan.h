// Mamba-1 selective scan, the semantics of mamba-ssm's selective_scan_ref (real A and
// variable, ungrouped B and C):
//   dt        = delta + delta_bias;  dt = softplus(dt) if delta_softplus (threshold 20)
//   h_t[d, n] = exp(dt[t, d] A[d, n]) h_{t-1}[d, n] + dt[t, d] B[t, n] u[t, d]
//   h_{-1}    = initial_state (B, D, N) when given (a window that continues the one before it:
//               its last_state), else 0
//   y[t, d]   = sum_n C[t, n] h_t[d, n] + Dskip[d] u[t, d]
//   out       = y * silu(z)   when z is given, else y
// Layout: u, delta, z, out (B, L, D) — mamba-ssm uses (B, D, L); A (D, N); Bm, Cm (B, L, N);
// Dskip, delta_bias (D). Dskip, z and delta_bias may be null. N <= kScanMaxState.
//
// Parallel over (batch, blocks of kScanChannelBlock channels). The forward keeps nothing for
// the backward: the backward recomputes the states of one block at a time into caller
// workspace (it costs one more scan; mamba-ssm's CUDA kernel does the same), so training
// memory does not grow with L * D * N. Results do not depend on the thread count.
//
// Declared once for both builds: the CPU reference below, and the CUDA entry points in the
// second part, which kernels/cuda_kernels.h includes into its kernel tables (kernels::cuda::Kernels
// and kernels::cuda_emulated::Kernels) as static members.
#if !defined(SLIPSTREAM_CUDA_ENTRY_POINTS) && !defined(SLIPSTREAM_OPS_METHODS)
#ifndef SLIPSTREAM_KERNELS_SELECTIVE_SCAN_H
#define SLIPSTREAM_KERNELS_SELECTIVE_SCAN_H

#include <cstddef>

#include "kernels/cuda_api.h"

namespace slipstream::kernels {

inline constexpr int kScanMaxState = 256;
inline constexpr int kScanChannelBlock = 16;
// Fixed number of scratch slots of the backward (independent of the machine, so workspace
// sizes are too); work items are split statically over them.
inline constexpr int kScanSlots = 64;

// initial_state (B, D, N), h_{-1}, and last_state (B, D, N), the final h, may be null.
template <class T>
void selective_scan_forward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                            const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                            const T* initial_state, T* out, T* last_state, int B, int L, int D,
                            int N);

// Elements of T: min(kScanSlots, items) * (2 L kScanChannelBlock N + 4 L kScanChannelBlock)
// for recomputed states, + B D N + 2 B D for per-batch dA/dD/ddelta_bias partials,
// + 2 nblk B L N for per-block dB/dC partials, + 64 to start the recomputation's scratch on a
// 64-byte boundary, where nblk = ceil(D / kScanChannelBlock) and items = B nblk. (B=256, L=60,
// D=256, N=16: about 11.2M elements.)
size_t selective_scan_backward_workspace_elems(int B, int L, int D, int N);

// Gradients given dout (B, L, D), for the forward from the same initial_state (may be null); no
// gradient flows into initial_state (training carries it as a constant: truncated BPTT):
//   du, ddelta, dz (B, L, D) and dBm, dCm (B, L, N) overwritten (=); dz ignored when z is null.
//   dA (D, N), dDskip (D), ddelta_bias (D) accumulated (+=); each may be null when the
//   matching input is (dDskip, ddelta_bias) or when unwanted.
template <class T>
void selective_scan_backward(const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                             const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                             const T* initial_state, const T* dout, T* du, T* ddelta, T* dA, T* dBm,
                             T* dCm, T* dDskip, T* dz, T* ddelta_bias, T* workspace, int B, int L,
                             int D, int N);

// One step of the recurrence for inference, carrying the state across calls: u, delta, z, out
// (B, D) are one frame; Bm, Cm (B, N); state (B, D, N) holds h_{t-1} on entry and h_t on return
// (zero before the first frame). Calling it for t = 0..L-1 gives the forward's out and
// last_state on the same frames. Dskip, z and delta_bias may be null.
template <class T>
void selective_scan_step(T* state, const T* u, const T* delta, const T* A, const T* Bm, const T* Cm,
                         const T* Dskip, const T* z, const T* delta_bias, bool delta_softplus,
                         T* out, int B, int D, int N);

}  // namespace slipstream::kernels

#endif  // SLIPSTREAM_KERNELS_SELECTIVE_SCAN_H
#elif defined(SLIPSTREAM_CUDA_ENTRY_POINTS)

// The CUDA scan (kernels/selective_scan_cuda.cu). Same math and layouts as above; T (float or
// bfloat16) is the type of u, delta, z, out, Bm, Cm and of their gradients; A, Dskip,
// delta_bias, the states and dA, dDskip, ddelta_bias are fp32, and all arithmetic is fp32.
// One thread per (batch, channel) with the channel's states in registers (two threads per
// channel when N > 16), Bm and Cm rows staged in shared memory. The backward stores the states
// at the start of every chunk of a few steps, then per chunk, last to first, recomputes the
// chunk's states into registers and runs the adjoint recurrence; sums over channels (dBm, dCm)
// and over the batch (dA, dDskip, ddelta_bias) go through per-warp and per-block partials added
// in a fixed order, so results are deterministic. `ldbc` (0: N) is the step from one row (b, t)
// of Bm and Cm (and the backward's dBm and dCm) to the next, in elements: the model passes
// x_proj's output itself, whose rows hold dt, Bm and Cm side by side, and the backward writes
// into x_proj's output gradient, instead of copies in and out. `z_ld` (0: D) likewise for z and
// the backward's dz and dz_bf: the model's z is in_proj's output beside x, its gradient beside
// x's, so that one GEMM makes both and one takes both.
static constexpr int kScanMaxState = 32;

// out_bf (may be null) receives out rounded to bf16 as well, as fp32_to_bf16 of out would (the
// bf16 GEMMs' copy without a cast launch); out may be null where out_bf is given (a caller that
// reads only the copy). chunk_states: below. With `a_log`, A holds Mamba's
// A_log and the kernels take A = −exp(A_log) themselves, as the elementwise neg_exp would make
// it (the same bits): the model's parameter read in place, no launch a step to make A.
// With `dt_w` the forward makes Δ itself from its low-rank form, Mamba's dt_proj folded in (a
// forward no backward follows, which needs no Δ tensor: the policy's frames, validation):
// Δ[b, t, d] = Σ_r dt[(b, t), r] dt_w[d, r] over r < dt_rank (≤ kScanMaxDtRank), summed in that
// order by fmaf, with dt's rows `ldbc` apart like Bm's (x_proj's output holds dt, Bm, Cm) and
// dt_w (D, dt_rank) fp32; `delta` is then not read.
static constexpr int kScanMaxDtRank = 32;
template <class T>
static void selective_scan_forward(const T* u, const T* delta, const float* A, const T* Bm,
                                   const T* Cm, const float* Dskip, const T* z,
                                   const float* delta_bias, bool delta_softplus,
                                   const float* initial_state, T* out, bfloat16* out_bf,
                                   float* last_state, float* chunk_states, int B, int L, int D,
                                   int N, cudaStream_t stream, int ldbc = 0, int z_ld = 0,
                                   bool a_log = false, const T* dt = nullptr,
                                   const float* dt_w = nullptr, int dt_rank = 0);

static size_t selective_scan_backward_workspace_bytes(int B, int L, int D, int N);

// The states the backward starts its chunks from, which it otherwise finds by running the
// recurrence a second time: a forward given `chunk_states` (this many bytes; null: none) writes
// them, a backward given the same buffer reads them instead. The layout follows the backward's
// shape: keep the variant (below) the same from the forward to the backward.
static size_t selective_scan_chunk_states_bytes(int B, int L, int D, int N);
// Whether a training step uses that (the model asks; tests and benchmarks set it): on since an
// H100 timed it against the backward's own first pass (2026-11-28: the whole step 1.05x at
// gpu_standard, 1.08-1.10x at production, bench/results.jsonl); SLIPSTREAM_SCAN_FORWARD_STATES=0
// in the environment turns it off for a process (tools/gpu_check/ab_step.sh's A/B).
static void set_scan_forward_keeps_states(bool on);
static bool scan_forward_keeps_states();
// The training forward's lean form, for a lease to time (off by default; Nsight Compute counted
// 23 instructions a state-step in production's forward on an H200, issue slots 48 % busy): the
// chunk states stored from a running offset at a countdown of save_every steps (no division a
// step, one multiply-add an address where the default forms a 64-bit product chain a state: the
// same bits), and y, the sum over a thread's states, as four running sums added pairwise (a
// dependent chain of kNS / 4 fused multiply-adds instead of kNS: other bits for out, the same
// every run), and where a channel has two threads (d_state above 16) each step's channel work
// (the loads of u, Δ and z, softplus, the gate and out's store) done by one of them, the other
// taking dt and u by shuffles (spread_steps's idea, below: the same values). sm_90 code at
// production's shape: 4,120 instructions against the default's 7,992 (fp32; bf16 4,160 against
// 8,104), 128 registers without a spill. The forward that makes Δ itself (inference) keeps its
// one form.
// SLIPSTREAM_SCAN_FORWARD=lean in the environment turns it on for a process (gpu-check's `ab`
// entry scan_forward_lean); another name is the first scan call's error.
static void set_scan_forward_lean(bool on);
static bool scan_forward_lean();

// The backward kernel's form for d_state 9..32, for tests and benchmarks to compare (a run keeps
// the default). split, the default: a thread holds 8 states of a channel (two or four threads a
// channel; held by its launch bounds to 128 registers, 4 blocks of 128 threads an SM, which
// GpuScan.BackwardKeepsFourBlocksAnSm checks: ptxas 13 fits it without a spill at d_state 16 and
// 32, fp32 and bf16, sm_90). shared_sums: split with dBm and dCm summed over the block's channels
// through shared memory once a chunk (each thread's products stored, then a thread a column adds
// them in channel order) instead of by shuffles over the warp's channels every step, which with
// their selects are a quarter of the default's instructions a step and a chain of dependent
// rounds: other bits (another order of the same sums), still the same every run; on an H100 and
// an H200 (2026-11-28) 0.96-1.09x the default's time in fp32, 1.05-1.13x in bf16.
// shared_whole_chunks: shared_sums with no test between the steps of a whole chunk, at 128
// registers: no spill at d_state 16, 8-24 bytes at 32 (ptxas 13, sm_90); 0.93-0.99x the
// default's time in fp32, 1.03-1.05x in bf16 (the same cards).
// spread_steps: split with each step's channel work (its loads of u, Δ, dout and z, softplus, the
// gate and their derivatives, du, dΔ and dz with their stores) done once, by one of the
// channel's threads (thread s does a chunk's steps s, s + kG, ...), where the default has each of
// the channel's 2 or 4 threads do every step's; the others take a step's dt, u and dy by
// shuffles, and dΔ's sum over the steps keeps the default's order. The same values computed the
// same way: the default's gradients bit for bit (a test holds that). Its chunk loop is 1,376
// sm_90 instructions against the default's 2,054 at d_state 32 (bf16; fp32 1,367 against 2,014)
// and 1,637 against 2,077 at 16 (fp32 1,620 against 2,037), at 128 registers, no spill (ptxas 13):
// not yet timed on a GPU.
// Forms that lost to the default at both shapes and precisions on the cards that timed them were
// removed (docs/kernels.md, "Forms measured and removed").
// SLIPSTREAM_SCAN_BACKWARD=<name> in the environment picks the form for a process (a whole-step
// A/B of one build, tools/gpu_check/ab_step.sh); a name that is none is the error of the first
// backward call. Every form has the default's shape, so the workspace and the chunk states a
// forward keeps are the same for all. Not thread-safe.
enum class ScanBackwardVariant { split, shared_sums, shared_whole_chunks, spread_steps };
static void set_scan_backward_variant(ScanBackwardVariant v);
static ScanBackwardVariant scan_backward_variant();
// Blocks of the backward kernel for d_state N and element type T that fit an SM of the current
// device at once (the occupancy calculator's answer); 0 under the emulator, which has no SMs.
template <class T>
static int selective_scan_backward_blocks_per_sm(int N);

// Gradients as the CPU backward (=, and += for dA, dDskip, ddelta_bias); `workspace` holds
// selective_scan_backward_workspace_bytes; `chunk_states` is what the forward on the same inputs
// wrote there, or null (the backward then finds the states itself). `ddelta_bf`, `dz_bf` (may be
// null) receive ddelta and dz rounded to bf16 as well, as fp32_to_bf16 of them would: the bf16
// GEMMs' copies without cast launches; dz may be null where dz_bf is given. With `a_log` (A holds
// A_log, as in the forward) dA is A_log's gradient: it receives += (its sum) · A, the chain rule of
// A = −exp(A_log) applied on the way out, with no dA buffer to zero and no separate product.
template <class T>
static void selective_scan_backward(const T* u, const T* delta, const float* A, const T* Bm,
                                    const T* Cm, const float* Dskip, const T* z,
                                    const float* delta_bias, bool delta_softplus,
                                    const float* initial_state, const float* chunk_states,
                                    const T* dout, T* du, T* ddelta, float* dA, T* dBm, T* dCm,
                                    float* dDskip, T* dz, float* ddelta_bias, bfloat16* ddelta_bf,
                                    bfloat16* dz_bf, void* workspace, int B, int L, int D, int N,
                                    cudaStream_t stream, int ldbc = 0, bool a_log = false,
                                    int z_ld = 0);

template <class T>
static void selective_scan_step(float* state, const T* u, const T* delta, const float* A,
                                const T* Bm, const T* Cm, const float* Dskip, const T* z,
                                const float* delta_bias, bool delta_softplus, T* out, int B, int D,
                                int N, cudaStream_t stream);

#endif  // the parts
