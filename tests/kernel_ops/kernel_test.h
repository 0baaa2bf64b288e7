// One test source per op, compiled three times (tests/kernel_ops/CMakeLists.txt): into
// kernel_ops_cpu_test (the CPU reference: float64 gradient checks; label unit),
// kernel_ops_emulated_test (the CUDA source on the CPU emulator against the reference; label
// unit) and, in CUDA builds, kernel_ops_gpu_test (the same checks on a device; label gpu,
// SKIPPED without one).
//
//   CPU_TEST(Suite, Name) { ... }     the reference alone; only in the CPU build
//   KERNEL_TEST(Suite, Name) { ... }  runs the op from `Kernels` (the kernel table of this build,
//                                     kernels/cuda_kernels.h) on memory from `Mem`
//                                     (tests/kernels_cuda/device_checks.h's interface)
//   DEVICE_TEST(Suite, Name) { ... }  a KERNEL_TEST of the gpu build alone: the shapes only
//                                     hardware runs in reasonable time (gpu_standard's)
//
// The reference's own tests and their helpers go between `#if SLIPSTREAM_REFERENCE_TESTS` and
// `#endif`, so the other builds neither compile nor link what only they use.
//
// A test source includes this header and writes its checks once; the build it is in decides
// which of them exist and where the kernels run.
#pragma once

#include <gtest/gtest.h>

#include "kernels/cuda_kernels.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

#define SLIPSTREAM_KERNEL_TEST_CPU 1
#define SLIPSTREAM_KERNEL_TEST_EMULATED 2
#define SLIPSTREAM_KERNEL_TEST_GPU 3

#if SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_GPU
#include "tests/kernels_cuda/cuda_memory.h"
#endif

namespace slipstream::kernels::test {

// A device test may add the shapes only hardware runs in reasonable time (gpu_standard's).
inline constexpr bool kOnDevice = SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_GPU;

#if SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_GPU
using Kernels = CudaKernels;
using Mem = CudaMemory;
#else
using Kernels = EmulatedKernels;
// The emulated GEMM needs no handle or workspace.
struct Mem : EmulatedMemory {
  Kernels::GemmContext gemm_context() const { return {}; }
};
#endif

}  // namespace slipstream::kernels::test

// A test of another build: a function template never instantiated, so its body (which may
// name kernels this binary does not link) is checked by the compiler but emits no code.
#define SLIPSTREAM_UNUSED_TEST(suite, name) \
  template <class = void>                   \
  [[maybe_unused]] void suite##_##name##_unused()

#define SLIPSTREAM_REFERENCE_TESTS (SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_CPU)

#if SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_CPU
#define CPU_TEST(suite, name) TEST(suite, name)
#define KERNEL_TEST(suite, name) SLIPSTREAM_UNUSED_TEST(suite, name)
#define DEVICE_TEST(suite, name) SLIPSTREAM_UNUSED_TEST(suite, name)
#elif SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_EMULATED
#define CPU_TEST(suite, name) SLIPSTREAM_UNUSED_TEST(suite, name)
#define KERNEL_TEST(suite, name) TEST(Emulated##suite, name)
#define DEVICE_TEST(suite, name) SLIPSTREAM_UNUSED_TEST(suite, name)
#elif SLIPSTREAM_KERNEL_TEST_BUILD == SLIPSTREAM_KERNEL_TEST_GPU
#define CPU_TEST(suite, name) SLIPSTREAM_UNUSED_TEST(suite, name)
// The body runs after the device check, which skips the test on a machine without a GPU.
#define KERNEL_TEST(suite, name)            \
  static void suite##_##name##_on_device(); \
  TEST(Gpu##suite, name) {                  \
    REQUIRE_DEVICE();                       \
    suite##_##name##_on_device();           \
  }                                         \
  static void suite##_##name##_on_device()
#define DEVICE_TEST(suite, name) KERNEL_TEST(suite, name)
#else
#error "SLIPSTREAM_KERNEL_TEST_BUILD: 1 (cpu), 2 (emulated) or 3 (gpu)"
#endif
