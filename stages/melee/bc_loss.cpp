// bc_loss: behaviour-cloning loss over the six controller heads, at every window position
// (causal seq2seq), averaged over the positions the mask marks valid:
//   loss = Σ_h w_h · mean_valid(loss_h),  buttons: BCE summed over the 8 buttons,
//          sticks and shoulder: softmax cross-entropy; both with label smoothing.
// Windows the embedding mirrored (`mirrored`) get their x-stick labels mirrored (c -> 16 - c).
// Validation passes also report the "repeat the previous input" baseline on the same positions,
// its probabilities measured on the training positions seen so far (saved with the stage).
// Metric names and definitions: docs/melee_features.md.
// On a device (CUDA, or the emulator) one fused kernel computes every position's statistics and
// their column sums, the gradients are computed on the device from the device-side weight sum
// (melee_kernels.h), and the sums come back to the host without a wait in the step
// (ExecContext::read_back_later): the batch's metrics, its loss output and the label check are
// done when the runner completes the step's read-backs.
#include "engine/registry.h"
#include "engine/state_io.h"
#include "stages/melee/melee_kernels.h"
#include "stages/melee/model_math.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {
using namespace melee;

// The device path: buffers and kernels of one backend.
class BcLossDevice {
 public:
  virtual ~BcLossDevice() = default;
  virtual void reserve(int64_t M) = 0;
  // Enqueues the statistics and their sums, and their read-back: `on_sums` gets the kBcStats
  // sums when the runner completes the step's read-backs.
  virtual void forward(const float* const logits[kHeads], const float* tb, const int32_t* ts,
                       const float* mask, const uint8_t* mirrored, const float* prev, size_t M,
                       size_t W, float eps, std::function<void(const float* sums)> on_sums) = 0;
  virtual void backward(const float* const logits[kHeads], const float* tb, const int32_t* ts,
                        const float* mask, const uint8_t* mirrored, size_t M, size_t W, float eps,
                        const float head_weights[kHeads], float* const dlogits[kHeads]) = 0;
};

template <class Ops>
class BcLossDeviceOn final : public BcLossDevice {
  using K = typename Ops::Table;

 public:
  BcLossDeviceOn(Ops ops, const ExecContext& exec) : o_(ops), exec_(exec) {
    sums_ = o_.template alloc<float>(kBcStats, "bc_loss sums");
  }

  void reserve(int64_t M) override {
    if (M <= cap_) return;
    cap_ = M;
    const size_t m = static_cast<size_t>(M);
    stats_ = o_.template alloc<float>(m * kBcStats, "bc_loss statistics");
    ops::ScratchNeeds need;
    need.norm_rows = m;
    need.norm_cols = kBcStats;
    scratch_ =
        o_.template alloc<uint8_t>(std::max<size_t>(1, o_.scratch_bytes(need)), "bc_loss scratch");
  }

  void forward(const float* const logits[kHeads], const float* tb, const int32_t* ts,
               const float* mask, const uint8_t* mirrored, const float* prev, size_t M, size_t W,
               float eps, std::function<void(const float* sums)> on_sums) override {
    K::bc_loss_rows(heads(logits), tb, ts, mask, mirrored, prev, M, W, eps,
                    stats_.template data<float>(), o_.stream());
    float* s = sums_.template data<float>();
    o_.zero(s, kBcStats);
    o_.column_sum_accumulate(stats_.template data<float>(), s, M, kBcStats, scratch_.raw());
    exec_.read_back_later(s, kBcStats * sizeof(float),
                          [on_sums = std::move(on_sums)](const void* host) {
                            on_sums(static_cast<const float*>(host));
                          });
  }

  void backward(const float* const logits[kHeads], const float* tb, const int32_t* ts,
                const float* mask, const uint8_t* mirrored, size_t M, size_t W, float eps,
                const float head_weights[kHeads], float* const dlogits[kHeads]) override {
    typename K::HeadWeights hw{};
    typename K::HeadGradPointers dl{};
    for (int h = 0; h < kHeads; ++h) {
      hw.w[h] = head_weights[h];
      dl.dlogits[h] = dlogits[h];
    }
    K::bc_loss_backward(heads(logits), tb, ts, mask, mirrored, M, W, eps, hw,
                        sums_.template data<float>(), dl, o_.stream());
  }

 private:
  static typename K::HeadPointers heads(const float* const logits[kHeads]) {
    typename K::HeadPointers p{};
    for (int h = 0; h < kHeads; ++h) p.logits[h] = logits[h];
    return p;
  }

  Ops o_;
  const ExecContext& exec_;
  int64_t cap_ = 0;
  Tensor stats_, sums_, scratch_;
};

}  // namespace

class BcLossStage : public Stage {
 public:
  static StageSchema schema() {
    StageSchema s("bc_loss");
    s.family("melee")
        .streaming(Streaming::per_position)
        .doc(
            "Behaviour-cloning loss of the controller heads; reports the repeat-last-input "
            "baseline in validation.")
        .role(StageRole::loss)
        // The console: each head's accuracy as their mean and the weakest head, and the
        // repeat-the-last-input baseline's loss beside the model's.
        .console_family("acc/", "acc")
        .console_metric("baseline/loss", "baseline");
    for (int h = 0; h < kHeads; ++h)
      s.input(kHeadNames[h], DType::f32, 3, "(B, W, " + std::to_string(head_width(h)) + ") logits");
    s.input("target_buttons", DType::f32, 3, "(B, W, 8) 0/1 labels")
        .input("target_sticks", DType::i32, 3,
               "(B, W, 5) class labels: main x/y, c x/y (0..16), shoulder (0..4)")
        .input("mask", DType::f32, 2, "(B, W) 1 where the position is real data")
        .input("prev_controller", DType::f32, 3, "(B, W, 13) the previous input (for the baseline)")
        .optional_input("mirrored", DType::u8, 1, "(B) windows the embedding mirrored left-right")
        .output("loss", DType::f32, 1, "(1) the batch's loss")
        .param("label_smoothing", 0.0, "label smoothing of every head (BCE: y(1-e)+e/2)")
        .range(0, 0.5)
        .param("head_weights", std::vector<double>{1, 1, 1, 1, 1, 1},
               "weights of buttons, main_x, main_y, c_x, c_y, shoulder")
        .range(0, std::nullopt)
        .param("baseline_prior", 0.9,
               "baseline P(input repeats) used before any training position was seen")
        .range(0, 1);
    return s;
  }

  void setup(StageContext& ctx) override {
    device_ = ctx.exec().device();
    dev_ = ops::make_device_path<BcLossDevice, BcLossDeviceOn, MeleeKernelFamily>(
        ctx.exec(), "bc_loss '" + ctx.name() + "'", ctx.exec());
    eps_ = static_cast<float>(ctx.params().number("label_smoothing"));
    prior_ = ctx.params().number("baseline_prior");
    auto hw = ctx.params().numbers("head_weights");
    if (hw.size() != kHeads)
      throw std::runtime_error("bc_loss '" + ctx.name() + "': head_weights (" +
                               ctx.params().mark("head_weights").str() + ") has " +
                               std::to_string(hw.size()) +
                               " values; it needs 6: buttons, main_x, main_y, c_x, c_y, shoulder");
    for (int h = 0; h < kHeads; ++h)
      head_weights_[h] = static_cast<float>(hw[static_cast<size_t>(h)]);
    const Shape& ms = ctx.input_shape("mask");
    for (int h = 0; h < kHeads; ++h) {
      const Shape& s = ctx.input_shape(kHeadNames[h]);
      if (s.rank() != 3 || (s[2] >= 0 && s[2] != head_width(h)))
        throw std::runtime_error("bc_loss '" + ctx.name() + "': input '" + kHeadNames[h] + "' is " +
                                 s.str() + ", expected [B, W, " + std::to_string(head_width(h)) +
                                 "]");
      const std::string n = kHeadNames[h];
      names_.loss[h] = "loss/" + n;
      names_.nll[h] = "nll/" + n;
      names_.acc[h] = "acc/" + n;
      names_.base_loss[h] = "baseline/loss/" + n;
      names_.base_acc[h] = "baseline/acc/" + n;
    }
    ctx.declare_output("loss", Shape{1}, DType::f32);
    loss_ = Tensor::zeros(Shape{1}, DType::f32, Device::cpu(), "bc_loss loss");
    if (ms.rank() == 2 && ms[0] > 0 && ms[1] > 0) reserve(rows_setup_ = ms[0] * ms[1]);
  }

  // Per logit: the log-softmax (max, exp, sum, log), smoothing, NLL and the accuracy's argmax;
  // the backward's softmax minus target.
  Cost cost() const override {
    const double logits = static_cast<double>(rows_setup_) * kHeadsWidth;
    return {8 * logits, 3 * logits, 0};
  }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& mask = ctx.input(b, "mask");
    const Tensor& tb = ctx.input(b, "target_buttons");
    const Tensor& ts = ctx.input(b, "target_sticks");
    const Tensor& prev = ctx.input(b, "prev_controller");
    const int64_t B = mask.dim(0), W = mask.dim(1);
    const size_t M = static_cast<size_t>(B * W);
    check(ctx, b, tb, B, W, kButtons, "target_buttons");
    check(ctx, b, ts, B, W, kStickHeads, "target_sticks");
    check(ctx, b, prev, B, W, kControllerFeatures, "prev_controller");
    const float* logits[kHeads];
    for (int h = 0; h < kHeads; ++h) {
      const Tensor& t = ctx.input(b, kHeadNames[h]);
      check(ctx, b, t, B, W, head_width(h), kHeadNames[h]);
      logits[h] = t.data<float>();
    }
    const uint8_t* mirrored = nullptr;
    if (ctx.has_input(b, "mirrored")) {
      const Tensor& m = ctx.input(b, "mirrored");
      if (m.numel() != B)
        throw std::runtime_error("bc_loss '" + ctx.name() + "': mirrored is " + m.describe() +
                                 " for " + std::to_string(B) + " windows (batch " +
                                 std::to_string(b.index) + ")");
      mirrored = m.data<uint8_t>();
    }
    reserve(static_cast<int64_t>(M));
    const bool training = ctx.run().training;
    ctx.set_output(b, "loss", loss_);
    if (dev_) {
      dev_->forward(logits, tb.data<float>(), ts.data<int32_t>(), mask.data<float>(), mirrored,
                    prev.data<float>(), M, static_cast<size_t>(W), eps_,
                    [this, &ctx, index = b.index, training](const float* sums) {
                      device_sums(ctx, sums, index, training);
                    });
      return;
    }
    const BcLossScratch<float> s{targets_.data<int32_t>(), button_weights_.data<float>()};
    bc_loss_prepare<float>(M, static_cast<size_t>(W), ts.data<int32_t>(), mask.data<float>(),
                           mirrored, s);
    const BcLossResult r = bc_loss_forward<float>(M, logits, tb.data<float>(), mask.data<float>(),
                                                  head_weights_, eps_, s);
    if (training)
      count_repeats<float>(M, prev.data<float>(), tb.data<float>(), ts.data<int32_t>(),
                           mask.data<float>(), counts_);
    report(ctx, r, training, [&](const double p[kRepeatItems]) {
      return baseline_forward<float>(M, prev.data<float>(), tb.data<float>(), ts.data<int32_t>(),
                                     mask.data<float>(), head_weights_, p);
    });
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& mask = ctx.input(b, "mask");
    const int64_t B = mask.dim(0), W = mask.dim(1);
    const size_t M = static_cast<size_t>(B * W);
    const float* logits[kHeads];
    float* dlogits[kHeads];
    for (int h = 0; h < kHeads; ++h) {
      logits[h] = ctx.input(b, kHeadNames[h]).data<float>();
      dlogits[h] = dlogits_[h].data<float>();
    }
    if (dev_) {
      const uint8_t* mirrored =
          ctx.has_input(b, "mirrored") ? ctx.input(b, "mirrored").data<uint8_t>() : nullptr;
      dev_->backward(logits, ctx.input(b, "target_buttons").data<float>(),
                     ctx.input(b, "target_sticks").data<int32_t>(), mask.data<float>(), mirrored, M,
                     static_cast<size_t>(W), eps_, head_weights_, dlogits);
    } else {
      const BcLossScratch<float> s{targets_.data<int32_t>(), button_weights_.data<float>()};
      bc_loss_backward<float>(M, logits, ctx.input(b, "target_buttons").data<float>(),
                              mask.data<float>(), head_weights_, eps_, weight_sum_, s, dlogits);
    }
    for (int h = 0; h < kHeads; ++h)
      ctx.add_input_grad(
          b, kHeadNames[h],
          dlogits_[h].slice_rows(0, static_cast<int64_t>(M)).reshape(Shape{B, W, head_width(h)}));
  }

  // The baseline's counts: a resumed run reports the same baseline as an uninterrupted one.
  // The baseline's probabilities for this pass: the repeats counted on every rank's training
  // positions (each rank counts its own share of the data).
  void validation_begin(StageContext& ctx) override {
    if (!ctx.run().reduce_over_ranks) return;
    double v[1 + kRepeatItems];
    v[0] = counts_.total;
    for (int k = 0; k < kRepeatItems; ++k) v[1 + k] = counts_.same[k];
    ctx.run().reduce_over_ranks(v, RankReduce::sum,
                                "bc_loss '" + ctx.name() + "': the baseline's repeat counts");
    seen_.total = v[0];
    for (int k = 0; k < kRepeatItems; ++k) seen_.same[k] = v[1 + k];
  }

  void save(StateWriter& w) const override {
    w.number("repeat.total", counts_.total);
    for (int k = 0; k < kRepeatItems; ++k)
      w.number("repeat.same." + std::to_string(k), counts_.same[k]);
  }
  void load(StateReader& r) override {
    counts_ = RepeatCounts{};
    if (!r.has("repeat.total")) return;
    counts_.total = r.number("repeat.total");
    for (int k = 0; k < kRepeatItems; ++k)
      counts_.same[k] = r.number("repeat.same." + std::to_string(k));
  }

 private:
  void check(const StageContext& ctx, const Batch& b, const Tensor& t, int64_t B, int64_t W,
             int64_t C, const char* port) const {
    if (t.rank() != 3 || t.dim(0) != B || t.dim(1) != W || t.dim(2) != C || t.device() != device_)
      throw std::runtime_error("bc_loss '" + ctx.name() + "': " + port + " is " + t.describe() +
                               ", expected [" + std::to_string(B) + ", " + std::to_string(W) +
                               ", " + std::to_string(C) + "] on " + device_.str() + " (batch " +
                               std::to_string(b.index) + ")");
  }

  // A batch's sums from the device: the label check, the repeat counts, the report.
  void device_sums(const StageContext& ctx, const float* sums, uint64_t index, bool training) {
    if (sums[kBcBadLabel] > 0)
      throw std::runtime_error("bc_loss '" + ctx.name() + "': target_sticks has " +
                               std::to_string(static_cast<int64_t>(sums[kBcBadLabel])) +
                               " valid position(s) with a class out of range in batch " +
                               std::to_string(index));
    if (training) add_repeats(sums, counts_);
    report(ctx, bc_loss_result(sums, head_weights_), training, [&](const double p[kRepeatItems]) {
      return baseline_from_sums(sums, head_weights_, p);
    });
  }

  // The batch's loss output and metrics; in validation also the baseline's, from
  // `baseline(p)` with the repeat probabilities p.
  template <class Baseline>
  void report(const StageContext& ctx, const BcLossResult& r, bool training, Baseline&& baseline) {
    weight_sum_ = r.weight_sum;
    loss_.data<float>()[0] = static_cast<float>(r.total);
    if (!(r.weight_sum > 0)) return;  // nothing valid: a 0 would bias the averages
    // Each batch's means weigh what they were measured over: a padded last batch counts for its
    // valid positions, and a validation pass's figure is the one over all of its positions.
    const double n = r.weight_sum;
    ctx.metric("loss", r.total, MetricKind::mean, n);
    ctx.metric("nll", r.total_nll, MetricKind::mean, n);
    for (int h = 0; h < kHeads; ++h) {
      ctx.metric(names_.loss[h], r.loss[h], MetricKind::mean, n);
      ctx.metric(names_.nll[h], r.nll[h], MetricKind::mean, n);
      ctx.metric(names_.acc[h], r.acc[h], MetricKind::mean, n);
    }
    if (training) return;
    double p[kRepeatItems];
    const RepeatCounts& seen = ctx.run().reduce_over_ranks ? seen_ : counts_;
    for (int k = 0; k < kRepeatItems; ++k) p[k] = seen.p(k, prior_);
    const BaselineResult base = baseline(p);
    ctx.metric("baseline/loss", base.total, MetricKind::mean, n);
    for (int h = 0; h < kHeads; ++h) {
      ctx.metric(names_.base_loss[h], base.loss[h], MetricKind::mean, n);
      ctx.metric(names_.base_acc[h], base.acc[h], MetricKind::mean, n);
    }
  }

  void reserve(int64_t M) {
    if (dev_) dev_->reserve(M);
    if (M <= rows_cap_) return;
    rows_cap_ = M;
    if (!dev_) {
      targets_ = Tensor::empty(Shape{kStickHeads, M}, DType::i32, Device::cpu(), "bc_loss targets");
      button_weights_ =
          Tensor::empty(Shape{M, kButtons}, DType::f32, Device::cpu(), "bc_loss button weights");
    }
    for (int h = 0; h < kHeads; ++h)
      dlogits_[h] = Tensor::empty(Shape{M, head_width(h)}, DType::f32, device_, "bc_loss dlogits");
  }

  float eps_ = 0;
  double prior_ = 0.9;
  float head_weights_[kHeads] = {1, 1, 1, 1, 1, 1};
  struct {
    std::string loss[kHeads], nll[kHeads], acc[kHeads], base_loss[kHeads], base_acc[kHeads];
  } names_;
  RepeatCounts counts_, seen_;  // this rank's training positions; all ranks' at validation
  Device device_;
  std::unique_ptr<BcLossDevice> dev_;  // null on the CPU
  double weight_sum_ = 0;
  Tensor loss_, targets_, button_weights_, dlogits_[kHeads];
  int64_t rows_cap_ = 0;
  int64_t rows_setup_ = 0;  // B·W known at setup (cost())
};
SLIPSTREAM_REGISTER_STAGE(BcLossStage);

}  // namespace slipstream
