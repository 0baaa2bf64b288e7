#include "engine/device.h"

#include <charconv>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "engine/memory_pool.h"

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace slipstream {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && !num.empty() && index >= 0)
      return Device::cuda(index);
  }
  throw std::invalid_argument("unknown device '" + std::string(text) +
                              "': expected cpu, cuda or cuda:N (N = 0, 1, ...)");
}

CudaProbe probe_cuda() {
  // The runtime's answers do not change during a run; probing costs a driver initialisation.
  static const CudaProbe probe = [] {
#if SLIPSTREAM_HAS_CUDA
    return cuda_rt::probe();
#else
    CudaProbe p;
    p.reason =
        "this build has no CUDA support (configured with SLIPSTREAM_CUDA=OFF or without nvcc)";
    return p;
#endif
  }();
  return probe;
}

namespace {
std::string describe_cuda_device(const CudaDeviceInfo& d) {
  return d.name + ", sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor) + ", " +
         format_bytes(d.total_memory);
}
}  // namespace

DeviceChoice choose_device(std::string_view request, int local_rank) {
  if (request == "cpu") return {Device::cpu(), "using cpu (requested)"};
  if (request == "emulated")
    return {Device::cpu(),
            "using the CUDA code path on the CPU emulator (requested: host memory, the CUDA "
            "kernels run by the emulator; for checking, not for speed)",
            true};
  const std::string rank_note =
      local_rank > 0 ? ", local rank " + std::to_string(local_rank) : std::string();
  if (request == "auto" || request.empty()) {
    CudaProbe p = probe_cuda();
    if (p.available && !p.devices.empty()) {
      const int i = local_device_index(local_rank, static_cast<int>(p.devices.size()));
      return {Device::cuda(i), "using cuda:" + std::to_string(i) + " (" +
                                   describe_cuda_device(p.devices[static_cast<size_t>(i)]) +
                                   rank_note + ")"};
    }
    return {Device::cpu(), "using cpu: " + p.reason};
  }
  Device d;
  try {
    d = parse_device(request);
  } catch (const std::invalid_argument&) {  // a typo: every request this function takes
    throw std::invalid_argument("unknown device '" + std::string(request) +
                                "': expected auto, cpu, cuda, cuda:N (N = 0, 1, ...) or emulated");
  }
  CudaProbe p = probe_cuda();
  if (!p.available)
    throw std::runtime_error("device " + std::string(request) +
                             " requested but CUDA is unavailable: " + p.reason +
                             "; device cpu (or auto) runs on the CPU");
  if (request == "cuda")
    d.index = local_device_index(local_rank, static_cast<int>(p.devices.size()));
  if (d.index >= static_cast<int>(p.devices.size()))
    throw std::runtime_error("device " + d.str() + " requested but this machine has " +
                             std::to_string(p.devices.size()) + " CUDA device(s) (cuda:0..cuda:" +
                             std::to_string(p.devices.size() - 1) + ")");
  return {d, "using " + d.str() + " (" + describe_cuda_device(p.devices[d.index]) + rank_note +
                 ", requested)"};
}

namespace {
std::string cpu_model_from_cpuid() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned regs[12] = {};
  // int in clang's cpuid.h, unsigned in GCC's.
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000, nullptr)) < 0x80000004u) return "";
  for (unsigned i = 0; i < 3; ++i)
    __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
  std::string s(reinterpret_cast<const char*>(regs), sizeof(regs));
  s = s.c_str();  // drop the NUL padding
  auto b = s.find_first_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b);
#else
  return "";
#endif
}
}  // namespace

CpuInfo probe_cpu() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    // x86 says "model name", some arm64 kernels "Model" or nothing at all.
    if (line.starts_with("model name") || line.starts_with("Model")) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto b = line.find_first_not_of(" \t", colon + 1);
        if (b != std::string::npos) info.model = line.substr(b);
      }
      break;
    }
  }
  if (info.model.empty()) info.model = cpu_model_from_cpuid();
  if (info.model.empty()) info.model = "unknown CPU";
  info.threads = static_cast<int>(std::thread::hardware_concurrency());
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init();
  info.avx2 = __builtin_cpu_supports("avx2");
  info.avx512f = __builtin_cpu_supports("avx512f");
  info.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
#if !defined(__clang__) || __clang_major__ >= 16  // older clang rejects the name (fuzz builds)
  info.amx_bf16 = __builtin_cpu_supports("amx-bf16");
#endif
#endif
  return info;
}

CudaLibraryVersions cuda_library_versions() {
#if SLIPSTREAM_HAS_CUDA
  return cuda_rt::library_versions();
#else
  return {};
#endif
}

uint64_t cuda_free_memory(int index) {
#if SLIPSTREAM_HAS_CUDA
  return cuda_rt::free_memory(index);
#else
  (void)index;
  throw std::runtime_error("this build has no CUDA: no device memory to ask about");
#endif
}

CudaSyncCounts cuda_sync_counts() {
#if SLIPSTREAM_HAS_CUDA
  return cuda_rt::sync_counts();
#else
  return {};
#endif
}

}  // namespace slipstream
