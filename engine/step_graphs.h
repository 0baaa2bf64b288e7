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
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "engine/exec_context.h"
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

  // At most this many graphs are held (the least recently used goes): a step's work comes in a
  // few shapes, each of which replays — one per prefetch-ring slot, times two with gradient
  // accumulation (the micro-batch that ends a step also runs the optimizer). A graph costs
  // kilobytes of host and device memory; its buffers are the run's own.
  static constexpr size_t kMaxGraphs = 32;

 private:
  struct Graph {
    uint64_t signature = 0;
    size_t ops = 0;
    void* exec = nullptr;                     // cudaGraphExec_t on a device
    std::vector<capture::RecordedOp> replay;  // the emulator's graph
  };
  void turn_off(uint64_t step, const std::string& why);
  void note_difference(const std::vector<capture::RecordedOp>& ops);
  void destroy(Graph& g);
  void launch(const Graph& g);  // on the stream; under the emulator, its operations

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
};

}  // namespace slipstream
