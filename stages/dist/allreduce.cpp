// allreduce: averages every upstream gradient over all ranks before the optimizer. Backends: mpi
// (host gradients, a helper thread), nccl (device gradients, a communication stream; CUDA
// builds, and the emulated device, whose buckets it averages over MPI on the host), none (one
// process: nothing to do, and MPI is never touched), auto (when a launcher started several ranks:
// nccl on a GPU, mpi on the CPU; else none).
//
// With `overlap` (the default) each bucket starts as soon as the backward pass has announced
// every parameter in it final (StageContext::gradients_ready), on the reducer's helper thread,
// so communication runs while the earlier stages' gradients are computed; this stage's forward,
// after the backward, waits for the rest. With gradient accumulation the optimizer steps every
// N batches; gradients are reduced only on those batches (the sums of N micro-batches), so
// traffic does not grow with N.
#include <cmath>
#include <memory>
#include <unordered_map>

#include "engine/graph.h"
#include "engine/registry.h"
#include "engine/state_io.h"
#include "kernels/step_recorder.h"
#include "stages/dist/grad_buckets.h"
#include "stages/dist/mpi_reduce.h"
#include "stages/dist/nccl_reduce.h"

namespace slipstream {
namespace {

class AllreduceStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("allreduce")
        .family("dist")
        .doc(
            "Averages all upstream gradients over the ranks of a multi-process run, bucket by "
            "bucket while the backward pass runs.")
        .role(StageRole::update)
        .param("backend", std::string("auto"),
               "auto (started by mpirun/srun with >1 ranks: nccl on a GPU, mpi on the CPU; else "
               "none) | none | mpi | nccl (device gradients; on device emulated its collectives "
               "run over MPI on the host)")
        .choices({"auto", "none", "mpi", "nccl"})
        .param("bucket_mb", 25.0, "size of one reduction message, MiB")
        .range(0.001, 4096)
        .param("first_bucket_mb", 1.0,
               "size of the first bucket (the last layers' gradients), MiB: small, so "
               "communication starts early in the backward pass (at most bucket_mb)")
        .range(0.001, 4096)
        .param("overlap", true,
               "start each bucket as soon as the backward pass has made it final (false: "
               "reduce everything after the backward pass)")
        .param("shard_optimizer", false,
               "ZeRO-1: gradients reduce-scattered, so each rank averages and updates 1/world of "
               "the weights and keeps the optimizer's moments for those only; the updated weights "
               "are all-gathered")
        .param("timeout_s", 300.0,
               "a rank that does not answer within this many seconds stops the run, every rank "
               "of it, naming the step (and, over MPI, the rank)")
        .range(0.1, 86400);
  }

  void setup(StageContext& ctx) override {
    std::string backend = ctx.params().string("backend");
    // The run's ranks (a probe inside a multi-rank launch runs as one process).
    const bool launched = ctx.run().world_size > 1;
    if (backend == "auto") backend = !launched ? "none" : ctx.device().is_cuda() ? "nccl" : "mpi";
    // Gradients are complete once per optimizer step (after that many accumulated batches).
    accumulate_ = static_cast<int64_t>(ctx.run().micro_batches_per_step);
    world_ = ctx.run().world_size;
    mpi_.reset();
    nccl_.reset();
    ctx.share_optimizer_state(nullptr);
    const bool shard = ctx.params().boolean("shard_optimizer");
    if (backend == "none") return;  // one process: the optimizer holds everything anyway
    ctx.declare_gradients_averaged();
    const std::string where = " (" + ctx.params().mark("backend").str() + ")";
    // The emulated device runs the nccl reducer with its collectives over MPI on the host.
    const bool emulated = ctx.exec().backend() == KernelBackend::emulated;
    if (backend == "nccl" && !emulated && !dist::nccl_built())
      throw std::runtime_error("allreduce backend nccl needs a CUDA build" + where);
    if (backend == "nccl" && !emulated && !ctx.device().is_cuda())
      throw std::runtime_error("allreduce backend nccl reduces GPU gradients and this run is on " +
                               ctx.device().str() + ": use backend mpi (or auto)" + where);
    if (backend == "mpi" && world_ <= 1) return;  // one rank: nothing to average
    if (launched) {
      dist::mpi_init_once();
      if (dist::mpi_world_size() != world_)
        throw std::runtime_error("MPI says " + std::to_string(dist::mpi_world_size()) +
                                 " ranks but the launcher's environment says " +
                                 std::to_string(world_));
    }
    const double timeout = ctx.params().number("timeout_s");
    if (world_ > 1)  // the metric sums, with this stage's deadline
      ctx.run().reduce_over_ranks = [timeout](std::span<double> v, RankReduce op,
                                              const std::string& what) {
        dist::mpi_reduce(v, op, timeout, what);
      };
    // The order the backward pass finishes gradients: the last stage's last parameter first.
    auto named = ctx.upstream_parameters();
    std::vector<Parameter*> params;
    for (auto it = named.rbegin(); it != named.rend(); ++it) params.push_back(it->second);
    index_.clear();
    for (size_t k = 0; k < params.size(); ++k) index_[params[k]] = k;
    auto floats = [&](const char* key) {
      return static_cast<size_t>(std::ceil(ctx.params().number(key) * 1048576.0 / 4.0));
    };
    dist::GradBuckets buckets(params, floats("bucket_mb"), floats("first_bucket_mb"));
    if (backend == "nccl")
      nccl_ = std::make_unique<dist::NcclBucketReducer>(std::move(buckets), ctx.exec().stream(),
                                                        ctx.run().rank, world_, timeout, emulated,
                                                        shard);
    else
      mpi_ = std::make_unique<dist::MpiBucketReducer>(std::move(buckets), timeout, shard);
    if (shard && world_ > 1) publish_shard(ctx, timeout);
    if (ctx.params().boolean("overlap")) {
      RunState* run = &ctx.run();
      ctx.on_gradients_ready([this, run](std::span<Parameter* const> ready) {
        if (micro_ + 1 < accumulate_) return;  // not the step's last batch: sums still grow
        not_captured();
        for (Parameter* p : ready) {
          auto it = index_.find(p);
          if (it == index_.end()) continue;
          if (mpi_)
            mpi_->param_ready(it->second, run->step + 1);
          else
            nccl_->param_ready(it->second, run->step + 1);
        }
      });
    }
  }

  void forward(Batch& b, StageContext& ctx) override {
    (void)b;
    if (!ctx.run().training) return;
    if (++micro_ < accumulate_) return;
    micro_ = 0;
    not_captured();
    if (nccl_) nccl_->finish(ctx.run().step + 1);  // the device waits, not the host
    if (!mpi_) return;
    const auto t = mpi_->finish(ctx.run().step + 1);
    ctx.metric("sync/comm_ms", t.comm_s * 1e3);
    ctx.metric("sync/exposed_ms", t.exposed_s * 1e3);
  }

  // A step recorded for a CUDA graph (engine/step_graphs.h) issues its work before an mpi
  // reduction, which reads and writes the gradients from a helper thread on the host. nccl's
  // collectives are enqueued through the recorder and captured with the step.
  void not_captured() const {
    if (mpi_)
      capture::sync_point(
          "the gradients' reduction across ranks (allreduce backend mpi) runs on the host");
  }

  // The optimizer downstream finds which pieces it updates, and the collectives around that:
  // blocking host collectives (mpi), or enqueued on the compute stream (nccl).
  void publish_shard(const StageContext& ctx, double timeout) {
    RunState& run = ctx.run();
    auto shard = std::make_shared<OptimizerShard>();
    shard->rank = run.rank;
    shard->world = world_;
    for (int r = 0; r < world_; ++r)
      shard->pieces.push_back(mpi_ ? mpi_->shard_pieces(r) : nccl_->shard_pieces(r));
    shard->sum = [timeout](std::span<double> v) {
      dist::mpi_reduce(v, RankReduce::sum, timeout, "the gradient norm");
    };
    RunState* state = &run;
    if (mpi_) {
      dist::MpiBucketReducer* mpi = mpi_.get();
      shard->gather_weights = [mpi, state] { mpi->gather_weights(state->step + 1); };
    } else {
      dist::NcclBucketReducer* nccl = nccl_.get();
      shard->gather_weights = [nccl] { nccl->gather_weights(); };
      shard->sum_on_device = [nccl](double* v) { nccl->sum(v); };
    }
    shard->gather_to_root = [timeout](std::span<const float> mine, std::vector<float>& all) {
      dist::mpi_gather_to_root(mine, all, timeout,
                               "gathering the optimizer's state for a checkpoint");
    };
    ctx.share_optimizer_state(std::move(shard));
  }

  void save(StateWriter& w) const override { w.integer("micro", micro_); }
  void load(StateReader& r) override { micro_ = r.has("micro") ? r.integer("micro") : 0; }

 private:
  int world_ = 1;
  int64_t accumulate_ = 1, micro_ = 0;
  std::unordered_map<const Parameter*, size_t> index_;
  std::unique_ptr<dist::MpiBucketReducer> mpi_;
  std::unique_ptr<dist::NcclBucketReducer> nccl_;
};
SLIPSTREAM_REGISTER_STAGE(AllreduceStage);

}  // namespace
}  // namespace slipstream
