// Records the device work a training step enqueues, so that the step can run as a CUDA graph.
//
// While a StepRecorder is active on a thread, every operation that thread enqueues on the
// recorder's stream through enqueue() (kernel launches: SLIPSTREAM_LAUNCH; cuBLASLt calls; async
// copies; the emulator's stand-ins for them) is kept as a closure holding its arguments instead of
// being issued, and a hash of the operation and its arguments is folded into the step's
// signature. At the step's end the runner (engine/step_graphs.h) replays a graph captured from an
// earlier step with the same signature — the same operations with the same arguments, so the
// replay is exactly the recorded work — or captures the recorded operations into a new graph, or
// issues them one by one. The stages' host code runs every step as before (shape checks, pool
// allocations, read-back reports); only the launches are replaced by one graph launch.
//
// What cannot be captured ends the recording for that step: a synchronous point (sync_point: a
// blocking copy, a host read of device memory, a stream wait by the host, a library call that is
// not recorded) first issues what was recorded, in order, then the rest of the step runs as it
// would without a recorder. Work that must follow the step's operations on the stream but is no
// operation of the graph (events that mark memory reusable) is deferred with after_enqueued().
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace slipstream::capture {

struct RecordedOp {
  std::function<void()> issue;  // enqueues the operation on the recorder's stream
  const char* what = "";        // the kernel or call, for errors
  int stage = -1;               // the graph stage that enqueued it (StepRecorder::set_stage)
  uint64_t key = 0;             // the operation and its arguments, hashed
};

// Thrown by issue_ops() when an operation fails: names the operation; `stage` says whose it was.
class IssueError : public std::runtime_error {
 public:
  IssueError(int stage, const std::string& what) : std::runtime_error(what), stage_(stage) {}
  int stage() const { return stage_; }

 private:
  int stage_;
};

class StepRecorder {
 public:
  // Active on the calling thread until destroyed (recorders do not nest). `stream` is the
  // cudaStream_t whose work is recorded (null under the emulator, which has none).
  explicit StepRecorder(void* stream);
  // Runs the deferred work not run yet (the step failed before its end).
  ~StepRecorder();
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  void* stream() const { return stream_; }
  void set_stage(int stage) { stage_ = stage; }
  int stage() const { return stage_; }

  // True until a synchronous point ended the recording.
  bool recording() const { return recording_; }
  // Why a synchronous point ended the recording ("" when none did).
  const std::string& stop_reason() const { return reason_; }
  // The recorded operations' hash (identity and arguments of each, in order) and count.
  uint64_t signature() const { return hash_; }
  const std::vector<RecordedOp>& ops() const { return ops_; }

  // The step's end: stops recording (later enqueues are issued at once) and hands the
  // operations over; the caller issues them (issue_ops) or a graph that equals them.
  std::vector<RecordedOp> finish();
  // Deferred work, after the step's operations (or their graph) were issued.
  void run_deferred();

  // enqueue()'s, sync_point()'s and after_enqueued()'s side.
  void add(const char* what, uint64_t key, std::function<void()> issue);
  void stop(const std::string& reason);  // issues what was recorded, records nothing more
  void defer(std::function<void()> fn);

 private:
  void* stream_;
  int stage_ = -1;
  bool recording_ = true;
  std::string reason_;
  uint64_t hash_ = 0xcbf29ce484222325ull;
  std::vector<RecordedOp> ops_;
  std::vector<std::function<void()>> deferred_;
  StepRecorder* previous_;
};

// For its scope nothing is recorded on this thread: work that must precede the step's recorded
// work on the stream (a copy into a buffer only the step reads) is issued at once.
class Unrecorded {
 public:
  Unrecorded();
  ~Unrecorded();
  Unrecorded(const Unrecorded&) = delete;
  Unrecorded& operator=(const Unrecorded&) = delete;

 private:
  StepRecorder* saved_;
};

// The recorder active on this thread when it records the work of `stream`, else null.
StepRecorder* recording_for(void* stream);
// The recorder active on this thread while it records (any stream), else null.
StepRecorder* recording_here();

// Issues operations in order; an operation that throws becomes an IssueError naming it.
void issue_ops(const std::vector<RecordedOp>& ops);
void issue_op(const RecordedOp& op);  // one of them

// A hash of values' bytes (trivially copyable: pointers, sizes, scalars, small structs passed to
// kernels by value). Padding bytes are hashed too: a struct whose padding differs from one step
// to the next only costs a missed replay, never a wrong one.
inline uint64_t mix_bytes(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (; n >= 8; n -= 8, b += 8) {
    uint64_t w;
    std::memcpy(&w, b, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; n > 0; --n, ++b) h = (h ^ *b) * 0x100000001b3ull;
  return h;
}
template <class... Values>
uint64_t key_of(const Values&... values) {
  static_assert((std::is_trivially_copyable_v<Values> && ...),
                "an enqueued operation's key is made of plain values");
  uint64_t h = 0x84222325cbf29ce4ull;
  ((h = mix_bytes(h, &values, sizeof(Values))), ...);
  return h;
}
// `name` kept for the rest of the process (once per distinct name): a RecordedOp's `what` made
// at run time, e.g. a GEMM's shape.
const char* stable_name(const std::string& name);

// A function's address as a key part (a kernel's identity).
template <class F>
uintptr_t function_key(F* f) {
  return reinterpret_cast<uintptr_t>(f);
}

// Enqueues `op` on `stream`: issued now, or recorded when this thread records that stream.
// `key()` identifies the operation and every argument it passes (the closure's captures); it is
// computed only when recording.
template <class Key, class Op>
void enqueue(const char* what, void* stream, Key&& key, Op&& op) {
  if (StepRecorder* r = recording_for(stream))
    r->add(what, key(), std::function<void()>(std::forward<Op>(op)));
  else
    op();
}

// A point where the host waits for, reads or writes device memory outside stream order: a
// recording on this thread issues what it holds and ends (`what` says why, once per step).
void sync_point(const char* what);
inline void sync_point(const std::string& what) {
  sync_point(what.c_str());
}

// Work that must follow the operations enqueued so far on `stream`: run now, or after the
// recorded operations are issued when this thread records that stream.
void after_enqueued(void* stream, std::function<void()> fn);

}  // namespace slipstream::capture
