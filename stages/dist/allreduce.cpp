// allreduce: averages every upstream gradient over all ranks after the backward pass, before the
// optimizer. Backends: mpi (CPU tensors), none (one process: nothing to do, and MPI is never
// touched), auto (mpi when a launcher started several ranks), nccl (GPU; needs a CUDA build).
// With gradient accumulation the optimizer steps every N batches; gradients are reduced only
// on those batches (the sums of N micro-batches), so traffic does not grow with N.
#include <cmath>

#include "engine/graph.h"
#include "engine/registry.h"
#include "stages/dist/grad_buckets.h"
#include "stages/dist/mpi_reduce.h"

namespace slipstream {
namespace {

class AllreduceStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("allreduce")
        .family("dist")
        .doc("Averages all upstream gradients over the ranks of a multi-process run.")
        .role(StageRole::update)
        .param(
            "backend", std::string("auto"),
            "auto (mpi when started by mpirun/srun with >1 ranks, else none) | none | mpi | nccl")
        .choices({"auto", "none", "mpi", "nccl"})
        .param("bucket_mb", 25.0, "size of one reduction message, MiB")
        .range(0.001, 4096);
  }

  void setup(StageContext& ctx) override {
    std::string backend = ctx.params().string("backend");
    if (backend == "nccl")
      throw std::runtime_error("allreduce backend nccl needs a CUDA build (" +
                               ctx.params().mark("backend").str() + ")");
    if (backend == "auto") backend = dist::launched_with_multiple_ranks() ? "mpi" : "none";
    use_mpi_ = backend == "mpi";
    // Gradients are complete once per optimizer step (after that many accumulated batches).
    accumulate_ = static_cast<int64_t>(ctx.run().micro_batches_per_step);
    if (!use_mpi_) return;
    dist::mpi_init_once();
    world_ = dist::mpi_world_size();
    std::vector<Parameter*> params;
    for (auto& [name, p] : ctx.upstream_parameters()) params.push_back(p);
    const auto bucket =
        static_cast<size_t>(std::ceil(ctx.params().number("bucket_mb") * 1048576.0 / 4.0));
    buckets_ = dist::GradBuckets(params, bucket);
    buffer_.assign(std::min(bucket, std::max<size_t>(1, buckets_.total())), 0.0f);
  }

  void forward(Batch& b, StageContext& ctx) override {
    (void)b;
    if (!ctx.run().training) return;
    if (++micro_ < accumulate_) return;
    micro_ = 0;
    if (use_mpi_ && world_ > 1) dist::mpi_average(buckets_, buffer_);
  }

  void save(StateWriter& w) const override { w.integer("micro", micro_); }
  void load(StateReader& r) override { micro_ = r.has("micro") ? r.integer("micro") : 0; }

 private:
  bool use_mpi_ = false;
  int world_ = 1;
  int64_t accumulate_ = 1, micro_ = 0;
  dist::GradBuckets buckets_;
  std::vector<float> buffer_;
};
SLIPSTREAM_REGISTER_STAGE(AllreduceStage);

}  // namespace
}  // namespace slipstream
