// What the sequence-model stages (mamba, gru) share: the stage around a SequenceModel. It holds
// the weights in a ParamStore on the run's device (with a bf16 shadow under precision bf16 when
// the model has a bf16 form), sizes the buffers for each new (B, W), runs forward and backward
// through the model, announces each layer's gradients to a listening reducer, and on a stream
// (Runner::stream) runs the model frame by frame from the state the previous batch left
// (`Recurrent`, CPU, fp32). A stage derives from it, declares its schema, builds its model in
// setup (with ops::with_ops) and hands it to setup_model; it says its output width and cost.
// With its optional input `continues` connected (a model that can carry a state: mamba, gru
// with backend kernels) and a
// source whose rows continue (RunState::rows_continue: the loader's `rows: streams`, where a row
// walks one game's consecutive windows), each batch row starts where the same row of the
// previous batch ended when continues says 1. Otherwise continues is ignored: no state is kept.
// On a stream on a device (infer, the policy library with a CUDA device) the model itself carries
// each row's state from batch to batch (its window forward over the batch's frames from the state
// the last one left: the same computation as the CPU's recurrent step), its rows restarted one by
// one through `continues`; a model that cannot carry (gru on cuDNN) is refused there.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/stage.h"
#include "stages/nn/model_stage_util.h"
#include "stages/nn/param_store.h"
#include "stages/nn/sequence_model.h"

namespace slipstream::nn {

// The schema's doc of the optional input `continues`; `state`: what the model carries over.
inline std::string continues_input_doc(const std::string& state) {
  return "(B) 1 where a row continues the sequence the same row of the previous batch ended (its "
         "state is carried over: " +
         state +
         "), 0 where it starts one; connected, and with a source whose rows go on (the loader's "
         "rows: streams), the stage carries state (truncated backpropagation through time); "
         "otherwise it is ignored";
}

template <class Config, class Layout, class Recurrent>
class SequenceStage : public Stage {
 public:
  using Model = SequenceModel<Config, Layout>;

  void stream_begin(StageContext& ctx) override {
    // The device path wherever the ops are CUDA kernels (a GPU, or the emulator checking it).
    device_stream_ = ctx.exec().backend() != KernelBackend::cpu;
    if (!device_stream_) {
      stream_.begin();
      return;
    }
    if (!model_->can_carry())
      throw std::runtime_error("stage '" + ctx.name() + "': frame-by-frame inference on " +
                               device_.str() +
                               " needs a model that carries its state from batch to batch, and "
                               "this one does not (gru with backend cudnn: use backend kernels, or "
                               "--device cpu)");
    model_->set_carry(true);
    B_ = W_ = 0;  // the next batch sizes the model and its state afresh: every row from zero
    stream_continues_.clear();
  }
  // A validation pass's batches are other sequences: the training rows start afresh after it,
  // and its own rows from zero.
  void validation_begin(StageContext&) override {
    if (carry_) model_->clear_carry();
  }
  void validation_end(const std::map<std::string, double>&, StageContext&) override {
    if (carry_) model_->clear_carry();
  }
  void stream_reset_row(int64_t row, StageContext&) override {
    if (!device_stream_) {
      stream_.reset_row(row);
    } else if (row >= 0 && static_cast<size_t>(row) < stream_continues_.size()) {
      stream_continues_[static_cast<size_t>(row)] = 0.0f;
      stream_restarts_ = true;
    }
  }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& x = ctx.input(b, "x");
    check_sequence(ctx, x, model_->config().din, device_);
    if (x.dim(0) != B_ || x.dim(1) != W_) resize(x.dim(0), x.dim(1));
    model_->set_forward_only(!ctx.run().training);  // validation and inference: no backward
    if (ctx.run().streaming && device_stream_) {
      take_bf16_copies(b, ctx);
      forward_stream_on_device(x);
      publish(b, ctx);
      return;
    }
    if (ctx.run().streaming) {
      const Config& c = model_->config();
      stream_.forward(c, x, store_.values(), y_, static_cast<size_t>(c.din),
                      static_cast<size_t>(output_width(c)));
      ctx.set_output(b, "y", y_);
      return;
    }
    if (carry_) {
      const Tensor& c = ctx.input(b, "continues");
      if (c.rank() != 1 || c.dim(0) != x.dim(0) || c.dtype() != DType::f32 || c.device() != device_)
        throw std::runtime_error(ctx.name() +
                                 ": continues must be (B = " + std::to_string(x.dim(0)) +
                                 ") f32 on " + device_.str() + ", got " + c.shape().str());
      model_->carry(c.data<float>());
    }
    if (bf16_ && !shadow_checked_) {
      // Weights may have been replaced since setup (checkpoint, StageHarness::load_weights);
      // from here on the optimizer keeps the shadow in step with every update.
      model_->refresh_shadow(store_);
      shadow_checked_ = true;
    }
    take_bf16_copies(b, ctx);
    model_->forward(x.data<float>(), store_.values(), store_.shadow(), y_.data<float>());
    x_ = x;
    publish(b, ctx);
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& dy = ctx.output_grad(b, "y");
    if (!dy.defined()) return;
    check_output_grad(ctx, dy, y_);
    // A multi-rank run's reducer hears of each layer as the pass leaves it.
    const std::function<void(int)> layer_done = [&](int l) {
      ctx.gradients_ready(layer_params_[static_cast<size_t>(l)]);
    };
    model_->backward(x_.data<float>(), dy.data<float>(), store_.values(), store_.shadow(),
                     store_.grads(), want_dx_ ? dx_.data<float>() : nullptr,
                     ctx.gradients_heard() ? &layer_done : nullptr);
    if (want_dx_) ctx.add_input_grad(b, "x", dx_);
  }

  std::vector<Parameter*> parameters() override { return store_.pointers(); }

  // The carried state goes into checkpoints, so a resumed run's rows go on from where they were
  // (the run as if it had not stopped). Restored only into the same batch shape: elsewhere (an
  // eval, the policy library) the rows start afresh. A multi-rank run's ranks carry different
  // rows and rank 0 writes the checkpoint: there none is saved, and a resume starts every row
  // afresh (one window each).
  void save(StateWriter& w) const override {
    if (!carry_ || !single_process_) return;
    const std::vector<Tensor> c = model_->carried();
    for (size_t i = 0; i < c.size(); ++i) w.tensor("carried." + std::to_string(i), c[i]);
  }
  void load(StateReader& r) override {
    if (!carry_ || !single_process_) return;
    std::vector<Tensor> c = model_->carried();
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string key = "carried." + std::to_string(i);
      if (!r.has(key) || r.tensor(key).shape() != c[i].shape()) return;
    }
    for (size_t i = 0; i < c.size(); ++i) r.tensor_into("carried." + std::to_string(i), c[i]);
  }

 protected:
  // The width of y for a model of config c.
  virtual int output_width(const Config& c) const = 0;

  // The second half of setup: weights allocated on the run's device and initialised by
  // init(values) (host memory), the output declared, buffers sized when (B, W) is known.
  // `in` is the input's planned shape (B, W, Din); `kind` names the stage's buffers.
  void setup_model(StageContext& ctx, const Shape& in, std::unique_ptr<Model> model,
                   const std::function<void(float* values)>& init, const std::string& kind) {
    model_ = std::move(model);
    kind_ = kind;
    device_ = ctx.exec().device();
    bf16_ = ctx.run().precision == Precision::bf16 && model_->has_bf16_form();
    store_.allocate(model_->layout().params, bf16_, device_, ctx.run().param_arena.get());
    layer_params_ = parameters_by_layer(store_.pointers(), model_->config().layers);
    store_.initialize(init);
    model_->refresh_shadow(store_);
    shadow_checked_ = false;
    want_dx_ = input_grad_wanted(ctx, 0);
    carry_ = model_->can_carry() && ctx.input_connected("continues") && ctx.run().rows_continue;
    if (ctx.run().rows_continue && !carry_)
      ctx.log(
          std::string("note: the source's rows go on from batch to batch (rows: streams), but ") +
          (model_->can_carry() ? "`continues` is not connected to this stage"
                               : "this model carries no state across batches yet") +
          ": every window starts from zero state");
    single_process_ = ctx.run().world_size == 1;
    model_->set_carry(carry_);
    copy_y_ = bf16_ && model_->takes_bf16_copies() && ctx.output_bf16_copy_wanted("y");
    ctx.declare_output("y", {in[0], in[1], output_width(model_->config())}, DType::f32);
    if (in[0] > 0 && in[1] > 0) resize(in[0], in[1]);
  }

  // A stream's batch on a device: the window forward from the state the previous batch left,
  // rows restarted by stream_reset_row (and every row at the stream's first batch) from zero.
  // Frames without a restart carry every row on: where the model can, with no pass over the state
  // (carry_all: Mamba's state buffers trade places), else with a constant tensor of ones; either
  // way their work has no copy from the host (a CUDA graph of the frame replays it). A restart
  // uploads the rows' flags first (that frame runs uncaptured).
  void forward_stream_on_device(const Tensor& x) {
    const size_t B = static_cast<size_t>(x.dim(0));
    if (stream_continues_.size() != B) {
      stream_continues_.assign(B, 0.0f);
      stream_restarts_ = true;
      Tensor ones = Tensor::empty({x.dim(0)}, DType::f32);
      std::fill_n(ones.data<float>(), B, 1.0f);
      stream_ones_ =
          Tensor::empty({x.dim(0)}, DType::f32, device_, (kind_ + " stream rows").c_str());
      stream_ones_.copy_from(ones);
      stream_continues_device_ =
          Tensor::empty({x.dim(0)}, DType::f32, device_, (kind_ + " stream rows").c_str());
    }
    if (stream_restarts_) {
      Tensor host = Tensor::empty({x.dim(0)}, DType::f32);
      std::copy(stream_continues_.begin(), stream_continues_.end(), host.data<float>());
      stream_continues_device_.copy_from(host);
    }
    if (stream_restarts_)
      model_->carry(stream_continues_device_.data<float>());
    else if (!model_->carry_all())  // every row goes on: no pass over the state where it can
      model_->carry(stream_ones_.data<float>());
    stream_restarts_ = false;
    if (bf16_ && !shadow_checked_) {
      model_->refresh_shadow(store_);
      shadow_checked_ = true;
    }
    model_->forward(x.data<float>(), store_.values(), store_.shadow(), y_.data<float>());
    std::fill(stream_continues_.begin(), stream_continues_.end(), 1.0f);
  }

  // In the bf16 form: x's bf16 copy where the stage before wrote one (the model's input
  // projection reads it instead of a cast of its own) and, where a stage after reads y's, y_bf_
  // for the final norm to write it into.
  void take_bf16_copies(const Batch& b, const StageContext& ctx) {
    if (!bf16_ || !model_->takes_bf16_copies()) return;
    const Tensor* xb = ctx.input_bf16_copy(b, "x");
    model_->set_bf16_copies(xb ? xb->data<uint16_t>() : nullptr,
                            copy_y_ ? y_bf_.data<uint16_t>() : nullptr);
  }
  void publish(Batch& b, const StageContext& ctx) const {
    ctx.set_output(b, "y", y_);
    if (copy_y_) ctx.set_output_bf16_copy(b, "y", y_bf_);
  }

  // The rare path: a batch of a new shape (and setup, when the shape is known).
  void resize(int64_t B, int64_t W) {
    const Config& c = model_->config();
    model_->resize(static_cast<int>(B), static_cast<int>(W), bf16_);
    B_ = B, W_ = W;
    y_ = Tensor::empty({B, W, output_width(c)}, DType::f32, device_, (kind_ + " output").c_str());
    if (copy_y_)
      y_bf_ = Tensor::empty({B, W, output_width(c)}, DType::bf16, device_,
                            (kind_ + " output (bf16 copy)").c_str());
    dx_ = Tensor::empty({B, W, c.din}, DType::f32, device_, (kind_ + " input gradient").c_str());
  }

  std::unique_ptr<Model> model_;
  std::string kind_;
  Device device_;
  ParamStore store_;
  std::vector<std::vector<Parameter*>> layer_params_;  // per layer, for gradients_ready
  Tensor x_, y_, dx_, y_bf_;
  int64_t B_ = 0, W_ = 0;
  bool bf16_ = false, want_dx_ = true, shadow_checked_ = false;
  bool carry_ = false;   // `continues` connected and rows continue: state carried across batches
  bool copy_y_ = false;  // a stage after reads y's bf16 copy, and the model writes it
  bool single_process_ = true;
  FrameStream<Recurrent, Config> stream_;  // Runner::stream's state on the CPU
  // On a device: the model carries the stream's state; each row's `continues` for the next batch.
  bool device_stream_ = false;
  std::vector<float> stream_continues_;
  bool stream_restarts_ = false;  // some row restarts at the next batch
  Tensor stream_continues_device_, stream_ones_;
};

}  // namespace slipstream::nn
