// The NVML pieces `slipstream bench` uses for GPU busy %, against the stand-in libnvidia-ml
// (fake_nvml.cpp: GPU 0 at PCI 00000000:18:00.0 reads 87 % busy, GPU 1 at 2A:00.0 reads 5 %).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tools/smi/nvml.h"

namespace slipstream::smi {
namespace {

TEST(NvmlSampler, FindsAGpuByItsPciAddress) {
  const Nvml nvml(SMI_FAKE_NVML_PATH);
  EXPECT_EQ(nvml_index_of_pci(nvml, 0, 0x18, 0), 0u);
  EXPECT_EQ(nvml_index_of_pci(nvml, 0, 0x2a, 0), 1u);
  EXPECT_FALSE(nvml_index_of_pci(nvml, 0, 0x2a, 1).has_value());
  EXPECT_FALSE(nvml_index_of_pci(nvml, 1, 0x18, 0).has_value());
}

TEST(NvmlSampler, AveragesTheReadingsBetweenStartAndStop) {
  const Nvml nvml(SMI_FAKE_NVML_PATH);
  UtilizationSampler busy(nvml, 0, std::chrono::milliseconds(2));
  busy.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const auto mean = busy.stop();
  ASSERT_TRUE(mean.has_value());
  EXPECT_DOUBLE_EQ(*mean, 87.0);
  UtilizationSampler other(nvml, 1, std::chrono::milliseconds(2));
  other.start();
  EXPECT_DOUBLE_EQ(other.stop().value_or(-1), 5.0);  // however short the window
  EXPECT_DOUBLE_EQ(other.stop().value_or(-1), 5.0);  // a second stop says the same
}

TEST(NvmlSampler, NoNvmlMeansNoReading) {
  const Nvml nvml("/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(nvml_index_of_pci(nvml, 0, 0x18, 0).has_value());
  UtilizationSampler busy(nvml, 0, std::chrono::milliseconds(1));
  busy.start();
  EXPECT_FALSE(busy.stop().has_value());
}

}  // namespace
}  // namespace slipstream::smi
