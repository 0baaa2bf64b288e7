// A stand-in for libnvidia-ml.so.1: two GPUs with fixed readings, the NVML signatures as in
// NVIDIA's nvml.h. GPU 1's fan is "not supported" so the tool must print N/A for it.
// FAKE_NVML_NO_V2=1 makes nvmlDeviceGetMemoryInfo_v2 fail so the v1 fallback shows.
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
using nvmlReturn_t = int;
constexpr nvmlReturn_t kSuccess = 0, kInvalidArgument = 2, kNotSupported = 3,
                       kFunctionNotFound = 13, kArgumentVersionMismatch = 25;
struct Device {
  const char* name;
  const char* bus_id;
};
Device devices[] = {{"Fake GPU Alpha", "00000000:18:00.0"}, {"Fake GPU Beta", "00000000:2A:00.0"}};
bool initialised = false;

int index_of(void* dev) {
  for (int i = 0; i < 2; ++i) {
    if (dev == &devices[i]) return i;
  }
  return -1;
}
}  // namespace

extern "C" {

struct nvmlMemory_t {
  unsigned long long total, free, used;
};
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

nvmlReturn_t nvmlInit_v2() {
  initialised = true;
  return kSuccess;
}
nvmlReturn_t nvmlShutdown() {
  initialised = false;
  return kSuccess;
}
const char* nvmlErrorString(nvmlReturn_t rc) {
  return rc == 0 ? "Success" : "Fake NVML error";
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialised) return 1;  // NVML_ERROR_UNINITIALIZED
  *count = 2;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= 2) return kInvalidArgument;
  *device = &devices[index];
  return kSuccess;
}
nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  std::snprintf(version, length, "%s", "550.54.15");
  return kSuccess;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  *version = 12040;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetName(void* dev, char* name, unsigned int length) {
  int i = index_of(dev);
  if (i < 0) return kInvalidArgument;
  std::snprintf(name, length, "%s", devices[i].name);
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(void* dev, nvmlPciInfo_t* pci) {
  int i = index_of(dev);
  if (i < 0) return kInvalidArgument;
  std::memset(pci, 0, sizeof *pci);
  std::snprintf(pci->busId, sizeof pci->busId, "%s", devices[i].bus_id);
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetTemperature(void* dev, int sensor, unsigned int* temp) {
  if (sensor != 0) return kInvalidArgument;
  *temp = 30 + static_cast<unsigned>(index_of(dev));
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetFanSpeed(void* dev, unsigned int* speed) {
  if (index_of(dev) == 1) return kNotSupported;
  *speed = 40;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetPerformanceState(void*, int* pstate) {
  *pstate = 0;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void* dev, unsigned int* mw) {
  *mw = index_of(dev) == 0 ? 71234 : 350000;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void*, unsigned int* mw) {
  *mw = 700000;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(void*, nvmlMemory_t* m) {
  m->total = 81559ull << 20;
  m->used = 999ull << 20;  // v1 answer differs from v2's so the tests see which was used
  m->free = m->total - m->used;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void*, nvmlMemory_v2_t* m) {
  const char* no_v2 = std::getenv("FAKE_NVML_NO_V2");
  if (no_v2 && *no_v2 == '1') return kFunctionNotFound;
  if (m->version != (sizeof(nvmlMemory_v2_t) | 2u << 24)) return kArgumentVersionMismatch;
  m->total = 81559ull << 20;
  m->reserved = 512ull << 20;
  m->used = 1024ull << 20;
  m->free = m->total - m->used;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void* dev, nvmlUtilization_t* u) {
  u->gpu = index_of(dev) == 0 ? 87 : 5;
  u->memory = 12;
  return kSuccess;
}
nvmlReturn_t nvmlDeviceGetClockInfo(void*, int type, unsigned int* mhz) {
  switch (type) {
    case 0:
      *mhz = 1755;
      return kSuccess;  // graphics
    case 1:
      *mhz = 1980;
      return kSuccess;  // SM
    case 2:
      *mhz = 2619;
      return kSuccess;  // memory
  }
  return kInvalidArgument;
}

}  // extern "C"
