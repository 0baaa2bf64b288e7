// The one-launch Mamba frame (kernels/mamba_frame.h) on the CPU emulator: the checks of
// tests/nn/mamba_frame_checks.h, the fallback to the layers where a model does not fit the kernel,
// and the form's switch in the environment.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda_kernels.h"
#include "tests/nn/mamba_frame_checks.h"

namespace slipstream::nn::test {
namespace {

using kernels::EmulatedKernels;
using EmulatedOps = ops::DeviceOps<EmulatedKernels>;

TEST(MambaFrameEmulated, MatchesTheLayersAndTheCpu) {
  uint64_t seed = 31;
  for (const auto& k : mamba_frame_cases())
    check_mamba_frame<EmulatedKernels>(k, Device::cpu(), nullptr, {}, seed++);
}

// The launches of one frame of a model (rows 2, carry from zeros) as the step recorder sees them.
std::vector<std::string> frame_launches(const MambaConfig& c, bool bf16) {
  MambaModel<float, EmulatedOps> m(c, EmulatedOps(Device::cpu(), nullptr, {}));
  m.set_carry(true);
  m.resize(2, 1, bf16);
  m.set_forward_only(true);
  const MambaLayout lay(c);
  std::vector<float> w(lay.params.total(), 0.01f), x(size_t(2) * size_t(c.din), 0.5f),
      y(size_t(2) * size_t(c.d_model)), zeros(2, 0.0f);
  std::vector<uint16_t> wb(w.size());
  kernels::fp32_to_bf16(w.data(), wb.data(), w.size());
  capture::StepRecorder rec(nullptr);
  m.carry(zeros.data());
  m.forward(x.data(), w.data(), bf16 ? wb.data() : nullptr, y.data());
  EXPECT_TRUE(rec.recording()) << rec.stop_reason();
  const auto ops = rec.finish();
  std::vector<std::string> names;
  for (const auto& op : ops) names.emplace_back(op.what);
  capture::issue_ops(ops);
  rec.run_deferred();
  return names;
}
long count(const std::vector<std::string>& names, const std::string& what) {
  return std::count(names.begin(), names.end(), what);
}

// A model past the kernel's sizes (d_model 600 > 512) takes the layers' frame with the switch on;
// the switch off, every model does; a window of more than one step, or a forward a backward
// follows, never takes it.
TEST(MambaFrameEmulated, FallsBackToTheLayersWhereTheModelDoesNotFit) {
  const bool was = EmulatedKernels::mamba_frame_fused();
  EmulatedKernels::set_mamba_frame_fused(true);
  MambaConfig fits;
  fits.din = 12, fits.d_model = 16, fits.d_state = 8, fits.layers = 2;
  MambaConfig wide = fits;
  wide.d_model = 600;
  EXPECT_EQ(count(frame_launches(fits, false), "mamba_frame_kernel"), 1);
  EXPECT_EQ(count(frame_launches(fits, true), "mamba_frame_kernel"), 1);
  const auto wide_names = frame_launches(wide, false);
  EXPECT_EQ(count(wide_names, "mamba_frame_kernel"), 0);
  EXPECT_EQ(count(wide_names, "conv_forward_kernel"), wide.layers);
  EmulatedKernels::set_mamba_frame_fused(false);
  EXPECT_EQ(count(frame_launches(fits, false), "mamba_frame_kernel"), 0);
  EmulatedKernels::set_mamba_frame_fused(true);
  MambaModel<float, EmulatedOps> m(fits, EmulatedOps(Device::cpu(), nullptr, {}));
  for (const auto& [L, only] : {std::pair{2, true}, std::pair{1, false}}) {
    m.resize(2, L, false);
    m.set_forward_only(only);
    const MambaLayout lay(fits);
    std::vector<float> w(lay.params.total(), 0.01f), x(size_t(2 * L) * size_t(fits.din), 0.5f),
        y(size_t(2 * L) * size_t(fits.d_model));
    capture::StepRecorder rec(nullptr);
    m.forward(x.data(), w.data(), nullptr, y.data());
    const auto ops = rec.finish();
    EXPECT_TRUE(
        std::none_of(ops.begin(), ops.end(),
                     [](const auto& op) { return std::string(op.what) == "mamba_frame_kernel"; }))
        << "L " << L << (only ? " forward only" : " with a backward");
    capture::issue_ops(ops);
    rec.run_deferred();
  }
  EmulatedKernels::set_mamba_frame_fused(was);
}

// The form the environment names (SLIPSTREAM_MAMBA_FRAME, read once: ctest runs this test with
// `fused`, and with a name that is no form, whose error the first frame throws).
TEST(MambaFrameEmulated, TakesTheFormTheEnvironmentNames) {
  const char* e = std::getenv("SLIPSTREAM_MAMBA_FRAME");
  const bool fused = e && std::string(e) == "fused";
  MambaConfig c;
  c.din = 12, c.d_model = 16, c.d_state = 8, c.layers = 1;
  EXPECT_EQ(count(frame_launches(c, false), "mamba_frame_kernel"), fused ? 1 : 0);
}

}  // namespace
}  // namespace slipstream::nn::test
