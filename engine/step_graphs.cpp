#include "engine/step_graphs.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

namespace {
constexpr size_t kSeenSignatures = 2 * StepGraphs::kMaxGraphs;
constexpr int kUncapturedSteps = 3;  // in a row: graph mode goes off
}  // namespace

StepGraphs::StepGraphs(const ExecContext& exec, std::function<std::string(int)> stage_name,
                       CaptureFault capture_fault)
    : exec_(exec), stage_name_(std::move(stage_name)), capture_fault_(std::move(capture_fault)) {
  if (!exec.device_ops())
    throw std::logic_error("StepGraphs: CUDA graphs need a CUDA device or the emulator");
}

StepGraphs::~StepGraphs() {
  pending_ = nullptr;  // its stamps are not read: the run ended without collect_times()
  for (Graph& g : graphs_) destroy(g);
}

void StepGraphs::destroy(Graph& g) {
  if (&g == pending_) collect_times();
#if SLIPSTREAM_HAS_CUDA
  if (g.exec) cuda_rt::destroy_graph(g.exec);
  for (void* e : g.events) cuda_rt::destroy_event(e);
#endif
  g.exec = nullptr;
  g.events.clear();
  g.replay.clear();
}

void StepGraphs::time_operations(uint64_t after_batches) {
  timing_ = true;
  time_after_ = after_batches;
}

void StepGraphs::add_time(const OpName& op, double ms) {
  Sum& s = sums_[{op.what, op.stage}];
  ++s.launches;
  s.ms += ms;
}

void StepGraphs::collect_times() {
  Graph* g = pending_;
  if (!g) return;
  pending_ = nullptr;
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::elapsed_between(exec_.device().index, exec_.stream(), g->events, elapsed_);
  for (size_t i = 0; i < elapsed_.size() && i < g->names.size(); ++i) {
    add_time(g->names[i], elapsed_[i]);
    graph_ms_ += elapsed_[i];
  }
  ++timed_graphs_;
#endif
}

OperationTimes StepGraphs::operation_times() const {
  OperationTimes t;
  t.graphs = timed_graphs_;
  t.untimed = untimed_;
  t.graph_ms = graph_ms_;
  for (const auto& [key, sum] : sums_)
    t.ops.push_back({key.first, key.second, "", sum.launches, sum.ms});
  std::stable_sort(t.ops.begin(), t.ops.end(), [](const OperationTime& a, const OperationTime& b) {
    return a.device_ms > b.device_ms;
  });
  return t;
}

void StepGraphs::launch(Graph& g, bool timed) {
  collect_times();  // the previous launch's stamps, before this one (maybe the same graph) stamps
#if SLIPSTREAM_HAS_CUDA
  if (g.exec) {
    cuda_rt::launch_graph(exec_.device().index, g.exec, exec_.stream());
    if (timed && !g.events.empty()) pending_ = &g;
    return;
  }
#endif
  if (!timed) return capture::issue_ops(g.replay);
  // The emulator runs each operation on this thread as it is issued: the host's clock is its time.
  using Clock = std::chrono::steady_clock;
  for (const capture::RecordedOp& op : g.replay) {
    const auto t0 = Clock::now();
    capture::issue_op(op);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    add_time({op.what, op.stage}, ms);
    graph_ms_ += ms;
  }
  ++timed_graphs_;
}

void StepGraphs::note_difference(const std::vector<capture::RecordedOp>& ops) {
  if (last_new_.size() == ops.size()) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].key == last_new_[i].key) continue;
      const int k = ops[i].stage;
      const std::string stage = stage_name_ ? stage_name_(k) : "stage " + std::to_string(k);
      difference_ = "operation " + std::to_string(i + 1) + " of " + std::to_string(ops.size()) +
                    ", " + ops[i].what + " (" + stage + ")";
      break;
    }
  }
  last_new_.clear();
  for (const auto& op : ops) last_new_.push_back({op.key, op.what, op.stage});
}

void StepGraphs::turn_off(uint64_t step, const std::string& why) {
  enabled_ = false;
  off_reason_ = "off from step " + std::to_string(step) + ": " + why;
}

StepGraphs::Counts StepGraphs::counts() const {
  return {replayed_.load(),   captured_.load(), issued_.load(),
          uncaptured_.load(), held_.load(),     last_ops_.load()};
}

StepGraphs::Outcome StepGraphs::finish(capture::StepRecorder& rec, uint64_t step) {
  struct Deferred {  // the recorder's deferred work follows whatever was issued, even on error
    capture::StepRecorder& r;
    ~Deferred() {
      try {
        r.run_deferred();
      } catch (...) {
        // Events that mark memory reusable; the error that matters is on its way.
      }
    }
  } deferred{rec};

  const bool timed_step = timing_ && ++batches_ > time_after_;
  if (!rec.recording()) {  // a synchronous point issued the work already
    const std::string why = rec.stop_reason();
    rec.finish();
    ++uncaptured_;
    untimed_ += timed_step;
    if (++uncaptured_in_a_row_ >= kUncapturedSteps)
      turn_off(step, std::to_string(kUncapturedSteps) +
                         " steps in a row met what a graph cannot hold: " + why);
    return Outcome::uncaptured;
  }
  uncaptured_in_a_row_ = 0;
  const uint64_t signature = rec.signature();
  std::vector<capture::RecordedOp> ops = rec.finish();
  const size_t n = ops.size();
  last_ops_ = n;
  const bool on_device = exec_.backend() == KernelBackend::cuda;

  for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
    if (it->signature != signature || it->ops != n) continue;
    graphs_.splice(graphs_.begin(), graphs_, it);  // most recently used first
    launch(graphs_.front(), timed_step);
    ++replayed_;
    return Outcome::replayed;
  }

  const auto key = std::make_pair(signature, n);
  const auto seen = std::find(seen_.begin(), seen_.end(), key);
  if (seen == seen_.end() || n == 0) {  // first sight: issue, remember
    note_difference(ops);
    if (n > 0) {
      seen_.push_back(key);
      if (seen_.size() > kSeenSignatures) seen_.erase(seen_.begin());
    }
    capture::issue_ops(ops);
    ++issued_;
    untimed_ += timed_step;
    return Outcome::issued;
  }
  seen_.erase(seen);

  Graph g;
  g.signature = signature;
  g.ops = n;
  std::string why = capture_fault_ ? capture_fault_(step) : std::string();
  if (timing_ && on_device) {  // the emulator's replay holds its operations' names itself
    g.names.reserve(n);
    for (const auto& op : ops) g.names.push_back({op.what, op.stage});
  }
#if SLIPSTREAM_HAS_CUDA
  if (why.empty() && on_device) {
    const int device = exec_.device().index;
    if (timing_)
      for (size_t i = 0; i <= n; ++i) g.events.push_back(cuda_rt::create_timing_event(device));
    g.exec = cuda_rt::capture_graph(device, exec_.stream(), ops, &why,
                                    g.events.empty() ? nullptr : &g.events);
    if (!g.exec && why.empty()) why = "no graph came back";
  }
#endif
  if (!why.empty()) {  // nothing ran under the failed capture: the work is issued as it is
    destroy(g);
    capture::issue_ops(ops);
    ++issued_;
    untimed_ += timed_step;
    turn_off(step, "the step's capture failed: " + why);
    return Outcome::issued;
  }
  if (!on_device) g.replay = ops;
  if (graphs_.size() >= kMaxGraphs) {
    // The least recently used goes. One still in flight is freed when it completes
    // (cuGraphExecDestroy's contract), so the host does not wait for it.
    destroy(graphs_.back());
    graphs_.pop_back();
  }
  graphs_.push_front(std::move(g));
  held_ = graphs_.size();
  launch(graphs_.front(), timed_step);
  ++captured_;
  // Work that recurs replays far more often than it is captured; work that does not (a value
  // that changes every step among the launches' arguments) would capture every other step.
  if (captured_ >= 3 * kMaxGraphs && replayed_ < 2 * captured_)
    turn_off(step, "the step's work changes from step to step (" + std::to_string(captured_) +
                       " graphs captured, " + std::to_string(replayed_) + " replays)" +
                       (difference_.empty() ? "" : "; new steps differ first at " + difference_));
  return Outcome::captured;
}

}  // namespace slipstream
