// The Mamba stack's one-launch frame (kernels/mamba_frame.h, through MambaModel's forward with
// L = 1 and no backward) over several frames of carried state, against the model's CPU frame in
// float64 (stages/nn/mamba_recurrent.h) and against the layer-by-layer device frame of the same
// kernel table, in both precisions; rows restarting mid-stream, the carried state it leaves, its
// launches and its bits run to run. Shared by the emulated test (every build) and the gpu test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/step_recorder.h"
#include "stages/nn/mamba_recurrent.h"
#include "tests/kernels/gradcheck.h"
#include "tests/nn/mamba_device_checks.h"

namespace slipstream::nn::test {

struct MambaFrameCase {
  int din, d_model, d_state, layers, d_conv, rows;
  bool bf16;
};

inline std::vector<MambaFrameCase> mamba_frame_cases() {
  // An input projection or none, d_state 4..32 (two threads a channel past 16 in the layers'
  // scan), d_conv 1..4, d_inner past the block's 256 threads (dm 160), dt_rank 1..10.
  return {{12, 16, 8, 2, 4, 3, false},   {12, 16, 8, 2, 4, 3, true},   {16, 16, 16, 1, 4, 2, false},
          {5, 24, 4, 2, 2, 1, false},    {20, 32, 32, 2, 4, 2, false}, {20, 32, 32, 2, 4, 2, true},
          {40, 160, 16, 1, 3, 2, false}, {40, 160, 16, 1, 3, 2, true}, {9, 48, 16, 3, 1, 2, false}};
}

// What a frame of the device model gives: y, y's bf16 copy, the state it leaves, its launches.
struct FrameRun {
  std::vector<std::vector<float>> y;  // a frame's (rows, d_model)
  std::vector<std::vector<uint16_t>> y_bf;
  std::vector<std::vector<float>> carried;  // after the last frame
  std::vector<std::vector<std::string>> launches;
};

template <class Kernels>
FrameRun run_device_frames(const MambaConfig& c, const MambaFrameCase& k,
                           const std::vector<float>& w,
                           const std::vector<std::vector<float>>& frames,
                           const std::vector<std::vector<float>>& continues, bool fused,
                           const Device& memory, cudaStream_t stream,
                           typename Kernels::GemmContext gemm) {
  const bool was = Kernels::mamba_frame_fused();
  Kernels::set_mamba_frame_fused(fused);
  using Ops = ops::DeviceOps<Kernels>;
  MambaModel<float, Ops> m(c, Ops(memory, stream, gemm));
  m.set_carry(true);
  m.resize(k.rows, 1, k.bf16);
  m.set_forward_only(true);
  std::vector<uint16_t> wb(w.size());
  kernels::fp32_to_bf16(w.data(), wb.data(), w.size());
  Tensor d_w = to_device(w, DType::f32, memory), d_wb = to_device(wb, DType::bf16, memory);
  const size_t ny = size_t(k.rows) * size_t(k.d_model);
  Tensor d_y = Tensor::empty({int64_t(ny)}, DType::f32, memory);
  Tensor d_ybf = Tensor::empty({int64_t(ny)}, DType::bf16, memory);
  if (k.bf16) m.set_bf16_copies(nullptr, d_ybf.data<uint16_t>());
  FrameRun r;
  for (size_t f = 0; f < frames.size(); ++f) {
    Tensor d_x = to_device(frames[f], DType::f32, memory);
    Tensor d_cont = to_device(continues[f], DType::f32, memory);
    const bool all =
        std::all_of(continues[f].begin(), continues[f].end(), [](float v) { return v == 1.0f; });
    std::vector<std::string> names;
    {
      capture::StepRecorder rec(nullptr);
      if (all && f > 0)
        m.carry_all();
      else
        m.carry(d_cont.data<float>());
      m.forward(d_x.data<float>(), d_w.data<float>(), k.bf16 ? d_wb.data<uint16_t>() : nullptr,
                d_y.data<float>());
      EXPECT_TRUE(rec.recording()) << rec.stop_reason();
      const auto ops = rec.finish();
      for (const auto& op : ops) names.emplace_back(op.what);
      capture::issue_ops(ops);
      rec.run_deferred();
    }
    r.launches.push_back(names);
    r.y.push_back(to_host<float>(d_y));
    r.y_bf.push_back(k.bf16 ? to_host<uint16_t>(d_ybf) : std::vector<uint16_t>{});
    to_host<float>(d_cont);  // d_x and d_cont live until the frame's work is done
  }
  for (const Tensor& t : m.carried()) r.carried.push_back(to_host<float>(t));
  Kernels::set_mamba_frame_fused(was);
  return r;
}

template <class Kernels>
void check_mamba_frame(const MambaFrameCase& k, const Device& memory, cudaStream_t stream,
                       typename Kernels::GemmContext gemm, uint64_t seed) {
  SCOPED_TRACE("din" + std::to_string(k.din) + " d_model" + std::to_string(k.d_model) + " N" +
               std::to_string(k.d_state) + " layers" + std::to_string(k.layers) + " d_conv" +
               std::to_string(k.d_conv) + " rows" + std::to_string(k.rows) +
               (k.bf16 ? " bf16" : " fp32"));
  MambaConfig c;
  c.din = k.din, c.d_model = k.d_model, c.d_state = k.d_state, c.layers = k.layers;
  c.d_conv = k.d_conv;
  const MambaLayout lay(c);
  std::vector<float> w(lay.params.total());
  mamba_init(c, lay, w.data(), seed);
  std::mt19937_64 rng(seed + 1);
  const auto noise = kernels::test::rand_vec(w.size(), rng, 0.02, 0.1);
  for (size_t i = 0; i < w.size(); ++i) w[i] += float(noise[i]);
  // Six frames; at frame 3 the odd rows start a new game (their state back to zero).
  const int F = 6;
  std::vector<std::vector<float>> frames, continues;
  for (int f = 0; f < F; ++f) {
    frames.push_back(
        kernels::test::cast<float>(kernels::test::rand_vec(size_t(k.rows) * size_t(k.din), rng)));
    std::vector<float> cont(size_t(k.rows), f == 0 ? 0.0f : 1.0f);
    if (f == 3)
      for (int b = 1; b < k.rows; b += 2) cont[size_t(b)] = 0.0f;
    continues.push_back(cont);
  }
  const FrameRun fused =
      run_device_frames<Kernels>(c, k, w, frames, continues, true, memory, stream, gemm);
  const FrameRun layers =
      run_device_frames<Kernels>(c, k, w, frames, continues, false, memory, stream, gemm);
  const FrameRun again =
      run_device_frames<Kernels>(c, k, w, frames, continues, true, memory, stream, gemm);
  // In bf16, the layers' frame in fp32 too: the one launch must be nearer the bf16 frame (its
  // operands rounded as the bf16 GEMMs round them) than the fp32 one, by far.
  MambaFrameCase k32 = k;
  k32.bf16 = false;
  const FrameRun layers32 =
      k.bf16 ? run_device_frames<Kernels>(c, k32, w, frames, continues, false, memory, stream, gemm)
             : FrameRun{};

  // The CPU's frame in float64 (fp32 only: it has no bf16 form).
  MambaRecurrent<double> ref(c, k.rows);
  const std::vector<double> wd(w.begin(), w.end());
  const size_t ny = size_t(k.rows) * size_t(k.d_model);
  for (int f = 0; f < F; ++f) {
    SCOPED_TRACE("frame " + std::to_string(f));
    for (int b = 0; b < k.rows; ++b)
      if (continues[size_t(f)][size_t(b)] == 0.0f) ref.reset(b);
    const std::vector<double> xd(frames[size_t(f)].begin(), frames[size_t(f)].end());
    std::vector<double> y_ref(ny);
    ref.step(xd.data(), wd.data(), y_ref.data());
    const auto& y = fused.y[size_t(f)];
    for (float e : y) ASSERT_TRUE(std::isfinite(e)) << "non-finite output";
    // The layers' frame is checked against the CPU by MambaEmulatedDevice/MambaGpu; here the
    // one launch against both. fp32: sums in other orders; bf16: operands of 8 mantissa bits.
    if (!k.bf16) {
      EXPECT_LT(kernels::test::rel_diff(y_ref, y), 2e-5) << "against the CPU";
    }
    const std::vector<double> yl(layers.y[size_t(f)].begin(), layers.y[size_t(f)].end());
    const double d = kernels::test::rel_diff(yl, y);
    EXPECT_LT(d, k.bf16 ? 2e-3 : 1e-5) << "against the layers";
    if (k.bf16) {
      const std::vector<double> y32(layers32.y[size_t(f)].begin(), layers32.y[size_t(f)].end());
      EXPECT_LT(4 * d, kernels::test::rel_diff(y32, y))
          << "not 4x nearer the bf16 layers than the fp32 frame";
    }
    EXPECT_EQ(y, again.y[size_t(f)]) << "the same bits run to run";
    if (k.bf16) {
      for (size_t i = 0; i < ny; ++i)
        ASSERT_EQ(fused.y_bf[size_t(f)][i], kernels::fp32_to_bf16(y[i])) << "y's copy at " << i;
    }
    // One launch a frame, and the carry's one pass where some row restarts.
    const auto& names = fused.launches[size_t(f)];
    EXPECT_EQ(std::count(names.begin(), names.end(), "mamba_frame_kernel"), 1);
    const bool all = std::all_of(continues[size_t(f)].begin(), continues[size_t(f)].end(),
                                 [](float v) { return v == 1.0f; });
    EXPECT_EQ(names.size(), all && f > 0 ? 1u : 2u);
  }
  // The state left for the next frame: the layers' (scan states, then the conv inputs).
  ASSERT_EQ(fused.carried.size(), layers.carried.size());
  for (size_t i = 0; i < fused.carried.size(); ++i) {
    const std::vector<double> s(layers.carried[i].begin(), layers.carried[i].end());
    EXPECT_LT(kernels::test::rel_diff(s, fused.carried[i]), k.bf16 ? 2e-3 : 1e-5)
        << "carried " << i;
  }
}

}  // namespace slipstream::nn::test
