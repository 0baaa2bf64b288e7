#include "stages/nn/param_store.h"

namespace slipstream::nn {

void ParamStore::allocate(const ParamLayout& layout, bool bf16_shadow, const Device& device) {
  const int64_t n = static_cast<int64_t>(layout.total());
  values_ = Tensor::zeros({n}, DType::f32, device, "model weights");
  grads_ = Tensor::zeros({n}, DType::f32, device, "model weight gradients");
  shadow_ = bf16_shadow ? Tensor::zeros({n}, DType::bf16, device, "bf16 weight copy") : Tensor();
  params_.clear();
  params_.reserve(layout.slots().size());
  for (const auto& s : layout.slots()) {
    const int64_t b = static_cast<int64_t>(s.offset), e = b + static_cast<int64_t>(s.numel);
    const Shape shape{std::span<const int64_t>(s.shape)};
    Parameter p;
    p.name = s.name;
    p.value = values_.slice_rows(b, e).reshape(shape);
    p.grad = grads_.slice_rows(b, e).reshape(shape);
    if (bf16_shadow) p.low_precision = shadow_.slice_rows(b, e).reshape(shape);
    p.weight_decay = s.weight_decay;
    params_.push_back(std::move(p));
  }
}

std::vector<Parameter*> ParamStore::pointers() {
  std::vector<Parameter*> out;
  out.reserve(params_.size());
  for (auto& p : params_) out.push_back(&p);
  return out;
}

}  // namespace slipstream::nn
