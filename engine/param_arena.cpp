#include "engine/param_arena.h"

#include <stdexcept>

namespace slipstream {

void ParamArena::add(const Tensor& values, const Tensor& grads, const Tensor& shadow,
                     Rebind rebind) {
  if (packed_) return;  // set up after the arena was packed: keeps its own buffers
  if (!values.defined() || values.dtype() != DType::f32 || values.rank() != 1 || !grads.defined() ||
      !(grads.shape() == values.shape()) || grads.dtype() != DType::f32 ||
      (shadow.defined() && (!(shadow.shape() == values.shape()) || shadow.dtype() != DType::bf16)))
    throw std::invalid_argument(
        "ParamArena::add: needs flat f32 values and grads (and a bf16 "
        "copy) of one length, got " +
        values.describe() + ", " + grads.describe());
  if (!pending_.empty() && values.device() != pending_.front().values.device())
    throw std::invalid_argument("ParamArena::add: stores on " + values.device().str() + " and " +
                                pending_.front().values.device().str());
  pending_.push_back({values, grads, shadow, std::move(rebind)});
}

void ParamArena::pack() {
  if (packed_) return;
  packed_ = true;
  if (pending_.empty()) return;
  const Device device = pending_.front().values.device();
  std::vector<int64_t> offsets;
  int64_t total = 0;
  bool any_shadow = false;
  for (const Store& s : pending_) {
    offsets.push_back(total);
    total += s.values.numel();
    any_shadow = any_shadow || s.shadow.defined();
  }
  values_ = Tensor::zeros({total}, DType::f32, device, "model weights (the run's arena)");
  grads_ = Tensor::zeros({total}, DType::f32, device, "model weight gradients (the run's arena)");
  if (any_shadow)
    shadow_ = Tensor::zeros({total}, DType::bf16, device, "bf16 weight copy (the run's arena)");
  for (size_t i = 0; i < pending_.size(); ++i) {
    Store& s = pending_[i];
    const int64_t b = offsets[i], e = b + s.values.numel();
    Tensor v = values_.slice_rows(b, e), g = grads_.slice_rows(b, e);
    Tensor c = s.shadow.defined() ? shadow_.slice_rows(b, e) : Tensor();
    v.copy_from(s.values);
    if (c.defined()) c.copy_from(s.shadow);
    s.rebind(v, g, c);
  }
  bound_ = pending_.size();
  pending_.clear();  // the stores' own buffers go back to the pool
}

}  // namespace slipstream
