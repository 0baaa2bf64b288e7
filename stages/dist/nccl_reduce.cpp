#include "stages/dist/nccl_reduce.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/step_recorder.h"
#include "stages/dist/mpi_reduce.h"

#if SLIPSTREAM_HAS_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#endif

namespace slipstream::dist {

bool nccl_built() {
#if SLIPSTREAM_HAS_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// How the buckets' data moves. Each call is one operation of the compute stream's (recorded by
// the step recorder when a step is captured): reduce() bucket i's gradients to their average
// over the ranks, join() the compute stream with every reduction enqueued, and enqueued(step)
// once the step's work is on the stream.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual void reduce(size_t i) = 0;
  virtual void join() = 0;
  virtual void enqueued(uint64_t step) = 0;
  // ZeRO-1: bucket i's gradients averaged over the ranks in this rank's range of its buffer
  // (GradBuckets::shard_begin; the other ranges are left as they were); every rank's range of
  // bucket i's weights into every rank; one double in device memory summed over the ranks.
  // gather_weights and sum end joined with the compute stream.
  virtual void reduce_scatter(size_t i) = 0;
  virtual void gather_weights(size_t i) = 0;
  virtual void sum(double* value) = 0;
};

// The emulated device (host memory, no streams): the same reductions with MPI on the host,
// blocking, so a multi-rank run on `device: emulated` takes the reducer's path in CI.
class MpiHostTransport final : public Transport {
 public:
  MpiHostTransport(const GradBuckets& buckets, int rank, int world, double timeout_s)
      : buckets_(buckets), rank_(rank), world_(world), timeout_s_(timeout_s) {
    size_t largest = 0;
    for (size_t i = 0; i < buckets.count(); ++i) largest = std::max(largest, buckets.size(i));
    staging_.resize(largest);
  }
  void reduce(size_t i) override {
    if (world_ <= 1) return;  // the average of one rank
    const std::string what = "allreduce (nccl, emulated over MPI) of bucket " + std::to_string(i);
    if (float* block = buckets_.contiguous(i)) {
      mpi_average({block, buckets_.size(i)}, timeout_s_, what);
      return;
    }
    buckets_.flatten(i, staging_.data());
    mpi_average({staging_.data(), buckets_.size(i)}, timeout_s_, what);
    buckets_.unflatten(i, staging_.data(), 1.0f);
  }
  void join() override {}
  void enqueued(uint64_t) override {}

  void reduce_scatter(size_t i) override {
    const std::string what =
        "reduce-scatter (nccl, emulated over MPI) of bucket " + std::to_string(i);
    float* data = buckets_.contiguous(i);
    if (!data) {
      data = staging_.data();
      buckets_.flatten(i, data);
    }
    const auto [counts, displs] = split(i);
    const size_t me = static_cast<size_t>(rank_);
    mine_.resize(std::max<size_t>(1, counts[me]));
    mpi_reduce_scatter_average(data, counts, mine_.data(), timeout_s_, what);
    buckets_.unflatten_range(i, mine_.data(), displs[me], counts[me], 1.0f);
  }
  void gather_weights(size_t i) override {
    const std::string what = "all-gather (nccl, emulated over MPI) of bucket " + std::to_string(i);
    float* data = buckets_.value_block(i);
    if (!data) {
      data = staging_.data();
      buckets_.flatten_values(i, data);  // this rank's range is what the others need
    }
    const auto [counts, displs] = split(i);
    mpi_allgather_in_place(data, counts, displs, timeout_s_, what);
    if (!buckets_.value_block(i)) buckets_.unflatten_values(i, data);
  }
  void sum(double* value) override {
    mpi_reduce({value, 1}, RankReduce::sum, timeout_s_, "the gradient norm (nccl, emulated)");
  }

 private:
  std::pair<std::vector<size_t>, std::vector<size_t>> split(size_t i) const {
    std::vector<size_t> counts, displs;
    for (int r = 0; r < world_; ++r) {
      counts.push_back(buckets_.shard_count(i, r, world_));
      displs.push_back(buckets_.shard_begin(i, r, world_));
    }
    return {counts, displs};
  }

  const GradBuckets& buckets_;
  int rank_, world_;
  double timeout_s_;
  std::vector<float> staging_, mine_;
};

#if SLIPSTREAM_HAS_CUDA

// The NCCL functions this backend calls, from the library opened by soname.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
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
    a.reduce = reinterpret_cast<decltype(a.reduce)>(sym("ncclReduce"));
    a.broadcast = reinterpret_cast<decltype(a.broadcast)>(sym("ncclBroadcast"));
    a.group_start = reinterpret_cast<decltype(a.group_start)>(sym("ncclGroupStart"));
    a.group_end = reinterpret_cast<decltype(a.group_end)>(sym("ncclGroupEnd"));
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

// A CUDA device: ncclAllReduce(ncclAvg) on a communication stream of its own. A bucket's
// reduction makes the comm stream wait for the compute stream's work so far (the gradients'
// writes), copies a staged bucket out and back around the collective; the join makes the
// compute stream wait for the comm stream. Inside a captured step the fork, NCCL's kernels and
// the join are captured with it, and a replay reduces the same buffers again.
class NcclTransport final : public Transport {
 public:
  NcclTransport(const GradBuckets& buckets, cudaStream_t compute, int rank, int world,
                double timeout_s)
      : buckets_(buckets),
        device_(buckets.device().index),
        world_(world),
        compute_(compute),
        timeout_s_(timeout_s) {
    cuda_rt::DeviceGuard guard(device_);
    ncclUniqueId id{};
    if (rank == 0) check(nccl().get_unique_id(&id), "ncclGetUniqueId");
    if (world > 1) mpi_broadcast(&id, sizeof id, 0);
    check(nccl().comm_init_rank(&nc_, world, id, rank), "ncclCommInitRank");
    check(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    const size_t n = buckets.count();
    ready_events_.assign(n, nullptr);
    for (auto& e : ready_events_)
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    staging_.resize(n);
    value_staging_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t size = static_cast<int64_t>(buckets.size(i));
      if (!buckets.contiguous(i))
        staging_[i] =
            Tensor::empty({size}, DType::f32, buckets.device(), "allreduce staging bucket");
      if (!buckets.value_block(i))
        value_staging_[i] =
            Tensor::empty({size}, DType::f32, buckets.device(), "allreduce staging weights");
    }
    if (world > 1) watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclTransport() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) cudaStreamSynchronize(comm_);
    if (nc_) nccl().comm_destroy(nc_);
    for (auto e : ready_events_)
      if (e) cudaEventDestroy(e);
    if (joined_) cudaEventDestroy(joined_);
    if (done_) cudaEventDestroy(done_);
    if (comm_) cudaStreamDestroy(comm_);
  }

  void reduce(size_t i) override {
    cuda_rt::DeviceGuard guard(device_);
    float* data = fork_gradients(i);
    check(nccl().all_reduce(data, data, buckets_.size(i), ncclFloat32, ncclAvg, nc_, comm_),
          "ncclAllReduce");
    unstage_gradients(i, data);
  }

  void join() override {
    cuda_rt::DeviceGuard guard(device_);
    check(cudaEventRecord(joined_, comm_), "cudaEventRecord");
    check(cudaStreamWaitEvent(compute_, joined_, 0), "cudaStreamWaitEvent");
  }

  // NCCL's reduce-scatter takes equal parts; ours follow the parameters' split (shard_begin), so
  // each part is an ncclReduce to its rank, grouped into one launch.
  void reduce_scatter(size_t i) override {
    cuda_rt::DeviceGuard guard(device_);
    float* data = fork_gradients(i);
    check(nccl().group_start(), "ncclGroupStart");
    for (int r = 0; r < world_; ++r) {
      float* part = data + buckets_.shard_begin(i, r, world_);
      check(nccl().reduce(part, part, buckets_.shard_count(i, r, world_), ncclFloat32, ncclAvg, r,
                          nc_, comm_),
            "ncclReduce");
    }
    check(nccl().group_end(), "ncclGroupEnd");
    unstage_gradients(i, data);
  }

  // The all-gather of unequal parts: an ncclBroadcast from each rank, grouped.
  void gather_weights(size_t i) override {
    cuda_rt::DeviceGuard guard(device_);
    fork(i);
    float* data = buckets_.value_block(i);
    if (!data) {
      data = value_staging_[i].data<float>();
      for (const auto& p : buckets_.pieces(i))
        check(cudaMemcpyAsync(data + buckets_.buffer_offset(i, p), buckets_.value_of(p),
                              p.n * sizeof(float), cudaMemcpyDeviceToDevice, comm_),
              "cudaMemcpyAsync");
    }
    check(nccl().group_start(), "ncclGroupStart");
    for (int r = 0; r < world_; ++r) {
      float* part = data + buckets_.shard_begin(i, r, world_);
      check(nccl().broadcast(part, part, buckets_.shard_count(i, r, world_), ncclFloat32, r, nc_,
                             comm_),
            "ncclBroadcast");
    }
    check(nccl().group_end(), "ncclGroupEnd");
    if (!buckets_.value_block(i))
      for (const auto& p : buckets_.pieces(i))
        check(cudaMemcpyAsync(buckets_.value_of(p), data + buckets_.buffer_offset(i, p),
                              p.n * sizeof(float), cudaMemcpyDeviceToDevice, comm_),
              "cudaMemcpyAsync");
    join();
  }

  void sum(double* value) override {
    cuda_rt::DeviceGuard guard(device_);
    fork(0);
    check(nccl().all_reduce(value, value, 1, ncclFloat64, ncclSum, nc_, comm_), "ncclAllReduce");
    join();
  }

  // The watchdog's event follows the step's work as issued (its graph, when it is one), so it is
  // armed only once that work is on the stream.
  void enqueued(uint64_t step) override {
    cuda_rt::DeviceGuard guard(device_);
    check(cudaEventRecord(done_, compute_), "cudaEventRecord");
    if (!watchdog_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      watched_step_ = step;
      watched_since_ = std::chrono::steady_clock::now();
    }
    cv_.notify_one();
  }

 private:
  // Polls the `done` event of the step last enqueued; past the deadline, ends every rank.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || watched_step_ != 0; });
      if (stop_) return;
      const uint64_t s = watched_step_;
      const auto since = watched_since_;
      lock.unlock();
      const cudaError_t e = cudaEventQuery(done_);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
      if (e != cudaSuccess && e != cudaErrorNotReady) {
        std::fprintf(stderr, "error: allreduce (nccl) of step %llu: %s; every rank stops\n",
                     static_cast<unsigned long long>(s), cudaGetErrorString(e));
        mpi_abort_all(1);
      }
      if (e == cudaErrorNotReady && waited > timeout_s_) {
        std::fprintf(stderr,
                     "error: allreduce (nccl) of step %llu: not complete on the device within "
                     "%.0f s (sync.timeout_s): a rank stopped and the others wait in the "
                     "collective (NCCL_DEBUG=INFO may say which); every rank stops (slipstream "
                     "run --resume RUN_DIR continues from the last checkpoint written, if any)\n",
                     static_cast<unsigned long long>(s), timeout_s_);
        mpi_abort_all(1);
      }
      lock.lock();
      if (e == cudaSuccess && watched_step_ == s && watched_since_ == since) watched_step_ = 0;
      if (e == cudaErrorNotReady)
        cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; });
    }
  }

  // The comm stream waits for the compute stream's work so far (through bucket i's event).
  void fork(size_t i) {
    check(cudaEventRecord(ready_events_[i], compute_), "cudaEventRecord");
    check(cudaStreamWaitEvent(comm_, ready_events_[i], 0), "cudaStreamWaitEvent");
  }
  // Bucket i's gradients as one buffer on the comm stream: in place, or copied into staging.
  float* fork_gradients(size_t i) {
    fork(i);
    float* data = buckets_.contiguous(i);
    if (data) return data;
    data = staging_[i].data<float>();
    for (const auto& p : buckets_.pieces(i))
      check(cudaMemcpyAsync(data + p.offset, p.grad, p.n * sizeof(float), cudaMemcpyDeviceToDevice,
                            comm_),
            "cudaMemcpyAsync");
    return data;
  }
  void unstage_gradients(size_t i, const float* data) {
    if (buckets_.contiguous(i)) return;
    for (const auto& p : buckets_.pieces(i))
      check(cudaMemcpyAsync(p.grad, data + p.offset, p.n * sizeof(float), cudaMemcpyDeviceToDevice,
                            comm_),
            "cudaMemcpyAsync");
  }

  const GradBuckets& buckets_;
  int device_ = 0, world_ = 1;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  ncclComm_t nc_ = nullptr;
  std::vector<cudaEvent_t> ready_events_;
  cudaEvent_t joined_ = nullptr;  // the comm stream's last reduction, for the compute stream
  cudaEvent_t done_ = nullptr;    // on the compute stream after the step's work: the watchdog's
  std::vector<Tensor> staging_;   // per bucket whose gradients are not one block
  std::vector<Tensor> value_staging_;  // per bucket whose weights are not one block (ZeRO-1)

  // The watchdog: the last step whose reductions were enqueued, and when.
  double timeout_s_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t watched_step_ = 0;  // 0: nothing in flight
  std::chrono::steady_clock::time_point watched_since_;
  bool stop_ = false;
  std::thread watchdog_;
};

#endif  // SLIPSTREAM_HAS_CUDA

}  // namespace

struct NcclBucketReducer::Impl {
  GradBuckets buckets;
  void* stream = nullptr;  // the compute stream (null under the emulator)
  std::unique_ptr<Transport> transport;
  int rank = 0, world = 1;
  bool shard = false;
  uint64_t step = 0;
  std::vector<size_t> pending;
  std::vector<uint8_t> param_done, ready;
  size_t next = 0;  // buckets enqueued, in order (collectives must match across ranks)

  void start_step(uint64_t s) {
    step = s;
    next = 0;
    for (size_t i = 0; i < pending.size(); ++i) pending[i] = buckets.params_in(i);
    std::fill(param_done.begin(), param_done.end(), uint8_t{0});
    std::fill(ready.begin(), ready.end(), uint8_t{0});
  }

  // Bucket i's reduction and the join: each one operation enqueued on the compute stream through
  // the step recorder (kernels/step_recorder.h), so a training step captured as a CUDA graph
  // holds its reductions.
  void enqueue(size_t i) {
    capture::enqueue(
        "ncclAllReduce (allreduce bucket)", stream,
        [this, i] { return capture::key_of(kBucketOp, reinterpret_cast<uintptr_t>(this), i); },
        [this, i] {
          if (shard)
            transport->reduce_scatter(i);
          else
            transport->reduce(i);
        });
  }
  void enqueue_join() {
    capture::enqueue(
        "cudaStreamWaitEvent (allreduce join)", stream,
        [this] { return capture::key_of(kJoinOp, reinterpret_cast<uintptr_t>(this)); },
        [this] { transport->join(); });
  }
  static constexpr uint64_t kBucketOp = 0x6e63636c62756b74ull, kJoinOp = 0x6e63636c6a6f696eull,
                            kGatherOp = 0x6e63636c67617468ull, kSumOp = 0x6e63636c73756d31ull;

  void enqueue_ready() {
    while (next < ready.size() && ready[next]) enqueue(next++);
  }

  // The watchdog's event after the work enqueued so far (after the step's graph when it is
  // recorded), armed for `s`.
  void arm_watchdog(uint64_t s) {
    Transport* t = transport.get();
    capture::after_enqueued(stream, [t, s] { t->enqueued(s); });
  }
  uint64_t finished_step = 0;  // the last step finish() enqueued
};

NcclBucketReducer::NcclBucketReducer(GradBuckets buckets, void* compute_stream, int rank, int world,
                                     double timeout_s, bool emulated, bool shard)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.buckets = std::move(buckets);
  m.stream = compute_stream;
  m.rank = rank;
  m.world = world;
  m.shard = shard && world > 1;
  if (emulated) {
    m.transport = std::make_unique<MpiHostTransport>(m.buckets, rank, world, timeout_s);
  } else {
#if SLIPSTREAM_HAS_CUDA
    if (!m.buckets.device().is_cuda())
      throw std::runtime_error("allreduce backend nccl reduces GPU gradients; this run's are on " +
                               m.buckets.device().str() + ": use backend mpi (or auto)");
    m.transport = std::make_unique<NcclTransport>(
        m.buckets, static_cast<cudaStream_t>(compute_stream), rank, world, timeout_s);
#else
    (void)rank;
    throw std::runtime_error("allreduce backend nccl needs a CUDA build");
#endif
  }
  const size_t n = m.buckets.count();
  m.pending.assign(n, 0);
  m.param_done.assign(m.buckets.param_count(), 0);
  m.ready.assign(n, 0);
}

NcclBucketReducer::~NcclBucketReducer() = default;

void NcclBucketReducer::param_ready(size_t k, uint64_t step) {
  Impl& m = *impl_;
  if (m.step != step) m.start_step(step);
  if (m.param_done[k]) return;
  m.param_done[k] = 1;
  bool any = false;
  for (size_t i : m.buckets.buckets_of(k))
    if (--m.pending[i] == 0) m.ready[i] = 1, any = true;
  if (any) m.enqueue_ready();
}

void NcclBucketReducer::finish(uint64_t step) {
  Impl& m = *impl_;
  if (m.step != step) m.start_step(step);
  for (size_t k = 0; k < m.param_done.size(); ++k) param_ready(k, step);
  m.enqueue_ready();
  m.enqueue_join();
  m.arm_watchdog(step);
  m.finished_step = step;
  m.step = 0;  // the next call starts a new collection, even for the same step number
}

std::vector<GradBuckets::Range> NcclBucketReducer::shard_pieces(int rank) const {
  const Impl& m = *impl_;
  if (!m.shard) return {};
  return m.buckets.shard_pieces(rank, m.world);
}

void NcclBucketReducer::gather_weights() {
  Impl& m = *impl_;
  if (!m.shard) throw std::logic_error("allreduce: gather_weights without shard_optimizer");
  capture::enqueue(
      "ncclBroadcast (allreduce all-gather of the weights)", m.stream,
      [&m] { return capture::key_of(Impl::kGatherOp, reinterpret_cast<uintptr_t>(&m)); },
      [&m] {
        for (size_t i = 0; i < m.buckets.count(); ++i) m.transport->gather_weights(i);
      });
  // The watchdog watches past the gather too: a rank that stops between the reduce-scatter and
  // the all-gather leaves the others waiting in the latter.
  m.arm_watchdog(m.finished_step);
}

void NcclBucketReducer::sum(double* value) {
  Impl& m = *impl_;
  capture::enqueue(
      "ncclAllReduce (the gradient norm over the ranks)", m.stream,
      [&m, value] {
        return capture::key_of(Impl::kSumOp, reinterpret_cast<uintptr_t>(&m),
                               reinterpret_cast<uintptr_t>(value));
      },
      [&m, value] { m.transport->sum(value); });
}

}  // namespace slipstream::dist
