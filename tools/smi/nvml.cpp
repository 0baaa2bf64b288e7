#include "nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace slipstream::smi {
namespace {

// Our own declarations of the few NVML types we use, copied from NVIDIA's nvml.h (API 12):
// the toolkit here ships no nvml.h, and dlopen needs no import library. C enums are passed as
// int-sized values, so they are declared as int.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr int NVML_TEMPERATURE_GPU = 0;  // nvmlTemperatureSensors_t
constexpr int NVML_CLOCK_GRAPHICS = 0;   // nvmlClockType_t
constexpr int NVML_CLOCK_SM = 1;
constexpr int NVML_CLOCK_MEM = 2;
constexpr unsigned NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;
constexpr unsigned NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlMemory_v2_t {
  unsigned int version;  // nvmlMemory_v2: sizeof | 2 << 24 (NVML_STRUCT_VERSION)
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned int nvmlMemory_v2 =
    static_cast<unsigned int>(sizeof(nvmlMemory_v2_t) | 2u << 24);
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
};
static_assert(sizeof(nvmlMemory_v2_t) == 40 && sizeof(nvmlPciInfo_t) == 68);

}  // namespace

// Function pointers resolved with dlsym; the optional ones may be null on old drivers.
struct Nvml::Api {
  void* handle = nullptr;
  bool initialised = false;
  nvmlReturn_t (*Init_v2)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*DeviceGetCount_v2)(unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetHandleByIndex_v2)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*SystemGetDriverVersion)(char*, unsigned int) = nullptr;
  nvmlReturn_t (*SystemGetCudaDriverVersion)(int*) = nullptr;
  nvmlReturn_t (*DeviceGetName)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetPciInfo_v3)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*DeviceGetTemperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetFanSpeed)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetPerformanceState)(nvmlDevice_t, int*) = nullptr;
  nvmlReturn_t (*DeviceGetPowerUsage)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetEnforcedPowerLimit)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*DeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*DeviceGetClockInfo)(nvmlDevice_t, int, unsigned int*) = nullptr;

  template <class Fn>
  void bind(Fn& fn, const char* symbol) {
    fn = reinterpret_cast<Fn>(::dlsym(handle, symbol));
  }
  std::string error_text(nvmlReturn_t rc) const {
    const char* s = ErrorString ? ErrorString(rc) : nullptr;
    return s ? std::string(s) : "NVML error " + std::to_string(rc);
  }
};

Nvml::Nvml(const std::string& library) {
  std::string lib = library;
  if (lib.empty()) {
    const char* env = std::getenv("SLIPSTREAM_SMI_NVML_PATH");
    lib = env && *env ? env : "libnvidia-ml.so.1";
  }
  auto api = std::make_unique<Api>();
  api->handle = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!api->handle) {
    const char* err = ::dlerror();
    unavailable_reason_ = lib + " not loadable (" + (err ? err : "unknown dlopen error") + ")";
    return;
  }
  api->bind(api->Init_v2, "nvmlInit_v2");
  api->bind(api->Shutdown, "nvmlShutdown");
  api->bind(api->ErrorString, "nvmlErrorString");
  api->bind(api->DeviceGetCount_v2, "nvmlDeviceGetCount_v2");
  api->bind(api->DeviceGetHandleByIndex_v2, "nvmlDeviceGetHandleByIndex_v2");
  api->bind(api->SystemGetDriverVersion, "nvmlSystemGetDriverVersion");
  api->bind(api->SystemGetCudaDriverVersion, "nvmlSystemGetCudaDriverVersion");
  api->bind(api->DeviceGetName, "nvmlDeviceGetName");
  api->bind(api->DeviceGetPciInfo_v3, "nvmlDeviceGetPciInfo_v3");
  api->bind(api->DeviceGetTemperature, "nvmlDeviceGetTemperature");
  api->bind(api->DeviceGetFanSpeed, "nvmlDeviceGetFanSpeed");
  api->bind(api->DeviceGetPerformanceState, "nvmlDeviceGetPerformanceState");
  api->bind(api->DeviceGetPowerUsage, "nvmlDeviceGetPowerUsage");
  api->bind(api->DeviceGetEnforcedPowerLimit, "nvmlDeviceGetEnforcedPowerLimit");
  api->bind(api->DeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  api->bind(api->DeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
  api->bind(api->DeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates");
  api->bind(api->DeviceGetClockInfo, "nvmlDeviceGetClockInfo");
  if (!api->Init_v2 || !api->Shutdown || !api->DeviceGetCount_v2 ||
      !api->DeviceGetHandleByIndex_v2) {
    unavailable_reason_ = lib + " lacks the NVML entry points nvmlInit_v2/nvmlDeviceGetCount_v2";
    ::dlclose(api->handle);
    return;
  }
  if (nvmlReturn_t rc = api->Init_v2(); rc != NVML_SUCCESS) {
    unavailable_reason_ = "nvmlInit failed (" + api->error_text(rc) + ")";
    ::dlclose(api->handle);
    return;
  }
  api->initialised = true;
  api_ = std::move(api);
}

Nvml::~Nvml() {
  if (api_) {
    if (api_->initialised) api_->Shutdown();
    ::dlclose(api_->handle);
  }
}

unsigned Nvml::device_count() const {
  unsigned int n = 0;
  if (!api_ || api_->DeviceGetCount_v2(&n) != NVML_SUCCESS) return 0;
  return n;
}

GpuReport Nvml::query(const std::vector<unsigned>& select) const {
  GpuReport report;
  if (!api_) {
    report.unavailable_reason = unavailable_reason_;
    return report;
  }
  const Api& a = *api_;
  unsigned int count = 0;
  if (nvmlReturn_t rc = a.DeviceGetCount_v2(&count); rc != NVML_SUCCESS) {
    report.unavailable_reason = "nvmlDeviceGetCount failed (" + a.error_text(rc) + ")";
    return report;
  }
  if (count == 0) {
    report.unavailable_reason = "NVML reports no devices";
    return report;
  }
  report.available = true;
  if (a.SystemGetDriverVersion) {
    char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
    if (a.SystemGetDriverVersion(buf, sizeof buf) == NVML_SUCCESS) report.driver_version = buf;
  }
  if (int v = 0; a.SystemGetCudaDriverVersion && a.SystemGetCudaDriverVersion(&v) == NVML_SUCCESS)
    report.cuda_version = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);

  for (unsigned i = 0; i < count; ++i) {
    if (!select.empty() && std::find(select.begin(), select.end(), i) == select.end()) continue;
    GpuInfo g;
    g.index = i;
    nvmlDevice_t dev = nullptr;
    if (a.DeviceGetHandleByIndex_v2(i, &dev) != NVML_SUCCESS) {
      g.name = "[GPU is lost or inaccessible]";
      report.gpus.push_back(std::move(g));
      continue;
    }
    unsigned int u = 0;
    auto get = [&](auto fn, std::optional<unsigned>& out, auto... args) {
      if (fn && fn(dev, args..., &u) == NVML_SUCCESS) out = u;
    };
    if (char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {};
        a.DeviceGetName && a.DeviceGetName(dev, name, sizeof name) == NVML_SUCCESS)
      g.name = name;
    if (nvmlPciInfo_t pci{};
        a.DeviceGetPciInfo_v3 && a.DeviceGetPciInfo_v3(dev, &pci) == NVML_SUCCESS)
      g.bus_id.assign(pci.busId, strnlen(pci.busId, sizeof pci.busId));
    get(a.DeviceGetTemperature, g.temperature_c, NVML_TEMPERATURE_GPU);
    get(a.DeviceGetFanSpeed, g.fan_percent);
    if (int p = 0; a.DeviceGetPerformanceState &&
                   a.DeviceGetPerformanceState(dev, &p) == NVML_SUCCESS && p >= 0 && p <= 15)
      g.pstate = p;
    get(a.DeviceGetPowerUsage, g.power_mw);
    get(a.DeviceGetEnforcedPowerLimit, g.power_limit_mw);
    // v2 separates driver-reserved memory from used, as nvidia-smi shows it; v1 on old drivers.
    nvmlMemory_v2_t m2{};
    m2.version = nvmlMemory_v2;
    if (a.DeviceGetMemoryInfo_v2 && a.DeviceGetMemoryInfo_v2(dev, &m2) == NVML_SUCCESS) {
      g.memory_used_bytes = m2.used;
      g.memory_total_bytes = m2.total;
    } else if (nvmlMemory_t m1{};
               a.DeviceGetMemoryInfo && a.DeviceGetMemoryInfo(dev, &m1) == NVML_SUCCESS) {
      g.memory_used_bytes = m1.used;
      g.memory_total_bytes = m1.total;
    }
    if (nvmlUtilization_t ut{};
        a.DeviceGetUtilizationRates && a.DeviceGetUtilizationRates(dev, &ut) == NVML_SUCCESS) {
      g.utilization_gpu_percent = ut.gpu;
      g.utilization_memory_percent = ut.memory;
    }
    get(a.DeviceGetClockInfo, g.clock_sm_mhz, NVML_CLOCK_SM);
    get(a.DeviceGetClockInfo, g.clock_graphics_mhz, NVML_CLOCK_GRAPHICS);
    get(a.DeviceGetClockInfo, g.clock_memory_mhz, NVML_CLOCK_MEM);
    report.gpus.push_back(std::move(g));
  }
  return report;
}

std::optional<unsigned> nvml_index_of_pci(const Nvml& nvml, int domain, int bus, int device) {
  const GpuReport r = nvml.query({});
  for (const GpuInfo& g : r.gpus) {
    unsigned d = 0, b = 0, v = 0, f = 0;  // "00000000:3B:00.0"
    if (std::sscanf(g.bus_id.c_str(), "%x:%x:%x.%x", &d, &b, &v, &f) == 4 &&
        d == unsigned(domain) && b == unsigned(bus) && v == unsigned(device))
      return g.index;
  }
  return std::nullopt;
}

UtilizationSampler::UtilizationSampler(const Nvml& nvml, unsigned index,
                                       std::chrono::milliseconds interval)
    : nvml_(nvml), index_(index), interval_(interval) {}

UtilizationSampler::~UtilizationSampler() {
  stop();
}

void UtilizationSampler::start() {
  std::lock_guard lock(mu_);
  if (running_) return;
  running_ = true;
  readings_.clear();
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (running_) {
      lock.unlock();
      const GpuReport r = nvml_.query({index_});
      lock.lock();
      if (!r.gpus.empty() && r.gpus[0].utilization_gpu_percent)
        readings_.push_back(*r.gpus[0].utilization_gpu_percent);
      wake_.wait_for(lock, interval_, [this] { return !running_; });
    }
  });
}

std::optional<double> UtilizationSampler::stop() {
  {
    std::lock_guard lock(mu_);
    running_ = false;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  if (readings_.empty()) {  // a window shorter than the first reading: one reading now
    const GpuReport r = nvml_.query({index_});
    if (!r.gpus.empty() && r.gpus[0].utilization_gpu_percent)
      readings_.push_back(*r.gpus[0].utilization_gpu_percent);
  }
  if (readings_.empty()) return std::nullopt;
  double sum = 0;
  for (unsigned v : readings_) sum += v;
  return sum / static_cast<double>(readings_.size());
}

}  // namespace slipstream::smi
