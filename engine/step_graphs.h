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

#include <cstdint>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "engine/exec_context.h"
#include "kernels/step_recorder.h"

namespace slipstream {

class StepGraphs {
 public:
  // `exec`: a CUDA or emulated context (the graphs run on its stream).
  explicit StepGraphs(const ExecContext& exec);
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

  struct Counts {
    uint64_t replayed = 0, captured = 0, issued = 0, uncaptured = 0;
    size_t graphs = 0;  // held now
  };
  Counts counts() const;

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
  void destroy(Graph& g);
  void launch(const Graph& g);  // on the stream; under the emulator, its operations

  const ExecContext& exec_;
  bool enabled_ = true;
  std::string off_reason_;
  std::list<Graph> graphs_;                        // most recently used first
  std::vector<std::pair<uint64_t, size_t>> seen_;  // signatures issued once, newest last
  Counts counts_;
  int uncaptured_in_a_row_ = 0;
};

}  // namespace slipstream
