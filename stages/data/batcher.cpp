// batcher: joins `factor` consecutive batches from the source into one, concatenating every
// tensor along its first dimension (e.g. small per-file batches into training batches). Output
// batch k is made of source batches [k*factor, (k+1)*factor), so runs resume exactly.
#include <cstring>

#include "engine/registry.h"

namespace slipstream {

class BatcherStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("batcher")
        .family("data")
        .doc("Concatenates `factor` consecutive source batches along the first dimension.")
        .role(StageRole::rebatch)
        .passthrough()
        .param("factor", int64_t{1}, "source batches per output batch")
        .range(1, 65536)
        .param("drop_last", true, "drop a final batch with fewer than `factor` parts");
  }

  void setup(StageContext& ctx) override {
    factor_ = static_cast<uint64_t>(ctx.params().integer("factor"));
    drop_last_ = ctx.params().boolean("drop_last");
  }

  uint64_t upstream_seek_index(uint64_t next_index) const override { return next_index * factor_; }
  uint64_t batches_out(uint64_t upstream_batches) const override {
    return drop_last_ ? upstream_batches / factor_ : (upstream_batches + factor_ - 1) / factor_;
  }

  bool rebatch(Batch& out, const std::function<bool(Batch&)>& pull, StageContext& ctx) override {
    parts_.resize(factor_);
    uint64_t got = 0;
    for (; got < factor_; ++got)
      if (!pull(parts_[got])) break;
    if (got == 0 || (got < factor_ && drop_last_)) return false;
    out.epoch = parts_[0].epoch;
    out.samples = 0;
    for (uint64_t i = 0; i < got; ++i) out.samples += parts_[i].samples;
    for (size_t s = 0; s < parts_[0].slots.size(); ++s) {
      const Tensor& first = parts_[0].slots[s];
      if (!first.defined()) continue;
      Shape shape = first.shape();
      int64_t rows = 0;
      for (uint64_t i = 0; i < got; ++i) {
        const Tensor& t = parts_[i].slots[s];
        Shape a = t.shape(), b = first.shape();
        a[0] = b[0] = 0;
        if (!(a == b) || t.dtype() != first.dtype())
          throw std::runtime_error("batcher '" + ctx.name() + "': part " + std::to_string(i) +
                                   " has " + t.describe() + ", part 0 has " + first.describe());
        rows += t.dim(0);
      }
      shape[0] = rows;
      Tensor joined = Tensor::empty(shape, first.dtype(), first.device(), "batcher output");
      size_t offset = 0;
      for (uint64_t i = 0; i < got; ++i) {
        const Tensor& t = parts_[i].slots[s];
        std::memcpy(static_cast<char*>(joined.raw()) + offset, t.raw(), t.nbytes());
        offset += t.nbytes();
      }
      out.slots[s] = joined;
    }
    for (auto& p : parts_) p.slots.assign(p.slots.size(), Tensor());
    return true;
  }

 private:
  uint64_t factor_ = 1;
  bool drop_last_ = true;
  std::vector<Batch> parts_;
};
SLIPSTREAM_REGISTER_STAGE(BatcherStage);

}  // namespace slipstream
