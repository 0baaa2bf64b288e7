// The step recorder and the graph decisions (kernels/step_recorder.h, engine/step_graphs.h) on
// an emulated context, with operations that log what they do: a step's work is issued the first
// time, captured the second, replayed from then on with the arguments it was captured with; a
// synchronous point issues what was recorded before it, in order; graph mode turns itself off
// with a reason.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/exec_context.h"
#include "engine/step_graphs.h"
#include "kernels/step_recorder.h"

using namespace slipstream;

namespace {

std::vector<std::string> trace;

// An operation whose key is `key` and which logs `text` when it runs.
void op(uint64_t key, const std::string& text) {
  capture::enqueue(
      "op", nullptr, [&] { return capture::key_of(key); }, [text] { trace.push_back(text); });
}

struct Fixture : ::testing::Test {
  ExecContext exec{Device::cpu(), /*emulate_cuda=*/true};
  StepGraphs graphs{exec};
  void SetUp() override { trace.clear(); }

  // One step: ops (key, text) recorded, then finished.
  StepGraphs::Outcome step(const std::vector<std::pair<uint64_t, std::string>>& ops,
                           uint64_t n = 1) {
    capture::StepRecorder rec(nullptr);
    const size_t before = trace.size();
    for (const auto& [k, t] : ops) op(k, t);
    EXPECT_EQ(trace.size(), before) << "an operation ran before the step's end";
    return graphs.finish(rec, n);
  }
};

using StepGraphsTest = Fixture;

TEST_F(StepGraphsTest, WorkIsIssuedThenCapturedThenReplayed) {
  EXPECT_EQ(step({{1, "a1"}, {2, "b1"}}), StepGraphs::Outcome::issued);
  EXPECT_EQ(trace, (std::vector<std::string>{"a1", "b1"}));
  trace.clear();
  EXPECT_EQ(step({{1, "a2"}, {2, "b2"}}), StepGraphs::Outcome::captured);
  EXPECT_EQ(trace, (std::vector<std::string>{"a2", "b2"}));
  trace.clear();
  // The replay is the captured work: what the key does not cover (the text) is step 2's.
  EXPECT_EQ(step({{1, "a3"}, {2, "b3"}}), StepGraphs::Outcome::replayed);
  EXPECT_EQ(trace, (std::vector<std::string>{"a2", "b2"}));
  trace.clear();
  // Other arguments, or one more operation: not the graph's work.
  EXPECT_EQ(step({{1, "a4"}, {3, "c4"}}), StepGraphs::Outcome::issued);
  EXPECT_EQ(step({{1, "a5"}, {2, "b5"}, {2, "b5"}}), StepGraphs::Outcome::issued);
  EXPECT_EQ(trace, (std::vector<std::string>{"a4", "c4", "a5", "b5", "b5"}));
  const auto c = graphs.counts();
  EXPECT_EQ(c.replayed, 1u);
  EXPECT_EQ(c.captured, 1u);
  EXPECT_EQ(c.issued, 3u);
  EXPECT_EQ(c.graphs, 1u);
  EXPECT_EQ(c.ops, 3u) << "the last step recorded held 3 operations";
  EXPECT_TRUE(graphs.enabled());
}

TEST_F(StepGraphsTest, NothingRunsUntilTheStepEnds) {
  capture::StepRecorder rec(nullptr);
  op(1, "a");
  op(2, "b");
  EXPECT_TRUE(trace.empty());
  EXPECT_EQ(rec.ops().size(), 2u);
  // Another stream's work is not the step's: issued at once.
  int other = 0;
  capture::enqueue(
      "other stream", reinterpret_cast<void*>(0x10), [] { return uint64_t{7}; }, [&] { ++other; });
  EXPECT_EQ(other, 1);
  // Work that must follow the step's waits for it.
  capture::after_enqueued(nullptr, [] { trace.push_back("event"); });
  EXPECT_TRUE(trace.empty());
  graphs.finish(rec, 1);
  EXPECT_EQ(trace, (std::vector<std::string>{"a", "b", "event"}));
}

TEST_F(StepGraphsTest, ASynchronousPointIssuesTheWorkBeforeIt) {
  for (uint64_t s = 1; s <= 3; ++s) {
    trace.clear();
    capture::StepRecorder rec(nullptr);
    op(1, "before");
    capture::after_enqueued(nullptr, [] { trace.push_back("event"); });
    EXPECT_TRUE(trace.empty());
    capture::sync_point("reads the device");
    EXPECT_EQ(trace, (std::vector<std::string>{"before", "event"}));
    EXPECT_FALSE(rec.recording());
    op(2, "after");  // issued at once now
    EXPECT_EQ(trace.back(), "after");
    EXPECT_EQ(graphs.finish(rec, s), StepGraphs::Outcome::uncaptured);
    EXPECT_EQ(trace.size(), 3u) << "nothing issued twice";
  }
  EXPECT_FALSE(graphs.enabled());
  EXPECT_NE(graphs.off_reason().find("off from step 3"), std::string::npos) << graphs.off_reason();
  EXPECT_NE(graphs.off_reason().find("reads the device"), std::string::npos) << graphs.off_reason();
}

TEST_F(StepGraphsTest, WorkThatNeverRecursTurnsGraphsOff) {
  // Every other step repeats the one before and is captured; none replays.
  uint64_t n = 0;
  for (uint64_t k = 0; graphs.enabled() && k < 100; ++k) {
    step({{1000 + k, "x"}}, ++n);
    step({{1000 + k, "x"}}, ++n);
  }
  EXPECT_FALSE(graphs.enabled());
  EXPECT_NE(graphs.off_reason().find("changes from step to step"), std::string::npos)
      << graphs.off_reason();
  // The reason says which operation keeps the steps apart.
  EXPECT_NE(graphs.off_reason().find("differ first at operation 1 of 1, op (stage -1)"),
            std::string::npos)
      << graphs.off_reason();
  EXPECT_LE(graphs.counts().graphs, StepGraphs::kMaxGraphs);
}

TEST_F(StepGraphsTest, TheDifferenceBetweenNewStepsIsNamed) {
  StepGraphs named(exec, [](int k) { return k == 4 ? std::string("core") : std::string("?"); });
  auto new_step = [&](uint64_t middle) {
    capture::StepRecorder rec(nullptr);
    rec.set_stage(2);
    op(1, "a");
    rec.set_stage(4);
    op(middle, "b");
    op(3, "c");
    return named.finish(rec, 1);
  };
  EXPECT_EQ(new_step(10), StepGraphs::Outcome::issued);
  EXPECT_EQ(named.difference(), "");
  EXPECT_EQ(new_step(11), StepGraphs::Outcome::issued);
  EXPECT_EQ(named.difference(), "operation 2 of 3, op (core)");
}

// A capture a library refuses (on a GPU: cuDNN or NCCL returning an error under stream capture)
// issues the step's work as it is, once, and turns graph mode off naming the refusal; steps
// after it are issued op by op.
TEST_F(StepGraphsTest, ARefusedCaptureIssuesTheWorkAndTurnsGraphsOff) {
  StepGraphs refusing(exec, {}, [](uint64_t s) {
    return s == 2 ? std::string("cudnnRNNForward failed: CUDNN_STATUS_NOT_SUPPORTED") : "";
  });
  auto run = [&](uint64_t n, const std::string& tag) {
    capture::StepRecorder rec(nullptr);
    op(1, "a" + tag);
    op(2, "b" + tag);
    return refusing.finish(rec, n);
  };
  EXPECT_EQ(run(1, "1"), StepGraphs::Outcome::issued);
  EXPECT_TRUE(refusing.enabled());
  EXPECT_EQ(run(2, "2"), StepGraphs::Outcome::issued);  // would have been captured
  EXPECT_EQ(trace, (std::vector<std::string>{"a1", "b1", "a2", "b2"}));
  EXPECT_FALSE(refusing.enabled());
  EXPECT_EQ(refusing.off_reason(),
            "off from step 2: the step's capture failed: cudnnRNNForward failed: "
            "CUDNN_STATUS_NOT_SUPPORTED");
  const auto c = refusing.counts();
  EXPECT_EQ(c.captured, 0u);
  EXPECT_EQ(c.issued, 2u);
  EXPECT_EQ(c.graphs, 0u);
}

// time_operations: each timed launch's operations are timed one by one and summed by (name,
// stage); launches of the batches before the timed ones and work that ran without a graph are
// not, and the latter are counted as untimed.
TEST_F(StepGraphsTest, TimedOperationsAreSummedByNameAndStage) {
  StepGraphs timed(exec);
  timed.time_operations(2);  // the first two batches are not timed
  EXPECT_TRUE(timed.timing_operations());
  auto run = [&](uint64_t n, uint64_t slow_key) {
    capture::StepRecorder rec(nullptr);
    rec.set_stage(1);
    capture::enqueue(
        "quick", nullptr, [] { return uint64_t{1}; }, [] {});
    rec.set_stage(2);
    capture::enqueue(
        "slow", nullptr, [=] { return slow_key; },
        [] { std::this_thread::sleep_for(std::chrono::milliseconds(3)); });
    capture::enqueue(
        "quick", nullptr, [] { return uint64_t{3}; }, [] {});
    return timed.finish(rec, n);
  };
  EXPECT_EQ(run(1, 2), StepGraphs::Outcome::issued);
  EXPECT_EQ(run(2, 2), StepGraphs::Outcome::captured);  // the second batch: not timed
  EXPECT_EQ(run(3, 2), StepGraphs::Outcome::replayed);
  EXPECT_EQ(run(4, 2), StepGraphs::Outcome::replayed);
  EXPECT_EQ(run(5, 9), StepGraphs::Outcome::issued);  // other work: no graph, not timed
  timed.ran_without_graph();                          // a batch after graph mode turned off
  timed.collect_times();
  const OperationTimes t = timed.operation_times();
  EXPECT_EQ(t.graphs, 2u);
  EXPECT_EQ(t.untimed, 2u);
  ASSERT_EQ(t.ops.size(), 3u) << "quick in stages 1 and 2, slow in 2";
  EXPECT_EQ(t.ops[0].what, "slow") << "most device time first";
  EXPECT_EQ(t.ops[0].stage, 2);
  EXPECT_EQ(t.ops[0].launches, 2u);
  EXPECT_GE(t.ops[0].device_ms, 6.0);
  double sum = 0;
  for (const OperationTime& op : t.ops) {
    sum += op.device_ms;
    if (op.what == "quick") {
      EXPECT_EQ(op.launches, 2u) << "stage " << op.stage;
      EXPECT_LT(op.device_ms, t.ops[0].device_ms);
    }
  }
  EXPECT_NEAR(t.graph_ms, sum, 1e-9 * sum);
  // Without time_operations nothing is timed.
  EXPECT_FALSE(graphs.timing_operations());
  EXPECT_EQ(graphs.operation_times().graphs, 0u);
}

TEST_F(StepGraphsTest, AFailingOperationNamesItsStage) {
  capture::StepRecorder rec(nullptr);
  rec.set_stage(3);
  capture::enqueue(
      "broken kernel", nullptr, [] { return uint64_t{1}; },
      [] { throw std::runtime_error("broken kernel: launch failed"); });
  try {
    graphs.finish(rec, 1);
    FAIL() << "no error";
  } catch (const capture::IssueError& e) {
    EXPECT_EQ(e.stage(), 3);
    EXPECT_NE(std::string(e.what()).find("broken kernel"), std::string::npos);
  }
}

TEST(StepRecorder, KeysCoverEveryByte) {
  struct Args {
    const float* p;
    int n;
    float s;
  };
  const float x = 0;
  EXPECT_EQ(capture::key_of(Args{&x, 3, 1.0f}), capture::key_of(Args{&x, 3, 1.0f}));
  EXPECT_NE(capture::key_of(Args{&x, 3, 1.0f}), capture::key_of(Args{&x, 3, 2.0f}));
  EXPECT_NE(capture::key_of(Args{&x, 3, 1.0f}), capture::key_of(Args{&x + 1, 3, 1.0f}));
  EXPECT_NE(capture::key_of(1, 2), capture::key_of(2, 1));
  // Outside a recorder an operation runs at once.
  int ran = 0;
  capture::enqueue(
      "now", nullptr, [] { return uint64_t{0}; }, [&] { ++ran; });
  EXPECT_EQ(ran, 1);
  capture::sync_point("nothing to issue");
}

}  // namespace

// Read-backs of a failed step are dropped, not reported at a later step's end (a stream's frame
// that failed: its caller may have let go of the memory its reports write into). Before and
// after, read-backs report their own values, in a recorded step too.
TEST(ReadBacks, AFailedStepsReadBacksAreDroppedNotReportedLater) {
  ExecContext exec{Device::cpu(), /*emulate_cuda=*/true};
  const float values[2] = {1.5f, 2.5f};
  std::vector<float> seen;
  auto report = [&](const void* host) { seen.push_back(*static_cast<const float*>(host)); };
  exec.read_back_later(&values[0], sizeof(float), report);
  exec.complete_read_backs();
  EXPECT_EQ(seen, std::vector<float>{1.5f});
  // A step recorded, asked to read back, then failed: abandoned, its report never runs.
  {
    capture::StepRecorder rec(nullptr);
    exec.read_back_later(&values[1], sizeof(float), report);
  }
  exec.abandon_read_backs();
  exec.read_back_later(&values[0], sizeof(float), report);
  exec.complete_read_backs();
  EXPECT_EQ(seen, (std::vector<float>{1.5f, 1.5f})) << "the failed step's 2.5 was reported";
  // Abandoned with nothing asked: nothing happens.
  exec.abandon_read_backs();
  exec.complete_read_backs();
  EXPECT_EQ(seen.size(), 2u);
}

// A result the device's work writes into host memory itself (read_back_written): under the
// emulator kernels reach host memory where it is; its report runs on that memory when its group
// completes (not when asked), and a recorded step holds no copy for it where read_back_later
// records one.
TEST(ReadBacks, AResultWrittenIntoHostMemoryIsReportedWithoutACopy) {
  ExecContext exec{Device::cpu(), /*emulate_cuda=*/true};
  float answer = 0.0f;
  EXPECT_EQ(exec.device_address_of_host(&answer), &answer);
  std::vector<float> seen;
  auto report = [&](const void* host) {
    EXPECT_EQ(host, &answer) << "a copy was reported";
    seen.push_back(*static_cast<const float*>(host));
  };
  auto operations = [&](auto ask) {
    capture::StepRecorder rec(nullptr);
    ask();
    const auto ops = rec.finish();
    capture::issue_ops(ops);
    rec.run_deferred();
    return ops.size();
  };
  const float copied = 4.0f;
  EXPECT_EQ(operations([&] { exec.read_back_later(&copied, sizeof(float), [](const void*) {}); }),
            1u)
      << "read_back_later's copy into device staging";
  exec.complete_read_backs();
  EXPECT_EQ(operations([&] {
              answer = 2.5f;  // what the frame's kernel writes
              exec.read_back_written(&answer, report);
            }),
            0u);
  EXPECT_TRUE(seen.empty()) << "reported before its group completed";
  exec.complete_read_backs();
  EXPECT_EQ(seen, std::vector<float>{2.5f});
}
