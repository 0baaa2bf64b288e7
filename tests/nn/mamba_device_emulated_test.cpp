// The Mamba model's device path (DeviceOps over the CUDA kernel sources) on the CPU emulator,
// against the CPU model in float64: every build runs the code a GPU run executes, except
// cuBLASLt (the emulated GEMM is the CPU's) and the stream's concurrency.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cuda_kernels.h"
#include "kernels/step_recorder.h"
#include "tests/nn/mamba_device_checks.h"

namespace slipstream::nn::test {
namespace {

using kernels::EmulatedKernels;
using EmulatedOps = ops::DeviceOps<EmulatedKernels>;

// The tests' small models: din 12 (an input projection), two layers.
MambaConfig small_config(int d_model, int d_state) {
  MambaConfig c;
  c.din = 12, c.d_model = d_model, c.d_state = d_state, c.layers = 2;
  return c;
}
// Elements of the weights, of x and of y for windows (B, L).
struct Sizes {
  size_t w, x, y;
  Sizes(const MambaConfig& c, int B, int L)
      : w(MambaModel<double>(c).layout().params.total()),
        x(size_t(B) * size_t(L) * size_t(c.din)),
        y(size_t(B) * size_t(L) * size_t(c.d_model)) {}
};
// n values of normal(0, 0.3).
std::vector<float> normal_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 0.3f);
  std::vector<float> v(n);
  for (float& e : v) e = nd(rng);
  return v;
}

TEST(MambaEmulatedDevice, MatchesCpuModel) {
  uint64_t seed = 1;
  for (const auto& k : mamba_device_cases())
    check_mamba_on_device<EmulatedKernels>(k, Device::cpu(), nullptr, {}, seed++);
}

// The same with the scan's forward keeping the chunk states its backward reads
// (kernels/selective_scan.h), carried windows included.
TEST(MambaEmulatedDevice, MatchesCpuModelWithForwardScanStates) {
  const bool was = EmulatedKernels::scan_forward_keeps_states();
  EmulatedKernels::set_scan_forward_keeps_states(true);
  uint64_t seed = 21;
  for (const auto& k : mamba_device_cases())
    check_mamba_on_device<EmulatedKernels>(k, Device::cpu(), nullptr, {}, seed++);
  EmulatedKernels::set_scan_forward_keeps_states(was);
}

// A training step of the model with a carried state as the step recorder sees it (the operations
// a CUDA graph captures): every launch named by its kernel, which a failed launch's error and
// the step's operation list show; the convolution keeps the carried inputs itself (no copies).
TEST(MambaEmulatedDevice, ARecordedStepNamesEveryKernelAndCopiesNoCarriedInputs) {
  MambaConfig c;
  c.din = 12, c.d_model = 16, c.d_state = 8, c.layers = 2;
  const int B = 3, L = 2;  // a window shorter than d_conv - 1 keeps some of the carried inputs
  using Ops = ops::DeviceOps<EmulatedKernels>;
  MambaModel<float, Ops> m(c, Ops(Device::cpu(), nullptr, {}));
  m.set_carry(true);
  m.resize(B, L, true);
  const size_t nw = MambaModel<double>(c).layout().params.total();
  const size_t nx = size_t(B) * L * c.din, ny = size_t(B) * L * c.d_model;
  std::vector<float> w(nw), g(nw, 0.0f), x(nx, 0.5f), dy(ny, 0.25f), y(ny), dx(nx);
  std::vector<uint16_t> wb(nw);
  const std::vector<float> cont(size_t(B), 1.0f);
  std::vector<std::string> names;
  {
    capture::StepRecorder rec(nullptr);
    m.carry(cont.data());
    m.forward(x.data(), w.data(), wb.data(), y.data());
    m.backward(x.data(), dy.data(), w.data(), wb.data(), g.data(), dx.data());
    ASSERT_TRUE(rec.recording()) << rec.stop_reason();
    const auto ops = rec.finish();
    for (const auto& op : ops) names.emplace_back(op.what);
    capture::issue_ops(ops);
    rec.run_deferred();
  }
  auto count = [&](const std::string& name) {
    return std::count(names.begin(), names.end(), name);
  };
  EXPECT_GT(names.size(), 20u);
  for (const auto& n : names) {
    EXPECT_FALSE(n.empty());
    EXPECT_NE(n, "kernel") << "a launch named by the variable holding its kernel";
  }
  EXPECT_EQ(count("conv_forward_kernel"), c.layers);
  EXPECT_EQ(count("scan_backward_chan_kernel"), c.layers);
  EXPECT_EQ(count("copy_cols_kernel"), 0) << "the carried convolution inputs copied after it";
  EXPECT_EQ(count("scale_rows_kernel"), 1) << "the carried scan states and conv inputs in one pass";
  // bf16 copies are written by their producers; the casts left are the model's input's (made by
  // another stage) and each layer's x_proj output gradient's. dt_proj reads x_proj's fp32 output.
  EXPECT_EQ(count("fp32_to_bf16_kernel"), 1 + c.layers);
}

// In the bf16 form the model reads x's bf16 copy where the stage before made one, and its final
// norm writes y's for the stage after (set_bf16_copies): the bits of the model rounding x itself,
// one cast launch fewer, and y's copy fp32_to_bf16 of y.
TEST(MambaEmulatedDevice, Bf16CopiesGiveTheBitsOfItsOwnCasts) {
  const MambaConfig c = small_config(16, 8);
  const int B = 3, L = 5;
  using Ops = EmulatedOps;
  const Sizes n(c, B, L);
  const size_t nw = n.w, nx = n.x, ny = n.y;
  std::mt19937_64 rng(7);
  const std::vector<float> w = normal_values(nw, rng), x = normal_values(nx, rng),
                           dy = normal_values(ny, rng);
  std::vector<uint16_t> wb(nw), xb(nx);
  kernels::fp32_to_bf16(w.data(), wb.data(), nw);
  kernels::fp32_to_bf16(x.data(), xb.data(), nx);
  struct Out {
    std::vector<float> y, g, dx;
    std::vector<uint16_t> y_bf;
    long casts = 0;
  };
  auto run = [&](bool copies) {
    MambaModel<float, Ops> m(c, Ops(Device::cpu(), nullptr, {}));
    m.resize(B, L, true);
    Out o;
    o.y.assign(ny, 0.0f), o.g.assign(nw, 0.0f), o.dx.assign(nx, 0.0f), o.y_bf.assign(ny, 0);
    if (copies) m.set_bf16_copies(xb.data(), o.y_bf.data());
    capture::StepRecorder rec(nullptr);
    m.forward(x.data(), w.data(), wb.data(), o.y.data());
    m.backward(x.data(), dy.data(), w.data(), wb.data(), o.g.data(), o.dx.data());
    EXPECT_TRUE(rec.recording()) << rec.stop_reason();
    const auto ops = rec.finish();
    for (const auto& op : ops) o.casts += std::string(op.what) == "fp32_to_bf16_kernel";
    capture::issue_ops(ops);
    rec.run_deferred();
    return o;
  };
  const Out own = run(false), given = run(true);
  EXPECT_EQ(own.y, given.y);
  EXPECT_EQ(own.g, given.g);
  EXPECT_EQ(own.dx, given.dx);
  EXPECT_EQ(own.casts, given.casts + 1) << "x's cast, where its copy is given";
  for (size_t i = 0; i < ny; ++i)
    ASSERT_EQ(given.y_bf[i], kernels::fp32_to_bf16(given.y[i])) << "y's copy, element " << i;
}

// On a device in bf16 the activations only bf16 GEMMs read (the normed inputs, the scan's
// outputs, in_proj's output gradient) are written as their bf16 copies alone: no fp32 buffer for
// them. The bits of every output are unchanged (MatchesCpuModel, Training.Bf16CopiesChangeNoBit).
TEST(MambaEmulatedDevice, ABf16ModelKeepsOnlyTheCopiesItsGemmsRead) {
  const MambaConfig c = small_config(16, 8);
  const int B = 3, L = 5;
  const size_t M = size_t(B) * L, nl = size_t(c.layers), dm = size_t(c.d_model);
  const size_t di = size_t(c.d_inner()), P = size_t(c.rank() + 2 * c.d_state);
  auto bytes = [&](bool bf16) {
    MambaModel<float, EmulatedOps> m(c, EmulatedOps(Device::cpu(), nullptr, {}));
    m.resize(B, L, bf16);
    return m.buffer_bytes();
  };
  const size_t fp32_only = (nl * M * dm + nl * M * di + M * 2 * di) * sizeof(float);
  const size_t copies = (M * size_t(c.din) + nl * M * dm + 2 * nl * M * di +
                         M * std::max(dm, 2 * di + std::max(di, P))) *
                        sizeof(uint16_t);
  EXPECT_EQ(bytes(true), bytes(false) - fp32_only + copies);
}

// A forward no backward follows (set_forward_only: validation, inference) has the scan make Δ
// from dt and dt_proj's weight: no dt_proj GEMM a layer, the output the full forward's within
// fp32 rounding (Δ's sums in another order), and a backward after it refused.
TEST(MambaEmulatedDevice, AForwardOnlyPassFoldsDtProjIntoTheScan) {
  const MambaConfig c = small_config(48, 16);  // dt_rank 3
  const int B = 3, L = 7;
  using Ops = EmulatedOps;
  const Sizes n(c, B, L);
  const size_t nx = n.x, ny = n.y;
  std::mt19937_64 rng(11);
  const std::vector<float> w = normal_values(n.w, rng), x = normal_values(nx, rng);
  std::vector<float> g(n.w), dx(nx), dy(ny, 0.1f);
  MambaModel<float, Ops> m(c, Ops(Device::cpu(), nullptr, {}));
  m.resize(B, L, false);
  auto forward = [&](bool only, long& gemms) {
    m.set_forward_only(only);
    std::vector<float> y(ny);
    capture::StepRecorder rec(nullptr);
    m.forward(x.data(), w.data(), nullptr, y.data());
    EXPECT_TRUE(rec.recording()) << rec.stop_reason();
    const auto ops = rec.finish();
    gemms = std::count_if(ops.begin(), ops.end(),
                          [](const auto& op) { return std::string(op.what).starts_with("gemm"); });
    capture::issue_ops(ops);
    rec.run_deferred();
    return y;
  };
  long full_gemms = 0, folded_gemms = 0;
  const std::vector<float> full = forward(false, full_gemms);
  const std::vector<float> folded = forward(true, folded_gemms);
  EXPECT_EQ(folded_gemms, full_gemms - c.layers);
  for (size_t i = 0; i < ny; ++i)
    ASSERT_NEAR(folded[i], full[i], 1e-5 * (1.0 + std::abs(full[i]))) << "y[" << i << "]";
  EXPECT_THROW(m.backward(x.data(), dy.data(), w.data(), nullptr, g.data(), dx.data()),
               std::logic_error);
}

// carry_all (a stream's frame in which every row goes on) gives the bits of carry with ones,
// window after window, with no launch for it (the state buffers trade places), and carried()
// follows the state the last forward left.
TEST(MambaEmulatedDevice, CarryAllIsCarryWithOnesWithoutALaunch) {
  const MambaConfig c = small_config(16, 8);
  const int B = 3, L = 2;
  using Ops = EmulatedOps;
  const Sizes n(c, B, L);
  const size_t ny = n.y;
  std::mt19937_64 rng(5);
  const std::vector<float> w = normal_values(n.w, rng);
  const std::vector<float> ones(size_t(B), 1.0f), zeros(size_t(B), 0.0f);
  MambaModel<float, Ops> copied(c, Ops(Device::cpu(), nullptr, {}));
  MambaModel<float, Ops> swapped(c, Ops(Device::cpu(), nullptr, {}));
  for (auto* m : {&copied, &swapped}) {
    m->set_carry(true);
    m->resize(B, L, false);
  }
  for (int window = 0; window < 4; ++window) {
    const std::vector<float> x = normal_values(n.x, rng);
    std::vector<float> y_copied(ny), y_swapped(ny);
    copied.carry(window == 0 ? zeros.data() : ones.data());
    copied.forward(x.data(), w.data(), nullptr, y_copied.data());
    std::vector<std::string> names;
    {
      capture::StepRecorder rec(nullptr);
      if (window == 0)
        swapped.carry(zeros.data());
      else
        swapped.carry_all();
      swapped.forward(x.data(), w.data(), nullptr, y_swapped.data());
      ASSERT_TRUE(rec.recording()) << rec.stop_reason();
      const auto ops = rec.finish();
      for (const auto& op : ops) names.emplace_back(op.what);
      capture::issue_ops(ops);
      rec.run_deferred();
    }
    EXPECT_EQ(y_copied, y_swapped) << "window " << window;
    EXPECT_EQ(std::count(names.begin(), names.end(), "scale_rows_kernel"), window == 0 ? 1 : 0);
    const auto& a = copied.carried();
    const auto& b = swapped.carried();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()), 0)
          << "carried " << i << ", window " << window;
  }
}

TEST(MambaEmulatedDevice, RejectsStateTooLargeForTheKernels) {
  MambaConfig c;
  c.d_state = 64;
  using Ops = ops::DeviceOps<EmulatedKernels>;
  EXPECT_THROW((MambaModel<float, Ops>(c, Ops(Device::cpu(), nullptr, {}))), std::invalid_argument);
}

}  // namespace
}  // namespace slipstream::nn::test
