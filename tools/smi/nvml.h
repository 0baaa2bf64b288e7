// GPU readings through NVML, loaded at run time so slipstream-smi runs (and reports the
// pipelines) on machines without an NVIDIA driver.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace slipstream::smi {

// One GPU's readings; a reading the device does not support stays empty (printed as [N/A]).
struct GpuInfo {
  unsigned index = 0;
  std::string name;
  std::string bus_id;
  std::optional<unsigned> temperature_c;
  std::optional<unsigned> fan_percent;
  std::optional<int> pstate;  // 0..15 for P0..P15
  std::optional<unsigned> power_mw;
  std::optional<unsigned> power_limit_mw;
  std::optional<uint64_t> memory_used_bytes;
  std::optional<uint64_t> memory_total_bytes;
  std::optional<unsigned> utilization_gpu_percent;
  std::optional<unsigned> utilization_memory_percent;
  std::optional<unsigned> clock_sm_mhz;
  std::optional<unsigned> clock_graphics_mhz;
  std::optional<unsigned> clock_memory_mhz;
};

struct GpuReport {
  bool available = false;
  std::string unavailable_reason;  // one line, set when !available
  std::string driver_version;      // empty when unknown
  std::string cuda_version;        // "12.4"; empty when unknown
  std::vector<GpuInfo> gpus;
};

// Owns the dlopen handle and NVML's initialisation; create once, query every interval.
class Nvml {
 public:
  // library: path or soname to dlopen; empty -> $SLIPSTREAM_SMI_NVML_PATH, else
  // "libnvidia-ml.so.1".
  explicit Nvml(const std::string& library = {});
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // Readings of the GPUs whose indices are in `select` (all when empty).
  GpuReport query(const std::vector<unsigned>& select) const;
  // Number of GPUs NVML reports; 0 when NVML is unavailable.
  unsigned device_count() const;

 private:
  struct Api;
  std::unique_ptr<Api> api_;
  std::string unavailable_reason_;
};

// The NVML index of the GPU at PCI (domain, bus, device), e.g. a CUDA device's (CUDA and NVML
// may number GPUs differently); nullopt when NVML does not list it.
std::optional<unsigned> nvml_index_of_pci(const Nvml& nvml, int domain, int bus, int device);

// One GPU's utilisation (NVML's utilization.gpu: the share of the last sample period in which a
// kernel ran) read every `interval` on a thread of its own between start() and stop(); stop()
// returns the mean of the readings (at least one: stop() takes it when the window was shorter
// than the first), nullopt when NVML gives none.
class UtilizationSampler {
 public:
  UtilizationSampler(const Nvml& nvml, unsigned index,
                     std::chrono::milliseconds interval = std::chrono::milliseconds(50));
  ~UtilizationSampler();
  UtilizationSampler(const UtilizationSampler&) = delete;
  UtilizationSampler& operator=(const UtilizationSampler&) = delete;
  void start();
  std::optional<double> stop();

 private:
  const Nvml& nvml_;
  unsigned index_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool running_ = false;
  std::vector<unsigned> readings_;
  std::thread thread_;
};

}  // namespace slipstream::smi
