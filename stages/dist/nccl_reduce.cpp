#include "stages/dist/nccl_reduce.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if SLIPSTREAM_HAS_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "kernels/step_recorder.h"
#include "stages/dist/mpi_reduce.h"
#endif

namespace slipstream::dist {

#if SLIPSTREAM_HAS_CUDA

bool nccl_built() {
  return true;
}

namespace {

// The NCCL functions this backend calls, from the library opened by soname.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  const char* (*error_string)(ncclResult_t);
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    const std::string soname = "libnccl.so." + std::to_string(NCCL_MAJOR);
    auto sym = [&](const char* name) {
      void* f = cuda_rt::library_symbol(soname, name);
      if (!f)
        throw std::runtime_error(
            "allreduce backend nccl: " + soname +
            (cuda_rt::library_symbol(soname, "ncclGetVersion") ? " has no " + std::string(name)
                                                               : " not found") +
            " (install NCCL: the CUDA toolkit's, or the nvidia-nccl wheel with its lib folder on "
            "LD_LIBRARY_PATH)");
      return f;
    };
    NcclApi a{};
    a.get_unique_id = reinterpret_cast<decltype(a.get_unique_id)>(sym("ncclGetUniqueId"));
    a.comm_init_rank = reinterpret_cast<decltype(a.comm_init_rank)>(sym("ncclCommInitRank"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(sym("ncclAllReduce"));
    a.comm_destroy = reinterpret_cast<decltype(a.comm_destroy)>(sym("ncclCommDestroy"));
    a.error_string = reinterpret_cast<decltype(a.error_string)>(sym("ncclGetErrorString"));
    return a;
  }();
  return api;
}

void check(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  throw std::runtime_error(std::string("allreduce: ") + call +
                           " failed: " + nccl().error_string(r) + " (NCCL_DEBUG=INFO says more)");
}

void check(cudaError_t e, const char* call) {
  cuda_rt::check(e, call, "allreduce");
}

}  // namespace

struct NcclBucketReducer::Impl {
  GradBuckets buckets;
  int device = 0;
  cudaStream_t compute = nullptr, comm = nullptr;
  ncclComm_t nc = nullptr;
  std::vector<cudaEvent_t> ready_events;
  cudaEvent_t joined = nullptr;  // the comm stream's last reduction, for the compute stream
  cudaEvent_t done = nullptr;    // on the compute stream after the step's work: the watchdog's
  std::vector<Tensor> staging;   // per bucket that is not one block
  uint64_t step = 0;
  std::vector<size_t> pending;
  std::vector<uint8_t> param_done, ready;
  size_t next = 0;  // buckets enqueued, in order (collectives must match across ranks)

  // The watchdog: the last step whose reductions were enqueued, and when.
  double timeout_s = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t watched_step = 0;  // 0: nothing in flight
  std::chrono::steady_clock::time_point watched_since;
  bool stop = false;
  std::thread watchdog;

  // Polls the `done` event of the step last enqueued; past the deadline, ends every rank.
  void watch() {
    cudaSetDevice(device);
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || watched_step != 0; });
      if (stop) return;
      const uint64_t s = watched_step;
      const auto since = watched_since;
      lock.unlock();
      const cudaError_t e = cudaEventQuery(done);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
      if (e != cudaSuccess && e != cudaErrorNotReady) {
        std::fprintf(stderr, "error: allreduce (nccl) of step %llu: %s; every rank stops\n",
                     static_cast<unsigned long long>(s), cudaGetErrorString(e));
        mpi_abort_all(1);
      }
      if (e == cudaErrorNotReady && waited > timeout_s) {
        std::fprintf(stderr,
                     "error: allreduce (nccl) of step %llu: not complete on the device within "
                     "%.0f s (sync.timeout_s): a rank stopped and the others wait in the "
                     "collective (NCCL_DEBUG=INFO may say which); every rank stops (slipstream "
                     "run --resume RUN_DIR continues from the last checkpoint written, if any)\n",
                     static_cast<unsigned long long>(s), timeout_s);
        mpi_abort_all(1);
      }
      lock.lock();
      if (e == cudaSuccess && watched_step == s && watched_since == since) watched_step = 0;
      if (e == cudaErrorNotReady)
        cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop; });
    }
  }

  void start_step(uint64_t s) {
    step = s;
    next = 0;
    for (size_t i = 0; i < pending.size(); ++i) pending[i] = buckets.params_in(i);
    std::fill(param_done.begin(), param_done.end(), uint8_t{0});
    std::fill(ready.begin(), ready.end(), uint8_t{0});
  }

  // Bucket i's reduction, and below the compute stream's join with the comm stream: each one
  // operation enqueued on the compute stream through the step recorder (kernels/step_recorder.h),
  // so in a training step captured as a CUDA graph the fork to the comm stream, NCCL's kernels
  // and the join are captured with the step (a replay reduces the same buffers again).
  void enqueue(size_t i) {
    capture::enqueue(
        "ncclAllReduce (allreduce bucket)", compute,
        [this, i] { return capture::key_of(kBucketOp, reinterpret_cast<uintptr_t>(this), i); },
        [this, i] { reduce_bucket(i); });
  }
  void reduce_bucket(size_t i) {
    check(cudaEventRecord(ready_events[i], compute), "cudaEventRecord");
    check(cudaStreamWaitEvent(comm, ready_events[i], 0), "cudaStreamWaitEvent");
    float* data = buckets.contiguous(i);
    const auto& pieces = buckets.pieces(i);
    if (!data) {
      data = staging[i].data<float>();
      for (const auto& p : pieces)
        check(cudaMemcpyAsync(data + p.offset, p.grad, p.n * sizeof(float),
                              cudaMemcpyDeviceToDevice, comm),
              "cudaMemcpyAsync");
    }
    check(nccl().all_reduce(data, data, buckets.size(i), ncclFloat32, ncclAvg, nc, comm),
          "ncclAllReduce");
    if (!buckets.contiguous(i))
      for (const auto& p : pieces)
        check(cudaMemcpyAsync(p.grad, data + p.offset, p.n * sizeof(float),
                              cudaMemcpyDeviceToDevice, comm),
              "cudaMemcpyAsync");
  }
  void enqueue_join() {
    capture::enqueue(
        "cudaStreamWaitEvent (allreduce join)", compute,
        [this] { return capture::key_of(kJoinOp, reinterpret_cast<uintptr_t>(this)); },
        [this] {
          check(cudaEventRecord(joined, comm), "cudaEventRecord");
          check(cudaStreamWaitEvent(compute, joined, 0), "cudaStreamWaitEvent");
        });
  }
  static constexpr uint64_t kBucketOp = 0x6e63636c62756b74ull, kJoinOp = 0x6e63636c6a6f696eull;

  void enqueue_ready() {
    while (next < ready.size() && ready[next]) enqueue(next++);
  }
};

NcclBucketReducer::NcclBucketReducer(GradBuckets buckets, void* compute_stream, int rank, int world,
                                     double timeout_s)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.buckets = std::move(buckets);
  if (!m.buckets.device().is_cuda())
    throw std::runtime_error("allreduce backend nccl reduces GPU gradients; this run's are on " +
                             m.buckets.device().str() + ": use backend mpi (or auto)");
  m.device = m.buckets.device().index;
  m.compute = static_cast<cudaStream_t>(compute_stream);
  cuda_rt::DeviceGuard guard(m.device);
  ncclUniqueId id{};
  if (rank == 0) check(nccl().get_unique_id(&id), "ncclGetUniqueId");
  if (world > 1) mpi_broadcast(&id, sizeof id, 0);
  check(nccl().comm_init_rank(&m.nc, world, id, rank), "ncclCommInitRank");
  check(cudaStreamCreateWithFlags(&m.comm, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const size_t n = m.buckets.count();
  m.ready_events.assign(n, nullptr);
  for (auto& e : m.ready_events)
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventCreateWithFlags(&m.joined, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  m.staging.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (!m.buckets.contiguous(i))
      m.staging[i] = Tensor::empty({static_cast<int64_t>(m.buckets.size(i))}, DType::f32,
                                   m.buckets.device(), "allreduce staging bucket");
  m.pending.assign(n, 0);
  m.param_done.assign(m.buckets.param_count(), 0);
  m.ready.assign(n, 0);
  m.timeout_s = timeout_s;
  if (world > 1) m.watchdog = std::thread([&m] { m.watch(); });
}

NcclBucketReducer::~NcclBucketReducer() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    m.stop = true;
  }
  m.cv.notify_all();
  if (m.watchdog.joinable()) m.watchdog.join();
  if (m.comm) cudaStreamSynchronize(m.comm);
  if (m.nc) nccl().comm_destroy(m.nc);
  for (auto e : m.ready_events)
    if (e) cudaEventDestroy(e);
  if (m.joined) cudaEventDestroy(m.joined);
  if (m.done) cudaEventDestroy(m.done);
  if (m.comm) cudaStreamDestroy(m.comm);
}

void NcclBucketReducer::param_ready(size_t k, uint64_t step) {
  Impl& m = *impl_;
  if (m.step != step) m.start_step(step);
  if (m.param_done[k]) return;
  m.param_done[k] = 1;
  bool any = false;
  for (size_t i : m.buckets.buckets_of(k))
    if (--m.pending[i] == 0) m.ready[i] = 1, any = true;
  if (!any) return;
  cuda_rt::DeviceGuard guard(m.device);
  m.enqueue_ready();
}

void NcclBucketReducer::finish(uint64_t step) {
  Impl& m = *impl_;
  if (m.step != step) m.start_step(step);
  for (size_t k = 0; k < m.param_done.size(); ++k) param_ready(k, step);
  cuda_rt::DeviceGuard guard(m.device);
  m.enqueue_ready();
  m.enqueue_join();
  // The watchdog's event follows the step's work as issued (after its graph, when it is one), so
  // it is armed only once that work is on the stream.
  capture::after_enqueued(m.compute, [&m, step] {
    check(cudaEventRecord(m.done, m.compute), "cudaEventRecord");
    if (!m.watchdog.joinable()) return;
    {
      std::lock_guard lock(m.mu);
      m.watched_step = step;
      m.watched_since = std::chrono::steady_clock::now();
    }
    m.cv.notify_one();
  });
  m.step = 0;  // the next call starts a new collection, even for the same step number
}

#else  // no CUDA: the backend does not exist

bool nccl_built() {
  return false;
}

struct NcclBucketReducer::Impl {};

NcclBucketReducer::NcclBucketReducer(GradBuckets, void*, int, int, double) {
  throw std::runtime_error("allreduce backend nccl needs a CUDA build");
}
NcclBucketReducer::~NcclBucketReducer() = default;
void NcclBucketReducer::param_ready(size_t, uint64_t) {}
void NcclBucketReducer::finish(uint64_t) {}

#endif

}  // namespace slipstream::dist
