// Device parsing and choice, CPU probing, and the `devices` / `doctor` reports. The fallback
// tests describe this build machine (no NVIDIA driver); on a GPU machine they check the CUDA
// side instead.
#include "engine/device.h"

#include <gtest/gtest.h>

#include <sstream>

#include "engine/diagnostics.h"
#include "engine/memory_pool.h"

namespace slipstream {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Device, StrAndParse) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:1"), Device::cuda(1));
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", "auto", "cuda:0:1"})
    EXPECT_THROW(parse_device(bad), std::invalid_argument) << bad;
  try {
    parse_device("gpu");
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "'gpu'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "cuda:N")) << e.what();
  }
}

TEST(Device, ProbeIsCachedAndConsistent) {
  CudaProbe a = probe_cuda(), b = probe_cuda();
  EXPECT_EQ(a.available, b.available);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.built_with_cuda, bool(SLIPSTREAM_HAS_CUDA));
  if (a.available) {
    EXPECT_FALSE(a.devices.empty());
  } else {
    EXPECT_FALSE(a.reason.empty());
    EXPECT_TRUE(a.devices.empty());
  }
  if (!SLIPSTREAM_HAS_CUDA) {
    EXPECT_TRUE(contains(a.reason, "this build has no CUDA support"));
  }
}

TEST(Device, ChooseCpu) {
  DeviceChoice c = choose_device("cpu");
  EXPECT_TRUE(c.device.is_cpu());
  EXPECT_FALSE(c.reason.empty());
}

// The real situation on a machine without the NVIDIA driver, in CPU and CUDA builds alike.
TEST(Device, FallbackWithoutDriver) {
  CudaProbe p = probe_cuda();
  if (p.available) GTEST_SKIP() << "a CUDA device is present";
  DeviceChoice c = choose_device("auto");
  EXPECT_TRUE(c.device.is_cpu());
  EXPECT_EQ(c.reason, "using cpu: " + p.reason);
  if (SLIPSTREAM_HAS_CUDA && p.driver_version == 0) {
    EXPECT_TRUE(contains(p.reason, "no NVIDIA driver: libcuda.so.1 not found (CUDA runtime says:"))
        << p.reason;
  }
  for (const char* req : {"cuda", "cuda:0", "cuda:1"}) {
    try {
      choose_device(req);
      FAIL() << req << " should throw";
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(contains(e.what(), p.reason)) << e.what();
      EXPECT_TRUE(contains(e.what(), "device cpu (or auto) runs on the CPU")) << e.what();
    }
  }
  EXPECT_THROW(choose_device("tpu"), std::invalid_argument);
  try {  // a typo lists every request the choice takes, not only parse_device's
    choose_device("gpu");
    FAIL() << "gpu should throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "expected auto, cpu, cuda, cuda:N (N = 0, 1, ...) or emulated"))
        << e.what();
  }
  EXPECT_THROW(Pools::device(0), std::runtime_error);
}

TEST(Device, AutoPicksCudaWhenPresent) {
  CudaProbe p = probe_cuda();
  if (!p.available) GTEST_SKIP() << "no CUDA device: " << p.reason;
  DeviceChoice c = choose_device("auto");
  EXPECT_EQ(c.device, Device::cuda(0));
  EXPECT_TRUE(contains(c.reason, "using cuda:0 (" + p.devices[0].name)) << c.reason;
  EXPECT_THROW(choose_device("cuda:" + std::to_string(p.devices.size())), std::runtime_error);
}

TEST(Device, ProbeCpu) {
  CpuInfo c = probe_cpu();
  EXPECT_FALSE(c.model.empty());
  EXPECT_GE(c.threads, 1);
  if (c.avx512_bf16) {
    EXPECT_TRUE(c.avx512f);
  }
}

TEST(Device, LibraryVersions) {
  CudaLibraryVersions v = cuda_library_versions();
  if (!SLIPSTREAM_HAS_CUDA) {
    EXPECT_TRUE(v.cublas.empty() && v.cudnn.empty() && v.nccl.empty());
    return;
  }
  // Library versions need no GPU.
  EXPECT_FALSE(v.cublas.empty());
  EXPECT_TRUE(v.cudnn.starts_with("9.")) << v.cudnn;
  EXPECT_TRUE(v.nccl.starts_with("2.")) << v.nccl;
}

TEST(Diagnostics, DevicesReport) {
  const std::string r = devices_report();
  std::cout << r;
  EXPECT_TRUE(contains(r, probe_cpu().model)) << r;
  EXPECT_TRUE(contains(r, "AVX2")) << r;
  EXPECT_TRUE(contains(r, "platform: ")) << r;
  CudaProbe p = probe_cuda();
  if (p.available) {
    EXPECT_TRUE(contains(r, p.devices[0].name)) << r;
  } else {
    EXPECT_TRUE(contains(r, "no CUDA device: " + p.reason)) << r;
  }
  if (SLIPSTREAM_HAS_CUDA) {
    EXPECT_TRUE(contains(r, "cuDNN 9.")) << r;
  }
}

TEST(Diagnostics, DoctorOnThisMachine) {
  std::ostringstream out;
  int rc = run_doctor(out, "auto");
  const std::string r = out.str();
  std::cout << r;
  EXPECT_TRUE(contains(r, "OK    cpu: ")) << r;
  EXPECT_TRUE(contains(r, "OK    host memory pool")) << r;
  CudaProbe p = probe_cuda();
  if (p.available) {
    EXPECT_EQ(rc, 0) << r;
    EXPECT_TRUE(contains(r, "OK    probe kernel")) << r;
    return;
  }
  EXPECT_EQ(rc, 0) << r;  // the CPU path works
  EXPECT_TRUE(contains(r, "OK    device auto: using cpu")) << r;
  if (SLIPSTREAM_HAS_CUDA) {
    if (p.driver_version == 0) {
      EXPECT_TRUE(contains(r, "FAIL  nvidia driver: libcuda.so.1 cannot be loaded")) << r;
      EXPECT_TRUE(contains(r, "fix: install the NVIDIA driver")) << r;
      EXPECT_TRUE(contains(r, "or use --device cpu")) << r;
    }
    EXPECT_TRUE(contains(r, "SKIP  probe kernel")) << r;
    EXPECT_TRUE(contains(r, "OK    cudnn: ")) << r;
  } else {
    EXPECT_TRUE(contains(r, "SKIP  cuda build")) << r;
    EXPECT_TRUE(contains(r, "SKIP  nvidia driver")) << r;
  }
  // Asking for CUDA explicitly on a machine that cannot give it is an error with a fix.
  std::ostringstream cuda_out;
  EXPECT_EQ(run_doctor(cuda_out, "cuda"), 1) << cuda_out.str();
  EXPECT_TRUE(contains(cuda_out.str(), "FAIL  device cuda: ")) << cuda_out.str();
  std::ostringstream cpu_out;
  EXPECT_EQ(run_doctor(cpu_out, "cpu"), 0) << cpu_out.str();
}

}  // namespace
}  // namespace slipstream
