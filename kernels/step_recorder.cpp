#include "kernels/step_recorder.h"

#include <mutex>
#include <unordered_set>

namespace slipstream::capture {

namespace {
thread_local StepRecorder* active = nullptr;
}  // namespace

StepRecorder::StepRecorder(void* stream) : stream_(stream), previous_(active) {
  active = this;
}

StepRecorder::~StepRecorder() {
  active = previous_;
  try {
    run_deferred();
  } catch (...) {
    // Deferred work marks memory reusable; a failing stream has reported its error already.
  }
}

std::vector<RecordedOp> StepRecorder::finish() {
  recording_ = false;
  return std::move(ops_);
}

void StepRecorder::run_deferred() {
  std::vector<std::function<void()>> d;
  d.swap(deferred_);
  for (auto& fn : d) fn();
}

void StepRecorder::add(const char* what, uint64_t key, std::function<void()> issue) {
  hash_ = mix_bytes(hash_, &key, sizeof key);
  ops_.push_back({std::move(issue), what, stage_, key});
}

void StepRecorder::stop(const std::string& reason) {
  if (!recording_) return;
  recording_ = false;
  reason_ = reason;
  const std::vector<RecordedOp> ops = std::move(ops_);
  ops_.clear();
  issue_ops(ops);
  run_deferred();
}

void StepRecorder::defer(std::function<void()> fn) {
  deferred_.push_back(std::move(fn));
}

Unrecorded::Unrecorded() : saved_(active) {
  active = nullptr;
}

Unrecorded::~Unrecorded() {
  active = saved_;
}

StepRecorder* recording_for(void* stream) {
  return active && active->recording() && active->stream() == stream ? active : nullptr;
}

StepRecorder* recording_here() {
  return active && active->recording() ? active : nullptr;
}

void issue_op(const RecordedOp& op) {
  try {
    op.issue();
  } catch (const std::exception& e) {
    throw IssueError(op.stage, e.what());
  }
}

void issue_ops(const std::vector<RecordedOp>& ops) {
  for (const RecordedOp& op : ops) issue_op(op);
}

const char* stable_name(const std::string& name) {
  static std::mutex mu;
  static std::unordered_set<std::string> names;  // nodes: their strings never move
  std::lock_guard<std::mutex> lock(mu);
  return names.insert(name).first->c_str();
}

void sync_point(const char* what) {
  if (StepRecorder* r = recording_here()) r->stop(what);
}

void after_enqueued(void* stream, std::function<void()> fn) {
  if (StepRecorder* r = recording_for(stream))
    r->defer(std::move(fn));
  else
    fn();
}

}  // namespace slipstream::capture
