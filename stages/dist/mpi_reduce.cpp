#include "stages/dist/mpi_reduce.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <stdexcept>
#include <thread>

#include "engine/launch.h"
#include "engine/rank_reduce.h"

#if SLIPSTREAM_HAS_MPI
#include <mpi.h>
#endif

namespace slipstream::dist {

bool launched_with_multiple_ranks() {
  return launch_info().world_size > 1;
}

#if SLIPSTREAM_HAS_MPI

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string seconds_text(double s) {
  const double r = std::round(s * 10) / 10;
  std::string t = std::to_string(r);
  t.erase(t.find_last_not_of('0') + 1);
  if (t.back() == '.') t.pop_back();
  return t + " s";
}
// Set when a wait gave up with a collective still in flight: MPI_Finalize would wait for it.
std::atomic<bool> g_broken{false};

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) +
                           " failed: " + std::string(msg, static_cast<size_t>(len)));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_broken.load()) MPI_Abort(MPI_COMM_WORLD, 1);  // the launcher ends the other ranks
  MPI_Finalize();
}

constexpr int kHeartbeatTag = 7301;
constexpr int kAliveTag = 7302;  // after a timeout: "I am still here" to every other rank
constexpr auto kPollPause = std::chrono::microseconds(20);

// After a wait that timed out: every rank still running has timed out too, within a step of each
// other, in this wait or another; each tells every other it is alive, and the ones not heard from
// in a short window stopped. The buffers live until the process ends (a late message lands
// there); the requests still open are left to MPI_Abort, which comes next.
std::vector<int> ranks_not_answering(double timeout_s) {
  static int64_t alive_out = 1;
  static std::vector<int64_t> alive_in;
  static std::vector<MPI_Request> recv, send;
  // Once a process: the first exchange's answer (a second would post receives behind the
  // first's, still open, and hear nothing).
  static std::optional<std::vector<int>> heard;
  if (heard) return *heard;
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  alive_in.assign(static_cast<size_t>(world), 0);
  recv.assign(static_cast<size_t>(world), MPI_REQUEST_NULL);
  send.assign(static_cast<size_t>(world), MPI_REQUEST_NULL);
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    check(MPI_Irecv(&alive_in[static_cast<size_t>(r)], 1, MPI_INT64_T, r, kAliveTag, MPI_COMM_WORLD,
                    &recv[static_cast<size_t>(r)]),
          "MPI_Irecv");
    check(MPI_Isend(&alive_out, 1, MPI_INT64_T, r, kAliveTag, MPI_COMM_WORLD,
                    &send[static_cast<size_t>(r)]),
          "MPI_Isend");
  }
  const double until = now_s() + std::clamp(timeout_s / 2, 1.0, 10.0);
  std::vector<int> silent;
  for (;;) {
    silent.clear();
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      int flag = 0;
      MPI_Request& q = recv[static_cast<size_t>(r)];
      if (q != MPI_REQUEST_NULL) check(MPI_Test(&q, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (q != MPI_REQUEST_NULL) silent.push_back(r);
    }
    if (silent.empty() || now_s() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  heard = silent;
  return silent;
}

// "ranks 1, 2": who stopped, for a message.
std::string ranks_text(const std::vector<int>& ranks) {
  std::string names;
  for (int r : ranks) names += (names.empty() ? "" : ", ") + std::to_string(r);
  return (ranks.size() == 1 ? "rank " : "ranks ") + names;
}

// A collective of `what` that timed out: the ranks that stopped, named when they can be told.
[[noreturn]] void give_up(const std::string& what, double timeout_s) {
  g_broken = true;
  const std::vector<int> silent = ranks_not_answering(timeout_s);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw std::runtime_error(
      what + ": no answer from the other ranks within " + seconds_text(timeout_s) +
      " (sync.timeout_s)" +
      (silent.empty() ? std::string()
                      : ": " + ranks_text(silent) +
                            (silent.size() == 1 ? " stopped or is" : " stopped or are") +
                            " busy past it (no answer to " + "the others within " +
                            seconds_text(std::clamp(timeout_s / 2, 1.0, 10.0)) + " more)") +
      "; rank " + std::to_string(rank) + " stops");
}

}  // namespace

bool mpi_is_initialized() {
  int init = 0;
  MPI_Initialized(&init);
  return init != 0;
}

void mpi_init_once() {
  if (mpi_is_initialized()) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED)
    throw std::runtime_error("the MPI library does not support MPI_THREAD_SERIALIZED");
  std::atexit(finalize_at_exit);
}

int mpi_world_size() {
  int n = 1;
  check(MPI_Comm_size(MPI_COMM_WORLD, &n), "MPI_Comm_size");
  return n;
}

int mpi_rank() {
  int r = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &r), "MPI_Comm_rank");
  return r;
}

void mpi_abort_all(int code) {
  if (mpi_is_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void mpi_broadcast(void* data, size_t bytes, int root) {
  check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
}

namespace {
// data = its reduction over all ranks, in place, waiting at most timeout_s.
void allreduce_in_place(void* data, size_t n, MPI_Datatype type, MPI_Op op, double timeout_s,
                        const std::string& what) {
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), type, op, MPI_COMM_WORLD, &req),
        "MPI_Iallreduce");
  const double deadline = now_s() + timeout_s;
  for (;;) {
    int flag = 0;
    check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    if (now_s() > deadline) give_up(what, timeout_s);
    std::this_thread::sleep_for(kPollPause);
  }
}
}  // namespace

void mpi_reduce(std::span<double> values, RankReduce op, double timeout_s,
                const std::string& what) {
  allreduce_in_place(values.data(), values.size(), MPI_DOUBLE,
                     op == RankReduce::min   ? MPI_MIN
                     : op == RankReduce::max ? MPI_MAX
                                             : MPI_SUM,
                     timeout_s, what);
}

void mpi_average(std::span<float> values, double timeout_s, const std::string& what) {
  allreduce_in_place(values.data(), values.size(), MPI_FLOAT, MPI_SUM, timeout_s, what);
  const float inv = 1.0f / static_cast<float>(mpi_world_size());
  for (float& v : values) v *= inv;
}

// Runs of several ranks reduce their metric sums (and the loader its step count) through MPI.
const bool g_registered = [] {
  register_rank_reduce([]() -> RankReduceFn {
    mpi_init_once();
    return [](std::span<double> v, RankReduce op, const std::string& what) {
      mpi_reduce(v, op, 300.0, what);
    };
  });
  return true;
}();

struct MpiBucketReducer::Mpi {
  std::vector<MPI_Request> requests;  // per bucket
  std::vector<size_t> in_flight;      // worker: buckets posted and not yet complete
  MPI_Request beat_in = MPI_REQUEST_NULL;
  int64_t beat_in_value = 0;
  MPI_Request beat_out[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL,
                             MPI_REQUEST_NULL};
  int64_t beat_out_value[4] = {0, 0, 0, 0};
  size_t beat_next = 0;
};

MpiBucketReducer::MpiBucketReducer(GradBuckets buckets, double timeout_s, bool shard)
    : buckets_(std::move(buckets)),
      timeout_s_(timeout_s),
      mpi_(std::make_unique<Mpi>()),
      shard_(shard) {
  if (!buckets_.device().is_cpu())
    throw std::runtime_error("allreduce backend mpi reduces host gradients; this run's are on " +
                             buckets_.device().str() + ": use backend nccl (or auto)");
  rank_ = mpi_rank();
  world_ = mpi_world_size();
  const size_t n = buckets_.count();
  staging_.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (!buckets_.contiguous(i)) staging_[i].assign(buckets_.size(i), 0.0f);
  if (shard_) {
    // Bucket i's buffer split evenly: rank r takes [size·r/W, size·(r+1)/W).
    counts_.resize(n);
    displs_.resize(n);
    received_.resize(n);
    value_staging_.resize(n);
    const auto w = static_cast<size_t>(world_);
    for (size_t i = 0; i < n; ++i) {
      const size_t size = buckets_.size(i);
      if (size > static_cast<size_t>(std::numeric_limits<int>::max()))
        throw std::runtime_error("allreduce: a bucket of " + std::to_string(size) +
                                 " floats is more than one MPI message holds: lower bucket_mb");
      for (size_t r = 0; r < w; ++r) {
        displs_[i].push_back(static_cast<int>(size * r / w));
        counts_[i].push_back(static_cast<int>(size * (r + 1) / w - size * r / w));
      }
      received_[i].assign(std::max(1, counts_[i][static_cast<size_t>(rank_)]), 0.0f);
      if (!buckets_.value_block(i)) {
        for (const auto& p : buckets_.pieces(i)) {
          const Tensor& v = buckets_.params()[p.param]->value;
          if (!v.defined() || v.dtype() != DType::f32 || !v.device().is_cpu() ||
              v.numel() != buckets_.params()[p.param]->grad.numel())
            throw std::runtime_error("allreduce shard_optimizer: parameter '" +
                                     buckets_.params()[p.param]->name +
                                     "' needs f32 weights on the host beside its gradient");
        }
        value_staging_[i].assign(size, 0.0f);
      }
    }
  }
  pending_.assign(n, 0);
  param_done_.assign(buckets_.param_count(), 0);
  ready_.assign(n, 0);
  mpi_->requests.assign(n, MPI_REQUEST_NULL);
  mpi_->in_flight.reserve(n);
  // Steps reached by the left-hand neighbour arrive here, one message per step.
  const int left = (rank_ + world_ - 1) % world_;
  check(MPI_Irecv(&mpi_->beat_in_value, 1, MPI_INT64_T, left, kHeartbeatTag, MPI_COMM_WORLD,
                  &mpi_->beat_in),
        "MPI_Irecv");
  thread_ = std::thread([this] { worker(); });
}

MpiBucketReducer::~MpiBucketReducer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_broken.load()) return;
  if (mpi_->beat_in != MPI_REQUEST_NULL) {
    MPI_Cancel(&mpi_->beat_in);
    MPI_Wait(&mpi_->beat_in, MPI_STATUS_IGNORE);
  }
  for (MPI_Request& r : mpi_->beat_out)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // eager sends: delivered or buffered
}

void MpiBucketReducer::start_step(uint64_t step) {
  step_ = step;
  for (size_t i = 0; i < pending_.size(); ++i) pending_[i] = buckets_.params_in(i);
  std::fill(param_done_.begin(), param_done_.end(), uint8_t{0});
  std::lock_guard lock(mu_);
  std::fill(ready_.begin(), ready_.end(), uint8_t{0});
  ready_count_ = done_count_ = 0;
  first_post_s_ = last_done_s_ = 0;
  active_step_ = step;
  ++generation_;
}

void MpiBucketReducer::param_ready(size_t k, uint64_t step) {
  if (step_ != step) start_step(step);
  if (param_done_[k]) return;
  param_done_[k] = 1;
  for (size_t i : buckets_.buckets_of(k)) {
    if (--pending_[i] != 0) continue;
    {
      std::lock_guard lock(mu_);
      ready_[i] = 1;
      ++ready_count_;
    }
    work_cv_.notify_one();
  }
}

MpiBucketReducer::StepTiming MpiBucketReducer::finish(uint64_t step) {
  if (step_ != step) start_step(step);
  for (size_t k = 0; k < param_done_.size(); ++k) param_ready(k, step);
  const double t0 = now_s();
  StepTiming t;
  {
    std::unique_lock lock(mu_);
    const bool done = done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_),
                                        [&] { return done_count_ == ready_.size(); });
    if (!done) {
      lock.unlock();
      timed_out(step);
    }
    if (!ready_.empty()) t.comm_s = last_done_s_ - first_post_s_;
  }
  t.exposed_s = std::min(t.comm_s, now_s() - t0);
  step_ = 0;  // the next call starts a new collection, even for the same step number
  return t;
}

void MpiBucketReducer::timed_out(uint64_t step) {
  g_broken = true;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
  const int left = (rank_ + world_ - 1) % world_;
  const int64_t reached = left_step_.load();
  const std::string head = "allreduce of step " + std::to_string(step) + ": no answer within " +
                           seconds_text(timeout_s_) + " (sync.timeout_s): ";
  const std::string tail =
      "; every rank stops (slipstream run --resume RUN_DIR continues from the last checkpoint "
      "written, if any)";
  if (reached < static_cast<int64_t>(step))
    throw std::runtime_error(head + "rank " + std::to_string(left) +
                             " stopped before reaching step " + std::to_string(step) +
                             (reached > 0
                                  ? " (the last step it reached: " + std::to_string(reached) + ")"
                                  : std::string(" (it reached no step)")) +
                             tail);
  // The left-hand neighbour reached the step: a rank stopped inside it (after its first bucket
  // went out). The ranks still running have all timed out by now, within a step of each other:
  // each tells every other it is alive, and the ones not heard from in a short window stopped.
  const std::vector<int> silent = ranks_not_answering(timeout_s_);
  if (!silent.empty()) {
    // The first live rank after a silent one says it; the others after a pause (the launcher
    // normally ends them first), so one message names it.
    if ((rank_ + world_ - 1) % world_ != silent.front())
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(timeout_s_, 30.0)));
    throw std::runtime_error(head + ranks_text(silent) + " stopped during step " +
                             std::to_string(step) +
                             " (reached, never finished: no answer to the others)" + tail);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(timeout_s_, 30.0)));
  throw std::runtime_error(head + "every rank answers, yet the step's reductions did not finish" +
                           tail);
}

std::vector<GradBuckets::Range> MpiBucketReducer::shard_pieces(int rank) const {
  if (!shard_) return {};
  return buckets_.shard_pieces(rank, world_);
}

namespace {

// Waits for every request until the deadline; false when it passed first.
bool wait_all(std::vector<MPI_Request>& requests, double timeout_s) {
  const double deadline = now_s() + timeout_s;
  for (;;) {
    int flag = 0;
    check(
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
        "MPI_Testall");
    if (flag) return true;
    if (now_s() > deadline) return false;
    std::this_thread::sleep_for(kPollPause);
  }
}

}  // namespace

void MpiBucketReducer::gather_weights(uint64_t step) {
  if (!shard_) throw std::logic_error("allreduce: gather_weights without shard_optimizer");
  // The helper thread is idle between finish() and the next step's first bucket: this thread
  // may call MPI (MPI_THREAD_SERIALIZED).
  const size_t n = buckets_.count();
  std::vector<MPI_Request> requests(n, MPI_REQUEST_NULL);
  for (size_t i = 0; i < n; ++i) {
    float* data = buckets_.value_block(i);
    if (!data) {
      data = value_staging_[i].data();
      buckets_.flatten_values(i, data);  // this rank's range is what the others need
    }
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts_[i].data(),
                          displs_[i].data(), MPI_FLOAT, MPI_COMM_WORLD, &requests[i]),
          "MPI_Iallgatherv");
  }
  if (!wait_all(requests, timeout_s_)) timed_out(step);
  for (size_t i = 0; i < n; ++i)
    if (!buckets_.value_block(i)) buckets_.unflatten_values(i, value_staging_[i].data());
}

void MpiBucketReducer::gather_to_root(std::span<const float> mine, std::vector<float>& all,
                                      const std::string& what) {
  mpi_gather_to_root(mine, all, timeout_s_, what);
}

void mpi_gather_to_root(std::span<const float> mine, std::vector<float>& all, double timeout_s,
                        const std::string& what) {
  if (mine.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw std::runtime_error(what + ": more than one MPI message holds");
  const int rank = mpi_rank();
  auto give_up = [&] { slipstream::dist::give_up(what, timeout_s); };
  // How much each rank sends, then what it sends.
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(mpi_world_size()), 0), displs(counts.size(), 0);
  std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
  check(MPI_Igather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &request[0]),
        "MPI_Igather");
  if (!wait_all(request, timeout_s)) give_up();
  size_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (total > static_cast<size_t>(std::numeric_limits<int>::max()))
      throw std::runtime_error(what + ": more than one MPI message holds");
    displs[r] = static_cast<int>(total);
    total += static_cast<size_t>(counts[r]);
  }
  if (rank == 0) all.resize(total);
  check(MPI_Igatherv(mine.data(), count, MPI_FLOAT, rank == 0 ? all.data() : nullptr, counts.data(),
                     displs.data(), MPI_FLOAT, 0, MPI_COMM_WORLD, &request[0]),
        "MPI_Igatherv");
  if (!wait_all(request, timeout_s)) give_up();
}

namespace {
// Counts and displacements of bucket-sized buffers as MPI's ints.
std::vector<int> as_ints(std::span<const size_t> v, const std::string& what) {
  std::vector<int> out;
  for (size_t x : v) {
    if (x > static_cast<size_t>(std::numeric_limits<int>::max()))
      throw std::runtime_error(what + ": more than one MPI message holds: lower bucket_mb");
    out.push_back(static_cast<int>(x));
  }
  return out;
}
void wait_or_give_up(MPI_Request& req, double timeout_s, const std::string& what) {
  std::vector<MPI_Request> one(1, req);
  if (wait_all(one, timeout_s)) return;
  give_up(what, timeout_s);
}
}  // namespace

void mpi_reduce_scatter_average(const float* data, std::span<const size_t> counts, float* mine,
                                double timeout_s, const std::string& what) {
  const std::vector<int> c = as_ints(counts, what);
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Ireduce_scatter(data, mine, c.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req),
        "MPI_Ireduce_scatter");
  wait_or_give_up(req, timeout_s, what);
  const float inv = 1.0f / static_cast<float>(mpi_world_size());
  for (int i = 0; i < c[static_cast<size_t>(mpi_rank())]; ++i) mine[i] *= inv;
}

void mpi_allgather_in_place(float* data, std::span<const size_t> counts,
                            std::span<const size_t> displs, double timeout_s,
                            const std::string& what) {
  const std::vector<int> c = as_ints(counts, what), d = as_ints(displs, what);
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, c.data(), d.data(), MPI_FLOAT,
                        MPI_COMM_WORLD, &req),
        "MPI_Iallgatherv");
  wait_or_give_up(req, timeout_s, what);
}

void MpiBucketReducer::worker() {
  Mpi& m = *mpi_;
  const size_t n = ready_.size();
  const int right = (rank_ + 1) % world_;
  uint64_t step = 0, generation = 0;
  size_t next = 0, done = 0;
  for (;;) {
    size_t post_end = next;
    {
      std::unique_lock lock(mu_);
      if (m.in_flight.empty())
        work_cv_.wait(
            lock, [&] { return stop_ || generation_ != generation || (next < n && ready_[next]); });
      if (stop_) return;
      if (generation_ != generation)
        generation = generation_, step = active_step_, next = 0, done = 0;
      post_end = next;
      while (post_end < n && ready_[post_end]) ++post_end;
    }
    // Buckets start in index order on every rank: collectives must match across ranks.
    for (; next < post_end; ++next) {
      if (next == 0) {
        std::lock_guard lock(mu_);
        first_post_s_ = now_s();
      }
      if (next == 0 && world_ > 1) {
        size_t s = m.beat_next++ % 4;
        int sent = 1;
        if (m.beat_out[s] != MPI_REQUEST_NULL)
          check(MPI_Test(&m.beat_out[s], &sent, MPI_STATUS_IGNORE), "MPI_Test");
        if (sent) {
          m.beat_out_value[s] = static_cast<int64_t>(step);
          check(MPI_Isend(&m.beat_out_value[s], 1, MPI_INT64_T, right, kHeartbeatTag,
                          MPI_COMM_WORLD, &m.beat_out[s]),
                "MPI_Isend");
        }
      }
      float* data = buckets_.contiguous(next);
      if (!data) {
        buckets_.flatten(next, staging_[next].data());
        data = staging_[next].data();
      }
      if (shard_)
        check(MPI_Ireduce_scatter(data, received_[next].data(), counts_[next].data(), MPI_FLOAT,
                                  MPI_SUM, MPI_COMM_WORLD, &m.requests[next]),
              "MPI_Ireduce_scatter");
      else
        check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(buckets_.size(next)), MPI_FLOAT,
                             MPI_SUM, MPI_COMM_WORLD, &m.requests[next]),
              "MPI_Iallreduce");
      m.in_flight.push_back(next);
    }
    bool progressed = false;
    const float scale = 1.0f / static_cast<float>(world_);
    for (size_t j = 0; j < m.in_flight.size();) {
      const size_t i = m.in_flight[j];
      int flag = 0;
      check(MPI_Test(&m.requests[i], &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (!flag) {
        ++j;
        continue;
      }
      const auto r = static_cast<size_t>(rank_);
      if (shard_)
        buckets_.unflatten_range(i, received_[i].data(), static_cast<size_t>(displs_[i][r]),
                                 static_cast<size_t>(counts_[i][r]), scale);
      else if (buckets_.contiguous(i))
        buckets_.scale(i, scale);
      else
        buckets_.unflatten(i, staging_[i].data(), scale);
      m.in_flight.erase(m.in_flight.begin() + static_cast<std::ptrdiff_t>(j));
      progressed = true;
      ++done;
    }
    // The neighbour's steps, as many as have arrived.
    for (int flag = 1; flag && m.beat_in != MPI_REQUEST_NULL;) {
      check(MPI_Test(&m.beat_in, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (!flag) break;
      left_step_ = m.beat_in_value;
      const int left = (rank_ + world_ - 1) % world_;
      check(MPI_Irecv(&m.beat_in_value, 1, MPI_INT64_T, left, kHeartbeatTag, MPI_COMM_WORLD,
                      &m.beat_in),
            "MPI_Irecv");
    }
    if (progressed && done == n) {
      {
        std::lock_guard lock(mu_);
        last_done_s_ = now_s();
        done_count_ = n;
      }
      done_cv_.notify_all();
    }
    if (!m.in_flight.empty() && !progressed) std::this_thread::sleep_for(kPollPause);
  }
}

#else  // a build configured with -DSLIPSTREAM_MPI=OFF: one process, no MPI backend

namespace {
[[noreturn]] void no_mpi() {
  throw std::runtime_error(
      "allreduce backend mpi: this build has no MPI (configured with -DSLIPSTREAM_MPI=OFF); "
      "install Open MPI (libopenmpi-dev) and reconfigure, or run one process with backend none");
}
}  // namespace

struct MpiBucketReducer::Mpi {};

void mpi_init_once() {
  no_mpi();
}
int mpi_world_size() {
  return 1;
}
int mpi_rank() {
  return 0;
}
bool mpi_is_initialized() {
  return false;
}
void mpi_abort_all(int code) {
  std::_Exit(code);
}
void mpi_broadcast(void*, size_t, int) {
  no_mpi();
}
void mpi_reduce(std::span<double>, RankReduce, double, const std::string&) {
  no_mpi();
}
void mpi_average(std::span<float>, double, const std::string&) {
  no_mpi();
}
void mpi_gather_to_root(std::span<const float>, std::vector<float>&, double, const std::string&) {
  no_mpi();
}
void mpi_reduce_scatter_average(const float*, std::span<const size_t>, float*, double,
                                const std::string&) {
  no_mpi();
}
void mpi_allgather_in_place(float*, std::span<const size_t>, std::span<const size_t>, double,
                            const std::string&) {
  no_mpi();
}
MpiBucketReducer::MpiBucketReducer(GradBuckets buckets, double timeout_s, bool shard)
    : buckets_(std::move(buckets)), timeout_s_(timeout_s), shard_(shard) {
  no_mpi();
}
std::vector<GradBuckets::Range> MpiBucketReducer::shard_pieces(int) const {
  no_mpi();
}
void MpiBucketReducer::gather_weights(uint64_t) {
  no_mpi();
}
void MpiBucketReducer::gather_to_root(std::span<const float>, std::vector<float>&,
                                      const std::string&) {
  no_mpi();
}
MpiBucketReducer::~MpiBucketReducer() = default;
void MpiBucketReducer::param_ready(size_t, uint64_t) {
  no_mpi();
}
MpiBucketReducer::StepTiming MpiBucketReducer::finish(uint64_t) {
  no_mpi();
}
void MpiBucketReducer::worker() {}
void MpiBucketReducer::start_step(uint64_t) {}
void MpiBucketReducer::timed_out(uint64_t) {
  no_mpi();
}

#endif

}  // namespace slipstream::dist
