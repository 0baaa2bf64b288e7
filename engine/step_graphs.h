// The training step as a CUDA graph (run.cuda_graph): one launch in place of the step's few
// hundred kernel launches, which at small shapes cost the host more time than the GPU spends.
//
// The runner records each training batch's section (kernels/step_recorder.h): the stages' host
// code runs as always, their device work is kept with its arguments and hashed. At the section's
// end, finish() decides:
//   - a graph captured from an earlier step has the same signature (the same operations with the
//     same arguments, buffers included): it is launched — that is exactly the recorded work;
//   - the signature was seen once before (work that recurs: the prefetch ring's slots and the
//     pools' buffers come round again): the operations are captured into a new graph, which is
//     launched;
//   - otherwise the operations are issued one by one, as without a recorder.
// A step that reaches a synchronous point (a blocking copy, a library call not recorded) issues
// its work there and runs uncaptured. Graph mode turns itself off, with a one-line reason, when
// that happens 3 steps in a row, when a capture fails, or when the work never recurs (graphs
// captured but hardly replayed). Under the emulator a "graph" is the list of recorded operations
// replayed with their captured arguments, so CI runs the same decisions on the CPU.
//
// time_operations() stamps the time between every two operations of each graph it captures
// (CUDA events recorded as nodes of the graph; under the emulator, the host's clock around each
// operation of a replay) and sums each operation's time by kernel and stage: where the device's
// time goes inside the step as the graph really runs it, caches and clocks as the step leaves
// them. A timed launch's stamps are read before the next launch, so the host waits for each
// graph to end: the operations' times are the device's own, the step's wall time is not.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/exec_context.h"
#include "engine/operation_times.h"
#include "kernels/step_recorder.h"

namespace slipstream {

class StepGraphs {
 public:
  // Says why step `step`'s capture fails ("" when it does not): a fault to inject, so the
  // fallback a device takes when a library refuses capture (the work issued, graph mode off with
  // the reason) runs under the emulator too.
  using CaptureFault = std::function<std::string(uint64_t step)>;
  // `exec`: a CUDA or emulated context (the graphs run on its stream). `stage_name` names graph
  // stage k in messages (none: "stage k").
  explicit StepGraphs(const ExecContext& exec, std::function<std::string(int)> stage_name = {},
                      CaptureFault capture_fault = {});
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  enum class Outcome { replayed, captured, issued, uncaptured };
  // The step `step`'s section has been recorded by `rec` (still active): replay, capture or issue
  // its work, then the recorder's deferred work. An operation that fails throws
  // capture::IssueError naming it and its stage.
  Outcome finish(capture::StepRecorder& rec, uint64_t step);

  // False once graph mode turned itself off; off_reason() says why, in one line.
  bool enabled() const { return enabled_; }
  const std::string& off_reason() const { return off_reason_; }
  // Where the last two steps seen for the first time differ: "operation 21 of 110,
  // scan_kernel (stage core)"; "" until two such steps of the same length were seen. What keeps
  // a step's work from recurring, for a run whose batches hardly replay.
  const std::string& difference() const { return difference_; }

  struct Counts {
    uint64_t replayed = 0, captured = 0, issued = 0, uncaptured = 0;
    size_t graphs = 0;  // held now
    size_t ops = 0;     // operations (kernels, copies, GEMMs) of the last step recorded whole
  };
  Counts counts() const;  // from any thread (the stats publisher's)

  // Times the operations of the graphs launched after the first `after_batches` calls of
  // finish() (above), in graphs captured from now on. Call before the first step.
  void time_operations(uint64_t after_batches);
  bool timing_operations() const { return timing_; }
  // A batch whose section ran without a recorder (graph mode turned off): counted as untimed
  // when timed batches had begun.
  void ran_without_graph() { untimed_ += timing_ && ++batches_ > time_after_; }
  // Reads the last timed launch's stamps (waits for it); then operation_times() holds every
  // timed launch. From the thread that calls finish(), or after the run.
  void collect_times();
  OperationTimes operation_times() const;

  // At most this many graphs are held (the least recently used goes): a step's work comes in a
  // few shapes, each of which replays — one per prefetch-ring slot, times two with gradient
  // accumulation (the micro-batch that ends a step also runs the optimizer). A graph costs
  // kilobytes of host and device memory; its buffers are the run's own.
  static constexpr size_t kMaxGraphs = 32;

 private:
  struct OpName {
    const char* what;
    int stage;
  };
  struct Graph {
    uint64_t signature = 0;
    size_t ops = 0;
    void* exec = nullptr;                     // cudaGraphExec_t on a device
    std::vector<capture::RecordedOp> replay;  // the emulator's graph
    std::vector<void*> events;                // time_operations: a stamp around each operation
    std::vector<OpName> names;                // ... and whose each operation is (a device)
  };
  void turn_off(uint64_t step, const std::string& why);
  void note_difference(const std::vector<capture::RecordedOp>& ops);
  void destroy(Graph& g);
  // On the stream; under the emulator, its operations. `timed`: its stamps are read (under the
  // emulator: its operations timed).
  void launch(Graph& g, bool timed);
  void add_time(const OpName& op, double ms);

  const ExecContext& exec_;
  std::function<std::string(int)> stage_name_;
  CaptureFault capture_fault_;
  bool enabled_ = true;
  std::string off_reason_, difference_;
  struct OpId {
    uint64_t key;
    const char* what;
    int stage;
  };
  std::vector<OpId> last_new_;                     // the last step seen for the first time
  std::list<Graph> graphs_;                        // most recently used first
  std::vector<std::pair<uint64_t, size_t>> seen_;  // signatures issued once, newest last
  std::atomic<uint64_t> replayed_{0}, captured_{0}, issued_{0}, uncaptured_{0};
  std::atomic<size_t> held_{0}, last_ops_{0};
  int uncaptured_in_a_row_ = 0;
  // time_operations: whether on, after how many batches (finish() calls; those so far), the
  // launch whose stamps are not read yet, and the sums by (kernel, stage).
  bool timing_ = false;
  uint64_t time_after_ = 0, batches_ = 0;
  Graph* pending_ = nullptr;
  std::vector<float> elapsed_;
  struct Sum {
    uint64_t launches = 0;
    double ms = 0;
  };
  std::map<std::pair<std::string, int>, Sum> sums_;
  uint64_t timed_graphs_ = 0, untimed_ = 0;
  double graph_ms_ = 0;
};

}  // namespace slipstream
