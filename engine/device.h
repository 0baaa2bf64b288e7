// Where tensors live and stages run, how the run's device is chosen, and what this machine has.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace slipstream {

struct Device {
  enum class Type : uint8_t { cpu, cuda };
  Type type = Type::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int i) { return {Type::cuda, i}; }
  bool is_cpu() const { return type == Type::cpu; }
  bool is_cuda() const { return type == Type::cuda; }
  std::string str() const;  // "cpu", "cuda:0"
  bool operator==(const Device&) const = default;
};

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  uint64_t total_memory = 0;
  int multiprocessors = 0;
  int pci_domain = 0, pci_bus = 0, pci_device = 0;  // where NVML's readings of it are found
};

// What the CUDA runtime says about this machine. On a CPU-only build or a machine without the
// NVIDIA driver, `available` is false and `reason` says why; nothing here ever aborts.
struct CudaProbe {
  bool built_with_cuda = false;
  bool available = false;
  std::string reason;      // why not available ("no NVIDIA driver: ...", "no CUDA device")
  int driver_version = 0;  // e.g. 13000, 0 when unknown
  int runtime_version = 0;
  std::vector<CudaDeviceInfo> devices;
};
CudaProbe probe_cuda();  // cached after the first call

struct DeviceChoice {
  Device device;
  std::string reason;         // one line for the user: which device and why
  bool emulate_cuda = false;  // "emulated": the CUDA code path on the CPU emulator
};
// request: "auto", "cpu", "cuda", "cuda:N", "emulated" (host memory, the CUDA kernels on the
// CPU emulator: checks a graph's device path without a GPU; slow). "auto" and "cuda" take the
// GPU of this process's local rank (launch.h) among the visible ones (CUDA_VISIBLE_DEVICES
// applies), local_rank mod count; "cuda:N" is device N whatever the rank. "auto" picks cuda:0 when
// a driver and a device exist, else the CPU. An explicit CUDA request that cannot be met throws
// std::runtime_error with the reason.
DeviceChoice choose_device(std::string_view request, int local_rank = 0);
// The visible GPU a local rank trains on.
inline int local_device_index(int local_rank, int device_count) {
  return device_count > 0 ? local_rank % device_count : 0;
}
// Parses "cpu" / "cuda" / "cuda:N" without probing; throws std::invalid_argument.
Device parse_device(std::string_view text);

struct CpuInfo {
  std::string model;
  int threads = 0;
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false;
};
CpuInfo probe_cpu();

// Versions of the CUDA libraries this build links ("" when not built with CUDA).
struct CudaLibraryVersions {
  std::string cublas, cudnn, nccl;
};
CudaLibraryVersions cuda_library_versions();

// Host waits on the device so far, by kind (all zero without CUDA): what a steady-state step
// may not do (wait for the whole device) and what it does once (wait for its stream).
struct CudaSyncCounts {
  uint64_t device = 0;  // cudaDeviceSynchronize: synchronous copies, fills, setup
  uint64_t stream = 0;  // cudaStreamSynchronize
  uint64_t event = 0;   // cudaEventSynchronize
};
CudaSyncCounts cuda_sync_counts();

// Bytes of device `index`'s memory free now (cudaMemGetInfo); throws without CUDA.
uint64_t cuda_free_memory(int index);

}  // namespace slipstream
