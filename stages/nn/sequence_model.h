// A sequence model stage's model (mamba, gru) whichever ops it runs on: the stage picks the ops
// by the run's device once, in setup, and holds the model through this interface.
// SequenceModelOn adapts a model written over ops (MambaModel<float, Ops>, GruModel<float, Ops>);
// the GRU's cuDNN stack implements the interface itself.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include "engine/tensor.h"

#include "stages/nn/param_store.h"

namespace slipstream::nn {

template <class Config, class Layout>
class SequenceModel {
 public:
  virtual ~SequenceModel() = default;
  virtual const Config& config() const = 0;
  virtual const Layout& layout() const = 0;
  virtual int batch() const = 0;
  virtual int length() const = 0;
  // False: the model computes in FP32 under precision bf16 (and the stage keeps no shadow).
  virtual bool has_bf16_form() const { return true; }
  // Sizes every buffer for (B, L), in the bf16 form or not; the only allocating call.
  virtual void resize(int B, int L, bool bf16) = 0;
  // wb: the bf16 shadow of w when resize() was told bf16, else null.
  virtual void forward(const float* x, const float* w, const uint16_t* wb, float* y) = 0;
  // Parameter gradients accumulate into g; dx (=) may be null; layer_done(l), when given, hears
  // each layer's gradients final.
  virtual void backward(const float* x, const float* dy, const float* w, const uint16_t* wb,
                        float* g, float* dx, const std::function<void(int)>* layer_done) = 0;
  // The store's bf16 shadow from its FP32 values, on the model's device.
  virtual void refresh_shadow(const ParamStore& store) const = 0;
  // A state carried from one batch to the next, row by row (mamba_model.h): whether the model
  // can, turning it on (before resize), the next forward's start (continues (B): 1 keeps the
  // row's state, 0 starts it afresh) and forgetting it.
  virtual bool can_carry() const { return false; }
  virtual void set_carry(bool on) {
    if (on) throw std::logic_error("this model carries no state across batches");
  }
  virtual void carry(const float* continues) { (void)continues; }
  // carry() with every row continuing, without a pass over the state where the model can (false:
  // it cannot, call carry with ones).
  virtual bool carry_all() { return false; }
  virtual void clear_carry() {}
  // The carried state's buffers (empty without one), for a checkpoint to save and restore.
  virtual std::vector<Tensor> carried() const { return {}; }
  // bf16 copies beside the stage's tensors (StageSchema::reads_bf16_copy), for the forwards (and
  // their backwards) from here on in the bf16 form: x_bf, x's, written by the stage before (null:
  // the model rounds x itself where its GEMMs read it); y_bf, where the forward writes y's (null:
  // nowhere). A model that takes none ignores them and says so.
  virtual bool takes_bf16_copies() const { return false; }
  virtual void set_bf16_copies(const uint16_t* x_bf, uint16_t* y_bf) {
    (void)x_bf;
    (void)y_bf;
  }
  // Whether no backward follows the next forwards (validation, inference): a model may then
  // keep less for a backward (Mamba on a device folds dt_proj into its scan). A backward after
  // such a forward is refused.
  virtual void set_forward_only(bool on) { (void)on; }
};

template <class Model, class Config, class Layout>
class SequenceModelOn final : public SequenceModel<Config, Layout> {
 public:
  template <class Ops>
  SequenceModelOn(const Config& c, Ops ops) : m_(c, ops) {}
  const Config& config() const override { return m_.config(); }
  const Layout& layout() const override { return m_.layout(); }
  int batch() const override { return m_.batch(); }
  int length() const override { return m_.length(); }
  void resize(int B, int L, bool bf16) override { m_.resize(B, L, bf16); }
  void forward(const float* x, const float* w, const uint16_t* wb, float* y) override {
    m_.forward(x, w, wb, y);
  }
  void backward(const float* x, const float* dy, const float* w, const uint16_t* wb, float* g,
                float* dx, const std::function<void(int)>* layer_done) override {
    m_.backward(x, dy, w, wb, g, dx, layer_done);
  }
  void refresh_shadow(const ParamStore& store) const override { store.refresh_shadow(m_.ops()); }
  bool can_carry() const override { return kCarries; }
  void set_carry(bool on) override {
    if constexpr (kCarries)
      m_.set_carry(on);
    else
      SequenceModel<Config, Layout>::set_carry(on);
  }
  void carry(const float* continues) override {
    if constexpr (kCarries) m_.carry(continues);
  }
  bool carry_all() override {
    if constexpr (requires(Model & m) { m.carry_all(); }) {
      m_.carry_all();
      return true;
    } else {
      return false;
    }
  }
  void clear_carry() override {
    if constexpr (kCarries) m_.clear_carry();
  }
  std::vector<Tensor> carried() const override {
    if constexpr (kCarries)
      return m_.carried();
    else
      return {};
  }
  bool takes_bf16_copies() const override { return kCopies; }
  void set_bf16_copies(const uint16_t* x_bf, uint16_t* y_bf) override {
    if constexpr (kCopies) m_.set_bf16_copies(x_bf, y_bf);
  }
  void set_forward_only(bool on) override {
    if constexpr (requires(Model & m) { m.set_forward_only(on); }) m_.set_forward_only(on);
  }

 private:
  static constexpr bool kCarries = requires(Model & m, const float* c) { m.carry(c); };
  static constexpr bool kCopies = requires(Model & m, const uint16_t* x, uint16_t* y) {
    m.set_bf16_copies(x, y);
  };
  Model m_;
};

}  // namespace slipstream::nn
