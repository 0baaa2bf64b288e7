#include "tests/engine/test_stages.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <random>
#include <thread>

#include "engine/registry.h"
#include "kernels/bf16.h"

namespace slipstream::testing {

Recorded& recorded() {
  static Recorded r;
  return r;
}

void reset_recorded() {
  std::lock_guard lock(recorded().mu);
  recorded().values.clear();
  recorded().indices.clear();
  recorded().finished = 0;
  recorded().validation_passes = 0;
  recorded().bf16_copies.clear();
}

// Emits `count` batches; batch k holds x[i] = k * batch + i (deterministic from the index, so
// resuming at k reproduces the rest).
class TestCounter : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_counter")
        .family("test")
        .doc("Counting source for tests.")
        .role(StageRole::source)
        .output("x", DType::i32, 1, "k * batch + i")
        .param("count", int64_t{10}, "batches per epoch")
        .range(0, 1e9)
        .param("batch", int64_t{4}, "elements per batch")
        .range(1, 1e6);
  }
  void setup(StageContext& ctx) override {
    count_ = ctx.params().integer("count");
    if (ctx.split() == StageContext::Split::validation) count_ = std::max<int64_t>(1, count_ / 5);
    batch_ = ctx.params().integer("batch");
    ctx.declare_output("x", {batch_}, DType::i32);
  }
  bool produce(Batch& out, StageContext& ctx) override {
    if (static_cast<int64_t>(out.index) >= count_ * ctx.run().epochs) return false;
    Tensor x = Tensor::empty({batch_}, DType::i32);
    for (int64_t i = 0; i < batch_; ++i)
      x.data<int32_t>()[i] = static_cast<int32_t>(out.index * batch_ + i);
    out.samples = static_cast<uint64_t>(batch_);
    out.epoch = out.index / static_cast<uint64_t>(count_);
    ctx.set_output(out, "x", x);
    return true;
  }
  void seek(uint64_t, StageContext&) override {}

 private:
  int64_t count_ = 0, batch_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(TestCounter);

// Copies x to y after sleeping; random jitter makes parallel completions arrive out of order.
class TestSleep : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_sleep")
        .family("test")
        .doc("Sleeps, then copies x to y.")
        .input("x", DType::i32, 1, "in")
        .output("y", DType::i32, 1, "copy of x")
        .param("sleep_us", int64_t{0}, "base sleep")
        .range(0, 1e7)
        .param("jitter_us", int64_t{0}, "random extra sleep")
        .range(0, 1e7)
        .param("generation", std::string("new"),
               "unused: a parameter newer than some runs (config_test's older-run check)")
        .in_older_runs(std::string("old"));
  }
  void setup(StageContext& ctx) override {
    sleep_ = ctx.params().integer("sleep_us");
    jitter_ = ctx.params().integer("jitter_us");
    ctx.declare_output("y", ctx.input_shape("x"), DType::i32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    std::mt19937 rng(static_cast<uint32_t>(b.index * 7919));
    int64_t us =
        sleep_ + (jitter_ ? static_cast<int64_t>(rng() % static_cast<uint32_t>(jitter_)) : 0);
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    ctx.set_output(b, "y", ctx.input(b, "x").clone());
  }

 private:
  int64_t sleep_ = 0, jitter_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(TestSleep);

// Differentiable (so it forms the trainable section): records the order of batches, slowly.
class TestRecorder : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_recorder")
        .family("test")
        .doc("Records batches in arrival order.")
        .differentiable()
        .input("y", DType::i32, 1, "values")
        .param("sleep_us", int64_t{0}, "time per batch")
        .range(0, 1e7)
        .param("fail_at", int64_t{-1}, "throw on this batch index")
        .param("stop_at", int64_t{-1}, "request a stop (as SIGINT) on this batch index")
        .param("term_at", int64_t{-1}, "raise term_signal on this batch index")
        .param("term_signal", int64_t{SIGTERM}, "the signal term_at raises")
        .param("then_signal", int64_t{0}, "a second signal raised right after it (0: none)")
        .param("then_sleep_us", int64_t{0}, "time the batch of term_at then takes (a stuck step)")
        .range(0, 1e8)
        .param("fail_setup", false, "throw in setup")
        .param("nan_from", int64_t{-1}, "report a NaN loss from this batch index on")
        .param("nan_count", int64_t{1000000}, "... for this many batches")
        .param("validation_nan", false, "validation batches report a NaN loss")
        .param("validation_improves", false,
               "validation reports 1 / (1 + step), better at each step (else 1)")
        .param("validation_scores", true,
               "false: validation batches report nothing (every window masked)")
        .param("report_later", false,
               "report the loss and the injected failure through ExecContext::read_back_later, "
               "as device stages do");
  }
  void setup(StageContext& ctx) override {
    sleep_ = ctx.params().integer("sleep_us");
    fail_at_ = ctx.params().integer("fail_at");
    stop_at_ = ctx.params().integer("stop_at");
    term_at_ = ctx.params().integer("term_at");
    term_signal_ = static_cast<int>(ctx.params().integer("term_signal"));
    then_signal_ = static_cast<int>(ctx.params().integer("then_signal"));
    then_sleep_ = ctx.params().integer("then_sleep_us");
    if (ctx.params().boolean("fail_setup")) throw std::runtime_error("injected setup failure");
    nan_from_ = ctx.params().integer("nan_from");
    nan_count_ = ctx.params().integer("nan_count");
    validation_nan_ = ctx.params().boolean("validation_nan");
    validation_improves_ = ctx.params().boolean("validation_improves");
    validation_scores_ = ctx.params().boolean("validation_scores");
    report_later_ = ctx.params().boolean("report_later");
  }
  void forward(Batch& b, StageContext& ctx) override {
    if (!ctx.run().training && !validation_scores_) return;
    if (!ctx.run().training) {
      // Constant: the second validation does not improve.
      ctx.metric("loss", validation_nan_        ? std::nan("")
                         : validation_improves_ ? 1.0 / (1.0 + static_cast<double>(ctx.run().step))
                                                : 1.0);
      return;
    }
    if (report_later_) {
      // What a device stage does: the value is read back when the runner completes the batch.
      value_ = static_cast<double>(b.index);
      ctx.exec().read_back_later(&value_, sizeof value_, [this, &ctx](const void* host) {
        double v;
        std::memcpy(&v, host, sizeof v);
        if (static_cast<int64_t>(v) == fail_at_) throw std::runtime_error("injected failure");
        std::lock_guard lock(recorded().mu);
        recorded().indices.push_back(static_cast<uint64_t>(v));
        ctx.metric("loss", v);
      });
      value_ = -1;  // the copy was taken when asked
      return;
    }
    if (static_cast<int64_t>(b.index) == fail_at_) throw std::runtime_error("injected failure");
    if (static_cast<int64_t>(b.index) == stop_at_) std::raise(SIGINT);  // the real signal path
    if (static_cast<int64_t>(b.index) == term_at_) {
      std::raise(term_signal_);
      if (then_signal_) std::raise(then_signal_);
      std::this_thread::sleep_for(std::chrono::microseconds(then_sleep_));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_));
    std::lock_guard lock(recorded().mu);
    recorded().values.push_back(ctx.input(b, "y").data<int32_t>()[0]);
    recorded().indices.push_back(b.index);
    const auto i = static_cast<int64_t>(b.index);
    bool nan = nan_from_ >= 0 && i >= nan_from_ && i < nan_from_ + nan_count_;
    ctx.metric("loss", nan ? std::nan("") : static_cast<double>(b.index));
  }
  void validation_end(const std::map<std::string, double>&, StageContext&) override {
    recorded().validation_passes++;
  }
  void finish(StageContext&) override { recorded().finished++; }

 private:
  int64_t sleep_ = 0, fail_at_ = -1, stop_at_ = -1, term_at_ = -1, nan_from_ = -1, nan_count_ = 0;
  int term_signal_ = SIGTERM, then_signal_ = 0;
  int64_t then_sleep_ = 0;
  bool validation_nan_ = false, validation_improves_ = false, validation_scores_ = true,
       report_later_ = false;
  double value_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(TestRecorder);

}  // namespace slipstream::testing

namespace slipstream::testing {

// A trainable stage whose weight moves by a deterministic function of the data, and whose
// optimizer-like state (a counter) is saved: resume must reproduce it exactly.
class TestAccumulator : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_accumulator")
        .family("test")
        .doc("Weight w += mean(x) * 0.001 + w * 1e-3 each step.")
        .differentiable()  // trains itself in forward: a graph with a trainable stage needs a loss
        .input("y", DType::i32, 1, "values")
        .param("fail_save_at", int64_t{0}, "save() throws at this step (0: never)");
  }
  void setup(StageContext& ctx) override {
    fail_save_at_ = ctx.params().integer("fail_save_at");
    w_.name = "w";
    w_.value = Tensor::zeros({3}, DType::f32);
    w_.grad = Tensor::zeros({3}, DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    if (!ctx.run().training) return;
    const Tensor& y = ctx.input(b, "y");
    double mean = 0;
    for (int32_t v : y.span<int32_t>()) mean += v;
    mean /= static_cast<double>(y.numel());
    float* w = w_.value.data<float>();
    for (int i = 0; i < 3; ++i) w[i] += static_cast<float>(mean * 0.001 * (i + 1)) + w[i] * 1e-3f;
    steps_++;
  }
  std::vector<Parameter*> parameters() override { return {&w_}; }
  void save(StateWriter& wr) const override {
    if (fail_save_at_ > 0 && steps_ >= fail_save_at_)
      throw std::runtime_error("the accumulator's state is not ready");
    wr.integer("steps", steps_);
  }
  void load(StateReader& r) override { steps_ = r.integer("steps"); }
  int64_t steps() const { return steps_; }

 private:
  Parameter w_;
  int64_t steps_ = 0, fail_save_at_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(TestAccumulator);

}  // namespace slipstream::testing

namespace slipstream::testing {

// Wants f32 and a required parameter: for the dtype-mismatch and required-parameter checks.
class TestF32Sink : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_f32_sink")
        .family("test")
        .doc("Consumes an f32 vector.")
        .differentiable()
        .input("y", DType::f32, 1, "values")
        .required_param("level", ParamType::integer, "any int");
  }
};
SLIPSTREAM_REGISTER_STAGE(TestF32Sink);

}  // namespace slipstream::testing

namespace slipstream::testing {

// A trainable stage and a loss, for the checks on which graphs can train.
class TestTrainable : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_trainable")
        .family("test")
        .doc("A trainable pass-through of y.")
        .trainable()
        .differentiable()
        .input("y", DType::i32, 1, "values")
        .output("z", DType::i32, 1, "values");
  }
};
SLIPSTREAM_REGISTER_STAGE(TestTrainable);

class TestLoss : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_loss")
        .family("test")
        .doc("A loss over z.")
        .role(StageRole::loss)
        .differentiable()
        .input("z", DType::i32, 1, "values");
  }
};
SLIPSTREAM_REGISTER_STAGE(TestLoss);

}  // namespace slipstream::testing

namespace slipstream::testing {

// For the bf16 copies beside a stage's outputs (StageSchema::reads_bf16_copy): a producer of an
// f32 tensor that writes its copy where a reader wants one, and the reader.
class TestToF32 : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_to_f32")
        .family("test")
        .doc("y = x * 1.1 + 1/3 in f32, with y's bf16 copy where a stage after reads it.")
        .input("x", DType::i32, 1, "values")
        .output("y", DType::f32, 1, "values")
        .param("write_copy", true, "write y's bf16 copy when wanted")
        .param("always_copy", false, "set the copy even when no reader wants it (a misuse)")
        .param("misuse", std::string("none"),
               "y as an i32 tensor (dtype), of rank 2 (rank), one longer than declared (size), "
               "not set at all (unset), not declared in setup (undeclared), or an int thrown "
               "(throw_int)")
        .choices({"none", "dtype", "rank", "size", "unset", "undeclared", "throw_int"});
  }
  void setup(StageContext& ctx) override {
    copy_ = ctx.params().boolean("always_copy") ||
            (ctx.params().boolean("write_copy") && ctx.output_bf16_copy_wanted("y"));
    misuse_ = ctx.params().string("misuse");
    if (misuse_ != "undeclared") ctx.declare_output("y", ctx.input_shape("x"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    if (misuse_ == "unset") return;
    if (misuse_ == "throw_int") throw 42;
    if (misuse_ == "size") {
      ctx.set_output(b, "y", Tensor::zeros({x.dim(0) + 1}, DType::f32));
      return;
    }
    if (misuse_ != "none" && misuse_ != "undeclared") {
      ctx.set_output(b, "y",
                     misuse_ == "dtype" ? Tensor::zeros(x.shape(), DType::i32)
                                        : Tensor::zeros({x.dim(0), 1}, DType::f32));
      return;
    }
    Tensor y = Tensor::empty(x.shape(), DType::f32);
    Tensor yb = Tensor::empty(x.shape(), DType::bf16);
    for (int64_t i = 0; i < x.numel(); ++i) {
      y.data<float>()[i] = static_cast<float>(x.data<int32_t>()[i]) * 1.1f + 1.0f / 3.0f;
      yb.data<uint16_t>()[i] = kernels::fp32_to_bf16(y.data<float>()[i]);
    }
    ctx.set_output(b, "y", y);
    if (copy_) ctx.set_output_bf16_copy(b, "y", yb);
  }

 private:
  bool copy_ = false;
  std::string misuse_;
};
SLIPSTREAM_REGISTER_STAGE(TestToF32);

class TestBf16Reader : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_bf16_reader")
        .family("test")
        .doc("Records whether y's bf16 copy came with y, and its bits.")
        .differentiable()
        .input("y", DType::f32, 1, "values")
        .reads_bf16_copy();
  }
  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& y = ctx.input(b, "y");
    const Tensor* c = ctx.input_bf16_copy(b, "y");
    int got = 0;
    if (c) {
      got = c->numel() == y.numel() ? 1 : -1;
      for (int64_t i = 0; got == 1 && i < y.numel(); ++i)
        if (c->data<uint16_t>()[i] != kernels::fp32_to_bf16(y.data<float>()[i])) got = -1;
    }
    std::lock_guard lock(recorded().mu);
    recorded().bf16_copies.push_back(got);
  }
};
SLIPSTREAM_REGISTER_STAGE(TestBf16Reader);

}  // namespace slipstream::testing

namespace slipstream::testing {

// y = x, whose backward gives x a gradient of one element whatever x's shape (a misuse).
class TestWrongGradient : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("test_wrong_gradient")
        .family("test")
        .doc("y = x; its gradient of x has the wrong shape.")
        .differentiable()
        .input("x", DType::f32, -1, "values")
        .output("y", DType::f32, -1, "x");
  }
  void setup(StageContext& ctx) override {
    ctx.declare_output("y", ctx.input_shape("x"), DType::f32);
  }
  void forward(Batch& b, StageContext& ctx) override {
    ctx.set_output(b, "y", ctx.input(b, "x").clone());
  }
  void backward(Batch& b, StageContext& ctx) override {
    ctx.add_input_grad(b, "x", Tensor::zeros({1}, DType::f32));
  }
};
SLIPSTREAM_REGISTER_STAGE(TestWrongGradient);

}  // namespace slipstream::testing
