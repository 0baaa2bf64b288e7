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

// One batch as the loss's paths read it: M = B·W positions of windows of W.
struct BcBatch {
  uint64_t index = 0;
  size_t M = 0, W = 0;
  const float* logits[kHeads] = {};
  const float* target_buttons = nullptr;
  const int32_t* target_sticks = nullptr;
  const float* mask = nullptr;
  const uint8_t* mirrored = nullptr;  // may be null
  const float* prev = nullptr;
};

// The baseline's result for repeat probabilities p (validation), from the batch's data.
using BaselineOf = std::function<BaselineResult(const double p[kRepeatItems])>;
// What a path hands back of a batch's forward: the loss statistics, whether it was a training
// batch, and the baseline. (The stage's and the paths' closures hold two pointers each, which
// std::function keeps without allocating: a step allocates nothing.)
using OnBcResult = std::function<void(const BcLossResult&, bool training, const BaselineOf&)>;

// The stage's math on one backend, built once in setup by ops::with_ops: BcLossOnCpu (the
// reference) or BcLossOnDevice<Ops> (one fused kernel for every position's statistics, their
// column sums read back without a wait in the step).
class BcLossPath {
 public:
  virtual ~BcLossPath() = default;
  virtual void reserve(int64_t M) = 0;
  // The batch's statistics: `counts` (training; null in validation) gets the batch's repeats,
  // then `on_result` its loss and baseline — at once on the CPU, on a device when the runner
  // completes the step's read-backs (ExecContext::read_back_later).
  virtual void forward(const BcBatch& in, RepeatCounts* counts, OnBcResult on_result) = 0;
  // dlogits (=) of the batch whose forward reported `weight_sum`.
  virtual void backward(const BcBatch& in, double weight_sum, float* const dlogits[kHeads]) = 0;
};

class BcLossOnCpu final : public BcLossPath {
 public:
  BcLossOnCpu(const float head_weights[kHeads], float eps) : eps_(eps) {
    std::copy(head_weights, head_weights + kHeads, hw_);
  }

  void reserve(int64_t M) override {
    if (M <= cap_) return;
    cap_ = M;
    targets_ = Tensor::empty(Shape{kStickHeads, M}, DType::i32, Device::cpu(), "bc_loss targets");
    button_weights_ =
        Tensor::empty(Shape{M, kButtons}, DType::f32, Device::cpu(), "bc_loss button weights");
  }

  void forward(const BcBatch& in, RepeatCounts* counts, OnBcResult on_result) override {
    const BcLossScratch<float> s = scratch();
    bc_loss_prepare<float>(in.M, in.W, in.target_sticks, in.mask, in.mirrored, s);
    BcLossResult r =
        bc_loss_forward<float>(in.M, in.logits, in.target_buttons, in.mask, hw_, eps_, s);
    if (counts)
      count_repeats<float>(in.M, in.prev, in.target_buttons, in.target_sticks, in.mask, *counts);
    else  // validation: the changed items' figures too
      bc_change_forward<float>(in.M, in.logits, in.target_buttons, in.target_sticks, in.mask,
                               in.prev, s, r);
    on_result(r, counts != nullptr, [&](const double p[kRepeatItems]) {
      return baseline_forward<float>(in.M, in.prev, in.target_buttons, in.target_sticks, in.mask,
                                     hw_, p);
    });
  }

  void backward(const BcBatch& in, double weight_sum, float* const dlogits[kHeads]) override {
    bc_loss_backward<float>(in.M, in.logits, in.target_buttons, in.mask, hw_, eps_, weight_sum,
                            scratch(), dlogits);
  }

 private:
  BcLossScratch<float> scratch() {
    return {targets_.data<int32_t>(), button_weights_.data<float>()};
  }

  float hw_[kHeads];
  float eps_;
  int64_t cap_ = 0;
  Tensor targets_, button_weights_;
};

template <class Ops>
class BcLossOnDevice final : public BcLossPath {
  using K = typename Ops::Table;

 public:
  BcLossOnDevice(Ops ops, const ExecContext& exec, const float head_weights[kHeads], float eps,
                 std::string who)
      : o_(ops), exec_(exec), eps_(eps), who_(std::move(who)) {
    std::copy(head_weights, head_weights + kHeads, hw_);
    sums_ = o_.template alloc<float>(kBcStats, "bc_loss sums");
  }

  void reserve(int64_t M) override {
    if (M <= cap_) return;
    cap_ = M;
    const size_t m = static_cast<size_t>(M);
    stats_ = o_.template alloc<float>(m * kBcStats, "bc_loss statistics");
    scratch_ = o_.template alloc<uint8_t>(std::max<size_t>(1, K::bc_loss_rows_workspace_bytes(m)),
                                          "bc_loss scratch");
  }

  void forward(const BcBatch& in, RepeatCounts* counts, OnBcResult on_result) override {
    // The statistics and their column sums in one launch.
    float* s = sums_.template data<float>();
    K::bc_loss_rows(heads(in.logits), in.target_buttons, in.target_sticks, in.mask, in.mirrored,
                    in.prev, in.M, in.W, eps_, stats_.template data<float>(), s, scratch_.raw(),
                    o_.stream());
    exec_.read_back_later(
        s, kBcStats * sizeof(float),
        [this, counts, index = in.index, on_result = std::move(on_result)](const void* host) {
          const auto* sums = static_cast<const float*>(host);
          if (sums[kBcBadLabel] > 0)
            throw std::runtime_error(who_ + ": target_sticks has " +
                                     std::to_string(static_cast<int64_t>(sums[kBcBadLabel])) +
                                     " valid position(s) with a class out of range in batch " +
                                     std::to_string(index));
          if (counts) add_repeats(sums, *counts);
          on_result(bc_loss_result(sums, hw_), counts != nullptr,
                    [&](const double p[kRepeatItems]) { return baseline_from_sums(sums, hw_, p); });
        });
  }

  void backward(const BcBatch& in, double, float* const dlogits[kHeads]) override {
    typename K::HeadWeights hw{};
    typename K::HeadGradPointers dl{};
    for (int h = 0; h < kHeads; ++h) {
      hw.w[h] = hw_[h];
      dl.dlogits[h] = dlogits[h];
    }
    // The weight sum is read on the device, from the forward's sums.
    K::bc_loss_backward(heads(in.logits), in.target_buttons, in.target_sticks, in.mask, in.mirrored,
                        in.M, in.W, eps_, hw, sums_.template data<float>(), dl, o_.stream());
  }

 private:
  static typename K::HeadPointers heads(const float* const logits[kHeads]) {
    typename K::HeadPointers p{};
    for (int h = 0; h < kHeads; ++h) p.logits[h] = logits[h];
    return p;
  }

  Ops o_;
  const ExecContext& exec_;
  float hw_[kHeads];
  float eps_;
  std::string who_;
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
        // repeat-the-last-input baseline's loss, accuracies and all-heads-right share beside
        // the model's (all_right, shown as a metric without '/').
        .console_family("acc/", "acc")
        .console_metric("baseline/loss", "baseline")
        .console_family("baseline/acc/", "baseline acc")
        .console_metric("baseline/all_right", "baseline all_right");
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
        .check([](const ParamValue& v) -> std::string {
          const auto* w = std::get_if<std::vector<double>>(&v);
          const size_t n = w ? w->size() : std::get<std::vector<int64_t>>(v).size();
          if (n != kHeads)
            return "parameter 'head_weights' has " + std::to_string(n) +
                   " values; it needs 6: buttons, main_x, main_y, c_x, c_y, shoulder";
          // All zero: a loss of 0 that trains nothing, and a run that says it finished.
          bool any = false;
          if (w)
            for (double x : *w) any = any || x > 0;
          else
            for (int64_t x : std::get<std::vector<int64_t>>(v)) any = any || x > 0;
          return any ? "" : "parameter 'head_weights' are all 0: no head would be trained";
        })
        .param("baseline_prior", 0.9,
               "baseline P(input repeats) used before any training position was seen")
        .range(0, 1);
    return s;
  }

  void setup(StageContext& ctx) override {
    device_ = ctx.exec().device();
    starts_from_zero_ = ctx.run().reduce_over_ranks && ctx.run().rank != 0;
    eps_ = static_cast<float>(ctx.params().number("label_smoothing"));
    prior_ = ctx.params().number("baseline_prior");
    auto hw = ctx.params().numbers("head_weights");  // six: the schema's check
    for (int h = 0; h < kHeads; ++h)
      head_weights_[h] = static_cast<float>(hw[static_cast<size_t>(h)]);
    const std::string who = "bc_loss '" + ctx.name() + "'";
    path_ = ops::with_ops<MeleeKernelFamily>(
        ctx.exec(), who, [&](auto o) -> std::unique_ptr<BcLossPath> {
          using Ops = decltype(o);
          if constexpr (Ops::kBackend == KernelBackend::cpu)
            return std::make_unique<BcLossOnCpu>(head_weights_, eps_);
          else
            return std::make_unique<BcLossOnDevice<Ops>>(o, ctx.exec(), head_weights_, eps_, who);
        });
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
      names_.changed_share[h] = "changed/share/" + n;
      names_.changed_acc[h] = "changed/acc/" + n;
      names_.changed_nll[h] = "changed/nll/" + n;
      names_.base_changed_nll[h] = "baseline/changed/nll/" + n;
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
    BcBatch in;
    in.index = b.index;
    in.M = M;
    in.W = static_cast<size_t>(W);
    std::copy(logits, logits + kHeads, in.logits);
    in.target_buttons = tb.data<float>();
    in.target_sticks = ts.data<int32_t>();
    in.mask = mask.data<float>();
    in.mirrored = mirrored;
    in.prev = prev.data<float>();
    path_->forward(
        in, training ? &counts_ : nullptr,
        [this, &ctx](const BcLossResult& r, bool in_training, const BaselineOf& baseline) {
          report(ctx, r, in_training, baseline);
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
    BcBatch in;
    in.M = M;
    in.W = static_cast<size_t>(W);
    std::copy(logits, logits + kHeads, in.logits);
    in.target_buttons = ctx.input(b, "target_buttons").data<float>();
    in.target_sticks = ctx.input(b, "target_sticks").data<int32_t>();
    in.mask = mask.data<float>();
    in.mirrored = ctx.has_input(b, "mirrored") ? ctx.input(b, "mirrored").data<uint8_t>() : nullptr;
    path_->backward(in, weight_sum_, dlogits);
    for (int h = 0; h < kHeads; ++h)
      ctx.add_input_grad(
          b, kHeadNames[h],
          dlogits_[h].slice_rows(0, static_cast<int64_t>(M)).reshape(Shape{B, W, head_width(h)}));
  }

  // The baseline's counts: a resumed run reports the same baseline as an uninterrupted one.
  // The baseline's probabilities for this pass: the repeats counted on every rank's training
  // positions (each rank counts its own share of the data).
  void validation_begin(StageContext& ctx) override {
    if (ctx.run().reduce_over_ranks) seen_ = summed_over_ranks(ctx);
  }

  // Several ranks: every rank's counts, summed where a checkpoint may follow, so rank 0 saves
  // the run's; a resume gives them back to rank 0 alone (the others count on from zero), and
  // the sums over the ranks go on as if the run had not stopped. Counts are whole numbers, so
  // the sums are exact in any order.
  void gather_state(StageContext& ctx) override {
    gathered_ = summed_over_ranks(ctx);
    own_at_gather_ = counts_;
    gathered_once_ = true;
  }

  void save(StateWriter& w) const override {
    // Since the last gathering (the run's end, or a stop between checkpoint steps): rank 0's
    // own positions, the other ranks' unknown here.
    RepeatCounts c = counts_;
    if (gathered_once_) {
      c.total = gathered_.total + counts_.total - own_at_gather_.total;
      for (int k = 0; k < kRepeatItems; ++k)
        c.same[k] = gathered_.same[k] + counts_.same[k] - own_at_gather_.same[k];
    }
    w.number("repeat.total", c.total);
    for (int k = 0; k < kRepeatItems; ++k) w.number("repeat.same." + std::to_string(k), c.same[k]);
  }
  void load(StateReader& r) override {
    counts_ = RepeatCounts{};
    gathered_once_ = false;
    // Rank 0 alone where the counts are summed over the ranks (a training run's); every process
    // that scores alone (eval, infer, the policy library, under mpirun or not) takes them.
    if (!r.has("repeat.total") || starts_from_zero_) return;
    counts_.total = r.number("repeat.total");
    for (int k = 0; k < kRepeatItems; ++k)
      counts_.same[k] = r.number("repeat.same." + std::to_string(k));
  }

 private:
  // Every rank's counts added up (a collective: every rank calls it at the same point).
  RepeatCounts summed_over_ranks(StageContext& ctx) const {
    double v[1 + kRepeatItems];
    v[0] = counts_.total;
    for (int k = 0; k < kRepeatItems; ++k) v[1 + k] = counts_.same[k];
    ctx.run().reduce_over_ranks(v, RankReduce::sum,
                                "bc_loss '" + ctx.name() + "': the baseline's repeat counts");
    RepeatCounts sum;
    sum.total = v[0];
    for (int k = 0; k < kRepeatItems; ++k) sum.same[k] = v[1 + k];
    return sum;
  }

  void check(const StageContext& ctx, const Batch& b, const Tensor& t, int64_t B, int64_t W,
             int64_t C, const char* port) const {
    if (t.rank() != 3 || t.dim(0) != B || t.dim(1) != W || t.dim(2) != C || t.device() != device_)
      throw std::runtime_error("bc_loss '" + ctx.name() + "': " + port + " is " + t.describe() +
                               ", expected [" + std::to_string(B) + ", " + std::to_string(W) +
                               ", " + std::to_string(C) + "] on " + device_.str() + " (batch " +
                               std::to_string(b.index) + ")");
  }

  // The batch's loss output and metrics; in validation also the baseline's, from
  // `baseline(p)` with the repeat probabilities p.
  void report(const StageContext& ctx, const BcLossResult& r, bool training,
              const BaselineOf& baseline) {
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
    // The frames that are hard for repeat-last: every head right, and the items that change
    // (each figure weighs the changed items it is over: a batch where none changed adds
    // nothing, but names the metric, as every rank of a run must).
    ctx.metric("all_right", r.all_right, MetricKind::mean, n);
    ctx.metric("baseline/all_right", base.all_right, MetricKind::mean, n);
    // How often the recorded player and the policy act (controller_choice.h's acts()).
    ctx.metric("acts/recorded", r.acts_recorded, MetricKind::mean, n);
    ctx.metric("acts/sampled", r.acts_sampled, MetricKind::mean, n);
    ctx.metric("acts/most_likely", r.acts_most_likely, MetricKind::mean, n);
    for (int h = 0; h < kHeads; ++h) {
      const double items = n * (h == 0 ? kButtons : 1);
      ctx.metric(names_.changed_share[h], r.changed[h] / items, MetricKind::mean, items);
      ctx.metric(names_.changed_acc[h], r.changed_acc[h], MetricKind::mean, r.changed[h]);
      ctx.metric(names_.changed_nll[h], r.changed_nll[h], MetricKind::mean, r.changed[h]);
      ctx.metric(names_.base_changed_nll[h], base.changed_nll[h], MetricKind::mean, r.changed[h]);
    }
  }

  void reserve(int64_t M) {
    path_->reserve(M);
    if (M <= rows_cap_) return;
    rows_cap_ = M;
    for (int h = 0; h < kHeads; ++h)
      dlogits_[h] = Tensor::empty(Shape{M, head_width(h)}, DType::f32, device_, "bc_loss dlogits");
  }

  float eps_ = 0;
  double prior_ = 0.9;
  float head_weights_[kHeads] = {1, 1, 1, 1, 1, 1};
  struct {
    std::string loss[kHeads], nll[kHeads], acc[kHeads], base_loss[kHeads], base_acc[kHeads];
    std::string changed_share[kHeads], changed_acc[kHeads], changed_nll[kHeads],
        base_changed_nll[kHeads];
  } names_;
  RepeatCounts counts_, seen_;  // this rank's training positions; all ranks' at validation
  // gather_state's: every rank's counts, and this rank's part of them, at the last gathering.
  RepeatCounts gathered_, own_at_gather_;
  bool gathered_once_ = false;
  // A rank other than 0 of a run that sums its counts over the ranks: rank 0 holds the saved ones.
  bool starts_from_zero_ = false;
  Device device_;
  std::unique_ptr<BcLossPath> path_;  // the CPU or the device form
  double weight_sum_ = 0;
  Tensor loss_, dlogits_[kHeads];
  int64_t rows_cap_ = 0;
  int64_t rows_setup_ = 0;  // B·W known at setup (cost())
};
SLIPSTREAM_REGISTER_STAGE(BcLossStage);

}  // namespace slipstream
