// Probing the CUDA runtime and driver, library versions, pinned memory and synchronous copies.
#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime.h>
#include <cudnn_version.h>
#include <dlfcn.h>
#include <library_types.h>
#include <nccl.h>

#include <atomic>
#include <stdexcept>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "kernels/step_recorder.h"

namespace slipstream::cuda_rt {

namespace {
std::atomic<uint64_t> device_syncs{0}, stream_syncs{0}, event_syncs{0};

// cudaDeviceSynchronize, counted.
cudaError_t device_synchronize() {
  ++device_syncs;
  return cudaDeviceSynchronize();
}

std::string version_str(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// Whether the driver library itself can be loaded: tells "not installed" from "broken".
std::string driver_library_problem() {
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    return e ? e : "dlopen failed";
  }
  ::dlclose(h);
  return "";
}
}  // namespace

int build_runtime_version() {
  return CUDART_VERSION;
}

CudaProbe probe() {
  CudaProbe p;
  p.built_with_cuda = true;
  cudaDriverGetVersion(&p.driver_version);  // 0 without a driver; never fails otherwise
  cudaRuntimeGetVersion(&p.runtime_version);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls are not confused
    const std::string says = std::string(" (CUDA runtime says: ") + cudaGetErrorString(err) + ")";
    switch (err) {
      case cudaErrorInsufficientDriver:
        if (p.driver_version == 0) {
          std::string problem = driver_library_problem();
          p.reason = problem.find("No such file") != std::string::npos || problem.empty()
                         ? "no NVIDIA driver: libcuda.so.1 not found" + says
                         : "NVIDIA driver library libcuda.so.1 cannot be loaded: " + problem + says;
        } else {
          p.reason = "NVIDIA driver too old: it supports CUDA " + version_str(p.driver_version) +
                     ", this build needs CUDA " + version_str(CUDART_VERSION) + says;
        }
        break;
      case cudaErrorNoDevice:
        p.reason =
            "no CUDA device: the driver is installed but sees no GPU (check nvidia-smi "
            "and CUDA_VISIBLE_DEVICES)" +
            says;
        break;
      case cudaErrorInitializationError:
        p.reason =
            "CUDA initialisation failed (driver and kernel module out of step, or the "
            "GPU is in a bad state; check nvidia-smi)" +
            says;
        break;
      case cudaErrorSystemDriverMismatch:
      case cudaErrorCompatNotSupportedOnDevice:
        p.reason =
            "NVIDIA driver and kernel module versions do not match (reboot after a driver "
            "upgrade?)" +
            says;
        break;
      case cudaErrorDevicesUnavailable:
        p.reason = "CUDA devices are busy or unavailable (exclusive-process mode?)" + says;
        break;
      default:
        p.reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + says;
    }
    return p;
  }
  if (count == 0) {
    p.reason = "no CUDA device: the driver reports 0 GPUs (check CUDA_VISIBLE_DEVICES)";
    return p;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) {
      cudaGetLastError();
      p.reason =
          "cudaGetDeviceProperties(" + std::to_string(i) + ") failed: " + cudaGetErrorString(err);
      p.devices.clear();
      return p;
    }
    CudaDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.total_memory = prop.totalGlobalMem;
    d.multiprocessors = prop.multiProcessorCount;
    d.pci_domain = prop.pciDomainID;
    d.pci_bus = prop.pciBusID;
    d.pci_device = prop.pciDeviceID;
    p.devices.push_back(std::move(d));
  }
  p.available = true;
  return p;
}

void* library_symbol(const std::string& soname, const char* symbol) {
  void* h = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  return h ? ::dlsym(h, symbol) : nullptr;
}

namespace {

std::string dotted(long long v) {  // major*10000 + minor*100 + patch
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
}

}  // namespace

// Only cuBLASLt is linked (the GEMMs use it); cuBLAS, cuDNN and NCCL are opened here for their
// version strings, so a binary that uses none of them does not need them to start.
CudaLibraryVersions library_versions() {
  CudaLibraryVersions v;
  using GetProperty = cublasStatus_t (*)(libraryPropertyType, int*);
  if (auto get = reinterpret_cast<GetProperty>(library_symbol(
          "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "cublasGetProperty"))) {
    int major = 0, minor = 0, patch = 0;
    if (get(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        get(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        get(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
      v.cublas = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  }
  using CudnnGetVersion = size_t (*)();  // cuDNN 9: major*10000 + minor*100 + patch
  if (auto get = reinterpret_cast<CudnnGetVersion>(
          library_symbol("libcudnn.so." + std::to_string(CUDNN_MAJOR), "cudnnGetVersion")))
    v.cudnn = dotted(static_cast<long long>(get()));
  using NcclGetVersion = ncclResult_t (*)(int*);  // NCCL >= 2.9: major*10000 + minor*100 + patch
  if (auto get = reinterpret_cast<NcclGetVersion>(
          library_symbol("libnccl.so." + std::to_string(NCCL_MAJOR), "ncclGetVersion"))) {
    int nccl = 0;
    if (get(&nccl) == ncclSuccess) v.nccl = dotted(nccl);
  }
  return v;
}

void* host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  // Portable: page-locked for every device's context, not only the current one.
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void* mapped_device_pointer(const void* host) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return a.type == cudaMemoryTypeHost ? a.devicePointer : nullptr;
}

void host_free_pinned(void* ptr) {
  if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();  // at exit the runtime may be gone
}

// Synchronous with respect to every stream: the device finishes what is queued (ops run on
// non-blocking streams, which the legacy stream's cudaMemcpy would not wait for) before the copy.
// These copies belong to setup and the host phases (checkpoints, tests), never the hot loop.
void copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
          size_t bytes) {
  const std::string what =
      src_device.str() + " to " + dst_device.str() + ", " + format_bytes(bytes);
  capture::sync_point("a synchronous copy, " + what);
  for (const Device& d : {dst_device, src_device})
    if (d.is_cuda()) {
      DeviceGuard guard(d.index);
      check(device_synchronize(), "cudaDeviceSynchronize", "before a copy " + what);
    }
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    check(cudaMemcpyPeer(dst, dst_device.index, src, src_device.index, bytes), "cudaMemcpyPeer",
          what);
    return;
  }
  cudaMemcpyKind kind = dst_device.is_cuda() ? (src_device.is_cuda() ? cudaMemcpyDeviceToDevice
                                                                     : cudaMemcpyHostToDevice)
                                             : cudaMemcpyDeviceToHost;
  DeviceGuard guard(dst_device.is_cuda() ? dst_device.index : src_device.index);
  check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy", what);
  if (dst_device.is_cuda()) check(device_synchronize(), "cudaDeviceSynchronize", "after " + what);
}

void zero(void* dst, const Device& device, size_t bytes) {
  capture::sync_point("a synchronous fill on " + device.str());
  DeviceGuard guard(device.index);
  check(device_synchronize(), "cudaDeviceSynchronize", "before zeroing on " + device.str());
  check(cudaMemset(dst, 0, bytes), "cudaMemset", device.str() + ", " + format_bytes(bytes));
  check(device_synchronize(), "cudaDeviceSynchronize", "after zeroing on " + device.str());
}

void* create_stream(int index) {
  DeviceGuard guard(index);
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
        "cuda:" + std::to_string(index));
  return s;
}

void destroy_stream(void* stream) {
  if (cudaStreamDestroy(static_cast<cudaStream_t>(stream)) != cudaSuccess) cudaGetLastError();
}

uint64_t free_memory(int index) {
  DeviceGuard guard(index);
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo", "cuda:" + std::to_string(index));
  return free_b;
}

CudaSyncCounts sync_counts() {
  return {device_syncs.load(), stream_syncs.load(), event_syncs.load()};
}

void synchronize_stream(int index, void* stream) {
  capture::sync_point("the host waits for a stream");
  DeviceGuard guard(index);
  ++stream_syncs;
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize",
        "the work enqueued on cuda:" + std::to_string(index) + "'s compute stream");
}

void copy_to_host_on(void* stream, int index, void* host, const void* device, size_t bytes) {
  copy_async(index, stream, host, device, bytes, false);
  synchronize_stream(index, stream);
}

void copy_async(int index, void* stream, void* dst, const void* src, size_t bytes, bool to_device) {
  capture::enqueue(
      "cudaMemcpyAsync", stream, [&] { return capture::key_of(index, dst, src, bytes, to_device); },
      [=] {
        DeviceGuard guard(index);
        const std::string dev = "cuda:" + std::to_string(index);
        check(cudaMemcpyAsync(dst, src, bytes,
                              to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                              static_cast<cudaStream_t>(stream)),
              "cudaMemcpyAsync",
              (to_device ? "host to " + dev : dev + " to host") + ", " + format_bytes(bytes));
      });
}

void copy_device_async(int index, void* stream, void* dst, const void* src, size_t bytes) {
  capture::enqueue(
      "cudaMemcpyAsync", stream, [&] { return capture::key_of(index, dst, src, bytes); },
      [=] {
        DeviceGuard guard(index);
        check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                              static_cast<cudaStream_t>(stream)),
              "cudaMemcpyAsync", "cuda:" + std::to_string(index) + ", " + format_bytes(bytes));
      });
}

void* create_event(int index) {
  DeviceGuard guard(index);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags",
        "cuda:" + std::to_string(index));
  return e;
}

void destroy_event(void* event) {
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) cudaGetLastError();
}

void record_event(int index, void* event, void* stream) {
  // While the stream's work is recorded, after that work: an event marks what precedes it.
  capture::after_enqueued(stream, [=] {
    DeviceGuard guard(index);
    check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
          "cudaEventRecord", "cuda:" + std::to_string(index));
  });
}

void stream_wait_event(int index, void* stream, void* event) {
  DeviceGuard guard(index);
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent", "cuda:" + std::to_string(index));
}

bool event_done(int index, void* event) {
  DeviceGuard guard(index);
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: the work before the event is still running
    return false;
  }
  check(err, "cudaEventQuery", "cuda:" + std::to_string(index));
  return true;
}

void event_synchronize(int index, void* event) {
  capture::sync_point("the host waits for an event");
  DeviceGuard guard(index);
  ++event_syncs;
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "cudaEventSynchronize",
        "the work before an event on cuda:" + std::to_string(index));
}

void* create_timing_event(int index) {
  DeviceGuard guard(index);
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDefault), "cudaEventCreateWithFlags",
        "cuda:" + std::to_string(index) + ", a timing event");
  return e;
}

void elapsed_between(int index, void* stream, const std::vector<void*>& events,
                     std::vector<float>& ms) {
  ms.assign(events.empty() ? 0 : events.size() - 1, 0.0f);
  if (events.empty()) return;
  DeviceGuard guard(index);
  // The whole stream, not the last event: what a graph's event node marks for the host is the
  // launch's, and waiting for the stream does not depend on it.
  ++stream_syncs;
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize",
        "a timed graph on cuda:" + std::to_string(index));
  for (size_t i = 0; i + 1 < events.size(); ++i)
    check(cudaEventElapsedTime(&ms[i], static_cast<cudaEvent_t>(events[i]),
                               static_cast<cudaEvent_t>(events[i + 1])),
          "cudaEventElapsedTime", "operation " + std::to_string(i + 1) + " of a timed graph");
}

void* capture_graph(int index, void* stream, const std::vector<capture::RecordedOp>& ops,
                    std::string* why, const std::vector<void*>* timing_events) {
  DeviceGuard guard(index);
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(err);
    return nullptr;
  }
  std::string failed;
  try {
    if (timing_events) {
      if (timing_events->size() != ops.size() + 1)
        throw std::logic_error("capture_graph: one timing event more than operations");
      // A time stamp between each two operations: nodes of the graph, stamped at each launch.
      auto stamp = [&](size_t i) {
        check(cudaEventRecordWithFlags(static_cast<cudaEvent_t>((*timing_events)[i]), s,
                                       cudaEventRecordExternal),
              "cudaEventRecordWithFlags", "a timing event under capture");
      };
      for (size_t i = 0; i < ops.size(); ++i) {
        stamp(i);
        capture::issue_op(ops[i]);
      }
      stamp(ops.size());
    } else {
      capture::issue_ops(ops);
    }
  } catch (const std::exception& e) {
    failed = e.what();
  }
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(s, &graph);
  if (!failed.empty() || err != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    *why = !failed.empty() ? "an operation failed under capture: " + failed
                           : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(err);
    return nullptr;
  }
  return exec;
}

void launch_graph(int index, void* graph, void* stream) {
  DeviceGuard guard(index);
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)),
        "cudaGraphLaunch", "the training step's CUDA graph on cuda:" + std::to_string(index));
}

void destroy_graph(void* graph) {
  if (cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)) != cudaSuccess) cudaGetLastError();
}

void* create_blaslt(int index) {
  DeviceGuard guard(index);
  cublasLtHandle_t h = nullptr;
  const cublasStatus_t st = cublasLtCreate(&h);
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cublasLtCreate failed on cuda:") + std::to_string(index) +
                             ": " + cublasLtGetStatusString(st));
  return h;
}

void destroy_blaslt(void* handle) {
  cublasLtDestroy(static_cast<cublasLtHandle_t>(handle));
}

}  // namespace slipstream::cuda_rt
