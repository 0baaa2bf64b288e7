// The Mamba model's device path (DeviceOps over the CUDA kernel sources) on the CPU emulator,
// against the CPU model in float64: every build runs the code a GPU run executes, except
// cuBLASLt (the emulated GEMM is the CPU's) and the stream's concurrency.
#include "kernels/cuda_kernels.h"
#include "tests/nn/mamba_device_checks.h"

namespace slipstream::nn::test {
namespace {

using kernels::EmulatedKernels;

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

TEST(MambaEmulatedDevice, RejectsStateTooLargeForTheKernels) {
  MambaConfig c;
  c.d_state = 64;
  using Ops = ops::DeviceOps<EmulatedKernels>;
  EXPECT_THROW((MambaModel<float, Ops>(c, Ops(Device::cpu(), nullptr, {}))), std::invalid_argument);
}

}  // namespace
}  // namespace slipstream::nn::test
