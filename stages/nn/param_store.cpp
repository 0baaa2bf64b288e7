#include "stages/nn/param_store.h"

namespace slipstream::nn {

void ParamStore::allocate(const ParamLayout& layout, bool bf16_shadow, const Device& device,
                          ParamArena* arena) {
  const int64_t n = static_cast<int64_t>(layout.total());
  slots_ = layout.slots();
  params_.clear();
  params_.resize(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    params_[i].name = slots_[i].name;
    params_[i].weight_decay = slots_[i].weight_decay;
  }
  bind(Tensor::zeros({n}, DType::f32, device, "model weights"),
       Tensor::zeros({n}, DType::f32, device, "model weight gradients"),
       bf16_shadow ? Tensor::zeros({n}, DType::bf16, device, "bf16 weight copy") : Tensor());
  if (arena)
    arena->add(values_, grads_, shadow_,
               [this](const Tensor& v, const Tensor& g, const Tensor& c) { bind(v, g, c); });
}

void ParamStore::bind(const Tensor& values, const Tensor& grads, const Tensor& shadow) {
  values_ = values;
  grads_ = grads;
  shadow_ = shadow;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    const int64_t b = static_cast<int64_t>(s.offset), e = b + static_cast<int64_t>(s.numel);
    const Shape shape{std::span<const int64_t>(s.shape)};
    Parameter& p = params_[i];
    p.value = values_.slice_rows(b, e).reshape(shape);
    p.grad = grads_.slice_rows(b, e).reshape(shape);
    p.low_precision = shadow_.defined() ? shadow_.slice_rows(b, e).reshape(shape) : Tensor();
  }
}

std::vector<Parameter*> ParamStore::pointers() {
  std::vector<Parameter*> out;
  out.reserve(params_.size());
  for (auto& p : params_) out.push_back(&p);
  return out;
}

}  // namespace slipstream::nn
