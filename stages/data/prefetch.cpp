// prefetch: moves every tensor of the batch to the run's device ahead of the trainable section.
// On CUDA each tensor is copied from the (page-locked) host batch into fresh device memory with
// a synchronous copy, which first waits for the device's queued work: correct, but the copy does
// not yet overlap training (a copy stream, a ring of device slots and an event the compute
// stream waits on are still to come: docs/architecture.md, "Not built yet"). On the CPU, and
// under the emulator, the tensors are already where they are used and the stage only counts
// (its queue depth shows how far the data side runs ahead).
#include "engine/registry.h"

namespace slipstream {

class PrefetchStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("prefetch")
        .family("data")
        .doc("Moves the batch's tensors to the run's device ahead of use (copy stream on CUDA).")
        .passthrough()
        .param("depth", int64_t{2}, "batches copied ahead of the trainable section")
        .range(1, 64);
  }

  void setup(StageContext& ctx) override { depth_ = ctx.params().integer("depth"); }

  void forward(Batch& b, StageContext& ctx) override {
    if (ctx.device().is_cpu()) return;
    for (Tensor* t : ctx.passthrough_tensors(b)) {
      if (t->device() == ctx.device()) continue;
      Tensor d = Tensor::empty(t->shape(), t->dtype(), ctx.device(), "prefetch batch tensor");
      d.copy_from(*t);
      *t = d;
    }
  }

 private:
  int64_t depth_ = 2;
};
SLIPSTREAM_REGISTER_STAGE(PrefetchStage);

}  // namespace slipstream
