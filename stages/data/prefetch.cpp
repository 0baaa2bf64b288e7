// prefetch: moves every host tensor of the batch to the run's device ahead of the trainable
// section. On CUDA the tensors are copied into a slot of a ring of device buffers on a copy
// stream of the stage's own, and the batch carries a fence: the compute stream waits for the
// copies (on the device) before the section's first stage, and the slot is reused only after the
// compute stream is done with it (stages/data/batch_ring.h). So the copy of batch k+1 overlaps
// the step of batch k; the prefetch thread waits only when a ring's turn later its slot's
// previous copy is still reading the loader's memory, and the trainer never waits for a copy.
// Under the emulator
// the same ring runs with host buffers and synchronous copies; on the CPU the tensors are
// already where they are used and the stage only counts (its queue depth shows how far the
// data side runs ahead).
//
// Put it last before the trainable section: a data transform after it would read the slot
// before the copies are ordered.
#include "engine/registry.h"
#include "stages/data/batch_ring.h"

namespace slipstream {

class PrefetchStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("prefetch")
        .family("data")
        .doc(
            "Copies the batch's tensors to the run's device on a copy stream, overlapping the step "
            "in progress (on the CPU: nothing to copy).")
        .passthrough()
        .param("depth", int64_t{2},
               "device slots of the copy ring to start with; it grows to the batches held at once "
               "(run.max_in_flight, one more while the host runs ahead)")
        .range(1, 64);
  }

  void setup(StageContext& ctx) override {
    ring_.reset();
    const std::shared_ptr<ExecContext>& exec = ctx.run().exec;
    if (exec && exec->device_ops())
      ring_ = std::make_unique<BatchRing>(exec, static_cast<size_t>(ctx.params().integer("depth")),
                                          static_cast<size_t>(ctx.run().max_in_flight));
  }

  void forward(Batch& b, StageContext& ctx) override {
    if (!ring_) return;
    std::vector<Tensor*> tensors = ctx.passthrough_tensors(b);
    if (std::shared_ptr<BatchFence> fence = ring_->load(tensors)) {
      if (b.fence)
        throw std::logic_error("a batch reached prefetch with a fence of another stage's copies");
      b.fence = std::move(fence);
    }
  }

 private:
  std::unique_ptr<BatchRing> ring_;
};
SLIPSTREAM_REGISTER_STAGE(PrefetchStage);

}  // namespace slipstream
