// adamw: the optimizer stage. Updates every trainable parameter upstream once per batch (or once
// per `accumulate` batches), after the backward pass; writes the bf16 shadow under bf16
// precision; keeps an EMA of the weights for validation. The work is AdamWOptimizer's.
#include <cmath>
#include <cstdio>

#include "engine/registry.h"
#include "stages/optim/adamw_optimizer.h"

namespace slipstream {
namespace {

// beta1, beta2 and ema stop short of 1: the bias corrections divide by 1 - beta^step, and an
// EMA of decay 1 never moves from the starting weights.
std::function<std::string(const ParamValue&)> below_one(std::string name) {
  return [name](const ParamValue& v) -> std::string {
    const auto* x = std::get_if<double>(&v);
    return !x || *x < 1 ? ""
                        : "parameter '" + name + "' = " + param_value_str(v) + " must be below 1";
  };
}

class AdamWStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("adamw")
        .family("optim")
        .doc(
            "AdamW (decoupled weight decay) on every upstream parameter, with global-norm "
            "clipping, LR schedules, gradient accumulation and an EMA of the weights.")
        .role(StageRole::update)
        .param("lr", 1e-4, "peak learning rate")
        .range(0, std::nullopt)
        .param("beta1", 0.9, "first-moment decay (below 1)")
        .range(0, 1)
        .check(below_one("beta1"))
        .param("beta2", 0.999, "second-moment decay (below 1)")
        .range(0, 1)
        .check(below_one("beta2"))
        .param("eps", 1e-8, "added to the denominator")
        .range(0, std::nullopt)
        .param("weight_decay", 0.01,
               "decoupled decay; never on norms, biases, A_log, D or embedding tables")
        .range(0, std::nullopt)
        .param("clip", 1.0, "max global gradient norm (0: no clipping)")
        .range(0, std::nullopt)
        .param("schedule", std::string("constant"), "learning-rate schedule")
        .choices({"constant", "linear_warmup", "cosine", "cosine_restarts"})
        .param("warmup", int64_t{0},
               "linear warmup steps (optimizer steps); schedule constant has none")
        .range(0, std::nullopt)
        .param("min_lr", 0.0, "floor of the cosine schedules")
        .range(0, std::nullopt)
        .param("restart_period", int64_t{1000}, "cosine_restarts: steps of the first period")
        .range(1, std::nullopt)
        .param("restart_mult", 1.0, "cosine_restarts: each period this many times the previous")
        .range(1, std::nullopt)
        .param("total_steps", int64_t{0},
               "optimizer steps for the cosine schedule (0: the run's steps)")
        .range(0, std::nullopt)
        .param("accumulate", int64_t{1},
               "batches summed per update (gradients averaged); run.steps, log_every, "
               "validate_every and checkpoints count updates")
        .range(1, 1 << 20)
        .micro_batches()
        .param("ema", 0.0,
               "EMA decay of the weights, below 1, e.g. 0.999 (0: off); validation uses it")
        .range(0, 1)
        .check(below_one("ema"));
  }

  void setup(StageContext& ctx) override {
    const Params& p = ctx.params();
    optim::AdamWConfig c;
    c.beta1 = p.number("beta1");
    c.beta2 = p.number("beta2");
    c.eps = p.number("eps");
    c.weight_decay = p.number("weight_decay");
    c.clip = p.number("clip");
    c.accumulate = p.integer("accumulate");
    c.ema = p.number("ema");
    c.schedule.kind = optim::LrSchedule::parse(p.string("schedule"));
    c.schedule.lr = p.number("lr");
    c.schedule.min_lr = p.number("min_lr");
    c.schedule.warmup = p.integer("warmup");
    c.schedule.restart_period = p.integer("restart_period");
    c.schedule.restart_mult = p.number("restart_mult");
    c.schedule.total = p.integer("total_steps");
    if (c.schedule.total == 0)
      c.schedule.total = static_cast<int64_t>(ctx.run().total_steps);  // optimizer steps
    if (c.schedule.kind == optim::LrSchedule::Kind::cosine && c.schedule.total <= 0)
      throw std::runtime_error("schedule 'cosine' needs the number of steps: set " + ctx.name() +
                               ".total_steps or run.steps (" + p.mark("schedule").str() + ")");
    // A warmup as long as the run: the rate never reaches lr (and a cosine never decays).
    if (c.schedule.kind != optim::LrSchedule::Kind::constant && c.schedule.warmup > 0 &&
        c.schedule.total > 0 && c.schedule.warmup >= c.schedule.total && ctx.run().training)
      ctx.log("note: warmup " + std::to_string(c.schedule.warmup) +
              " steps is as long as the run's " + std::to_string(c.schedule.total) +
              " or longer: the learning rate never reaches lr " + param_value_str(p.value("lr")) +
              " (--set " + ctx.name() + ".warmup=N with N well below " +
              std::to_string(c.schedule.total) + ")");
    auto params = ctx.upstream_parameters();
    if (params.empty())
      throw std::runtime_error(
          "no trainable parameters upstream: list the loss stage (or the "
          "allreduce after it) as this stage's input");
    ema_ = c.ema > 0;
    schedule_ = c.schedule;
    // Sharded (sync.shard_optimizer upstream): this rank updates its pieces of the weights.
    opt_.attach(std::move(params), c, &ctx.exec(), ctx.optimizer_shard());
    elements_ = static_cast<double>(opt_.elements_updated());
    opt_.refresh_shadows();
  }

  void forward(Batch& b, StageContext& ctx) override {
    (void)b;
    if (!ctx.run().training) return;
    // On a device the report comes when the runner completes the step's read-backs.
    opt_.micro_step([&ctx](const optim::AdamWOptimizer::Report& rep) {
      if (!rep.stepped) return;
      ctx.metric("lr", rep.lr, MetricKind::last);  // the rate at this step, not a window's mean
      ctx.metric("grad_norm", rep.grad_norm);
      if (!rep.finite) ctx.metric("nonfinite_grad_steps", 1.0);
    });
  }

  // Per weight and step: the gradient's share of the global norm, the two moments, the bias
  // corrections, decay and update (and the EMA when on).
  Cost cost() const override { return {0, 0, elements_ * (17 + (ema_ ? 3 : 0))}; }

  void parameters_replaced(StageContext& ctx) override {
    (void)ctx;
    opt_.weights_replaced();
  }

  void validation_begin(StageContext& ctx) override {
    (void)ctx;
    if (!opt_.ema_swapped()) opt_.swap_ema();
  }
  void validation_end(const std::map<std::string, double>& metrics, StageContext& ctx) override {
    (void)metrics;
    (void)ctx;
    if (opt_.ema_swapped()) opt_.swap_ema();
  }

  // The schedule's length rides along: a resume that changes it (--set run.steps=N on a run
  // whose cosine ended) says what that does to the LR instead of jumping it silently.
  void save(StateWriter& w) const override {
    opt_.save(w);
    w.integer("schedule_total", schedule_.total);
  }
  void load(StateReader& r) override {
    opt_.load(r);
    saved_total_ = r.has("schedule_total") ? r.integer("schedule_total") : -1;
  }
  void start(StageContext& ctx) override {
    if (saved_total_ < 0 || saved_total_ == schedule_.total) return;
    if (schedule_.kind != optim::LrSchedule::Kind::cosine) return;
    optim::LrSchedule before = schedule_;
    before.total = saved_total_;
    const auto step = static_cast<int64_t>(ctx.run().step.load());
    // In the warm-up both schedules give the same LR at this step: say where they part instead.
    char at[160];
    if (before.at(step) == schedule_.at(step))
      std::snprintf(at, sizeof at,
                    "the LR at step %lld is %.3g either way (warm-up), then decays "
                    "to step %lld instead of %lld",
                    static_cast<long long>(step), schedule_.at(step),
                    static_cast<long long>(schedule_.total), static_cast<long long>(saved_total_));
    else
      std::snprintf(at, sizeof at, "the LR at step %lld goes from %.3g to %.3g",
                    static_cast<long long>(step), before.at(step), schedule_.at(step));
    char line[512];
    std::snprintf(line, sizeof line,
                  "the cosine schedule now decays over %lld steps (the checkpoint's run: %lld): "
                  "%s. To keep the checkpoint's schedule (min_lr from step %lld on): --set "
                  "%s.total_steps=%lld",
                  static_cast<long long>(schedule_.total), static_cast<long long>(saved_total_), at,
                  static_cast<long long>(saved_total_), ctx.name().c_str(),
                  static_cast<long long>(saved_total_));
    ctx.log(line);
  }

 private:
  optim::AdamWOptimizer opt_;
  optim::LrSchedule schedule_;
  int64_t saved_total_ = -1;  // the schedule's length in the checkpoint resumed from
  double elements_ = 0;       // weights updated (cost())
  bool ema_ = false;
};
SLIPSTREAM_REGISTER_STAGE(AdamWStage);

}  // namespace
}  // namespace slipstream
