// Internal: the CUDA side of the runtime, callable from plain C++ (no CUDA headers here).
// Defined in engine/cuda/*, which only CUDA builds compile: callers guard with
// `#if SLIPSTREAM_HAS_CUDA`.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/memory_pool.h"
#include "kernels/step_recorder.h"

namespace slipstream::cuda_rt {

// The host's waits so far (engine/device.h's cuda_sync_counts).
CudaSyncCounts sync_counts();
uint64_t free_memory(int index);

// Uncached; probe_cuda() caches it.
CudaProbe probe();
CudaLibraryVersions library_versions();
// The CUDA runtime version this binary was built against (e.g. 13000).
int build_runtime_version();

// A function of a shared library loaded by its soname (found the way a linked library would be:
// LD_LIBRARY_PATH, then this binary's RUNPATH); nullptr when the library or symbol is missing.
// The handle stays open: `slipstream doctor` then sees which file was loaded. cuBLAS, cuDNN and
// NCCL are opened this way, so a binary that does not use them does not need them to start.
void* library_symbol(const std::string& soname, const char* symbol);

// Page-locked host memory; nullptr on failure (the caller reports it).
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* ptr);
// The address kernels use for `host` when it lies in page-locked host memory, which CUDA maps
// into every device's address space (cudaPointerGetAttributes' devicePointer; under unified
// addressing `host` itself); nullptr for pageable memory.
void* mapped_device_pointer(const void* host);

std::unique_ptr<MemoryPool> make_device_pool(int index);

// Synchronous copies and fills, ordered after (and before) the work of every stream on the
// devices involved; errors throw std::runtime_error naming the CUDA call.
void copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
          size_t bytes);
void zero(void* dst, const Device& device, size_t bytes);

// The execution context's resources (engine/exec_context.h). Streams are non-blocking.
void* create_stream(int index);
void destroy_stream(void* stream);
void synchronize_stream(int index, void* stream);  // throws naming the failed work's error
// cudaMemcpyAsync device to host on `stream`, then waits for the stream.
void copy_to_host_on(void* stream, int index, void* host, const void* device, size_t bytes);
// cudaMemcpyAsync between host memory and `index`'s on `stream`, returning at once (page-locked
// host memory makes it asynchronous: leave it untouched until the stream has passed the copy).
void copy_async(int index, void* stream, void* dst, const void* src, size_t bytes, bool to_device);
// cudaMemcpyAsync device to device on `stream` (recorded with a step: kernels/step_recorder.h).
void copy_device_async(int index, void* stream, void* dst, const void* src, size_t bytes);
// Events order one stream after another (or the host after a stream): created without timing.
void* create_event(int index);  // cudaEvent_t
void destroy_event(void* event);
void record_event(int index, void* event, void* stream);
// The stream's later work waits for the event's last recorded point (on the device).
void stream_wait_event(int index, void* stream, void* event);
bool event_done(int index, void* event);  // cudaEventQuery: complete (or never recorded)
void event_synchronize(int index, void* event);
// out = a + b, n floats of device `index`, enqueued on `stream` (engine/cuda/tensor_add.cu).
void add_f32(int index, void* stream, const float* a, const float* b, float* out, size_t n);
// A CUDA graph of `ops` (each enqueues on `stream`), captured on this thread and instantiated
// (engine/step_graphs.h); null with `why` set when the capture fails: the ops are then not
// issued. launch_graph enqueues it on `stream`. With `timing_events` (ops.size() + 1 events of
// create_timing_event), event i is recorded before operation i and the last after them all, as
// nodes of the graph (cudaEventRecordExternal): each launch stamps them.
void* capture_graph(int index, void* stream, const std::vector<capture::RecordedOp>& ops,
                    std::string* why,
                    const std::vector<void*>* timing_events = nullptr);  // cudaGraphExec_t
// An event that records a time stamp (timing_events above).
void* create_timing_event(int index);
// Waits for `stream` (a graph's launch with its timing events enqueued on it), then sets ms[i]
// to the time between events i and i + 1.
void elapsed_between(int index, void* stream, const std::vector<void*>& events,
                     std::vector<float>& ms);
void launch_graph(int index, void* graph, void* stream);
void destroy_graph(void* graph);
void* create_blaslt(int index);  // cublasLtHandle_t
void destroy_blaslt(void* handle);

// Launches a kernel that writes known values and checks them on the host (engine/cuda/
// probe_kernel.cu). Returns "" on success, else what went wrong.
std::string run_probe_kernel(int index);

}  // namespace slipstream::cuda_rt
