// Device pool, host<->device copies and the probe kernel. Labelled `gpu`: each test reports
// SKIPPED with the reason when this machine or build has no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "engine/diagnostics.h"
#include "engine/exec_context.h"
#include "engine/memory_pool.h"
#include "engine/tensor.h"

namespace slipstream {
namespace {

#define REQUIRE_CUDA_DEVICE()                                           \
  do {                                                                  \
    CudaProbe p_ = probe_cuda();                                        \
    if (!p_.available) GTEST_SKIP() << "no CUDA device: " << p_.reason; \
  } while (0)

TEST(GpuPool, StatsAndReuse) {
  REQUIRE_CUDA_DEVICE();
  MemoryPool& pool = Pools::device(0);
  EXPECT_EQ(pool.device(), Device::cuda(0));
  pool.release_cached();
  const PoolStats s0 = pool.stats();
  void* a = pool.allocate(5000, "gpu test a");
  PoolStats s1 = pool.stats();
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes + pool_size_class(5000));
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes + pool_size_class(5000));
  pool.deallocate(a, 5000);
  void* b = pool.allocate(4800, "gpu test b");  // same class, same (default) stream: reused
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.stats().reserved_bytes, s1.reserved_bytes);
  pool.deallocate(b, 4800);
  EXPECT_EQ(pool.stats().allocations, s0.allocations + 2);
  EXPECT_GE(pool.stats().peak_bytes, s1.in_use_bytes);
  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved_bytes, s0.reserved_bytes);
  const auto all = Pools::all();
  EXPECT_NE(std::find(all.begin(), all.end(), &pool), all.end());
}

TEST(GpuPool, OutOfMemoryNamesWhat) {
  REQUIRE_CUDA_DEVICE();
  MemoryPool& pool = Pools::device(0);
  const uint64_t failures = pool.stats().failures;
  try {
    (void)pool.allocate(size_t{1} << 50, "huge gpu test tensor");
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of device memory on cuda:0 allocating 1 PiB for huge gpu test tensor"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("device free"), std::string::npos) << msg;
  }
  EXPECT_EQ(pool.stats().failures, failures + 1);
}

TEST(GpuTensor, CopyRoundTrip) {
  REQUIRE_CUDA_DEVICE();
  Tensor h = Tensor::empty({64, 33}, DType::f32);
  std::iota(h.span<float>().begin(), h.span<float>().end(), 0.5f);
  Tensor d = Tensor::empty(h.shape(), DType::f32, Device::cuda(0), "gpu copy test");
  d.copy_from(h);
  Tensor d2 = d.slice_rows(10, 20).clone();
  EXPECT_EQ(d2.device(), Device::cuda(0));
  Tensor back = Tensor::zeros({10, 33}, DType::f32);
  back.copy_from(d2);
  for (int i = 0; i < 10 * 33; ++i) ASSERT_EQ(back.data<float>()[i], h.data<float>()[330 + i]);
  d.zero_();
  Tensor z = Tensor::empty(h.shape(), DType::f32);
  z.copy_from(d);
  for (float v : z.span<float>()) ASSERT_EQ(v, 0.0f);
}

TEST(GpuProbe, KernelRuns) {
  REQUIRE_CUDA_DEVICE();
  EXPECT_EQ(cuda_probe_kernel(0), "");
}

// Without a device the probe repeats why; with devices, one past the last is named missing.
TEST(GpuProbe, AMissingDeviceSaysWhy) {
  CudaProbe p = probe_cuda();
  if (!p.available) {
    EXPECT_EQ(cuda_probe_kernel(0), p.reason);
    return;
  }
  const int missing = static_cast<int>(p.devices.size());
  EXPECT_EQ(cuda_probe_kernel(missing), "no device cuda:" + std::to_string(missing));
}

}  // namespace
// add_f32 on a device, enqueued on a stream of its own (two consumers' gradients of a tensor).
TEST(GpuTensor, AddF32OnAStream) {
  REQUIRE_CUDA_DEVICE();
  const ExecContext exec(Device::cuda(0));
  std::vector<float> ha(1000), hb(1000);
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = float(i), hb[i] = -0.25f * float(i);
  Tensor a = Tensor::empty({1000}, DType::f32, Device::cuda(0)), b = a.clone();
  a.copy_from(Tensor::borrow(ha.data(), {1000}, DType::f32));
  b.copy_from(Tensor::borrow(hb.data(), {1000}, DType::f32));
  Tensor out = Tensor::empty({1000}, DType::f32, Device::cuda(0), "sum", exec.stream());
  add_f32(a, b, out, exec.stream());
  std::vector<float> got(1000);
  exec.read_back(got.data(), out.raw(), out.nbytes());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0.75f * float(i)) << i;
}

// A kernel writes into page-locked host memory at the address CUDA maps it at
// (ExecContext::device_address_of_host), and read_back_written reports it with no copy: the
// policy's answers' path (stages/melee/controller_sampler.cpp). Pageable memory has no address.
TEST(GpuReadBacks, AKernelWritesIntoMappedHostMemory) {
  REQUIRE_CUDA_DEVICE();
  Pools::enable_pinned_host(true);  // as a CUDA run's Runner does
  const ExecContext exec(Device::cuda(0));
  std::vector<float> ha(1000), hb(1000);
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = float(i), hb[i] = 0.5f * float(i);
  Tensor a = Tensor::empty({1000}, DType::f32, Device::cuda(0)), b = a.clone();
  a.copy_from(Tensor::borrow(ha.data(), {1000}, DType::f32));
  b.copy_from(Tensor::borrow(hb.data(), {1000}, DType::f32));
  Tensor host = Tensor::empty({1000}, DType::f32, Device::cpu(), "mapped answers");
  void* mapped = exec.device_address_of_host(host.raw());
  ASSERT_NE(mapped, nullptr) << "the pinned host pool's memory is not mapped for kernels";
  add_f32(a, b, Tensor::borrow(mapped, {1000}, DType::f32, Device::cuda(0)), exec.stream());
  std::vector<float> got;
  exec.read_back_written(host.raw(), [&](const void* p) {
    got.assign(static_cast<const float*>(p), static_cast<const float*>(p) + 1000);
  });
  EXPECT_TRUE(got.empty()) << "reported before its group completed";
  exec.complete_read_backs();
  ASSERT_EQ(got.size(), 1000u);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 1.5f * float(i)) << i;
  std::vector<float> pageable(16);
  EXPECT_EQ(exec.device_address_of_host(pageable.data()), nullptr);
}

}  // namespace slipstream
