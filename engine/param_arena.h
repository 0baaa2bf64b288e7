// Every weight, gradient and bf16 copy of a run's model stages in three flat tensors on the
// run's device. A stage's store registers in its setup (with the buffers setup filled: the initial
// weights); once the last trainable stage is set up, Graph::setup packs the arena — one
// allocation each, each store's values and copy moved into its slice, the gradients zeroed — and
// points every store at its slices, before the update stages (allreduce, optimizer) take the
// parameters. Checkpoint names, shapes and the stages' Parameter objects stay as they were;
// only their memory moves. The stores lie back to back in the order they registered (graph
// order), without padding — the parameters inside a store were never aligned beyond their
// element either — so a reducer's bucket runs across two stages without a gap (nothing staged),
// and the whole model is one block of device memory.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace slipstream {

class ParamArena {
 public:
  // Points a store at its slices (shadow undefined when the store keeps no bf16 copy).
  using Rebind =
      std::function<void(const Tensor& values, const Tensor& grads, const Tensor& shadow)>;

  // A store's flat f32 values and gradients and optional bf16 copy, all of one length, on the
  // run's device. Before pack(); a store added after it keeps its own buffers.
  void add(const Tensor& values, const Tensor& grads, const Tensor& shadow, Rebind rebind);
  // One allocation each (values, gradients, and a copy when any store has one), the values and
  // copies moved in (synchronous: setup), the gradients zeroed, every store rebound.
  void pack();
  bool packed() const { return packed_; }
  size_t stores() const { return pending_.size() + bound_; }
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  const Tensor& shadow() const { return shadow_; }

 private:
  struct Store {
    Tensor values, grads, shadow;
    Rebind rebind;
  };
  std::vector<Store> pending_;
  size_t bound_ = 0;
  bool packed_ = false;
  Tensor values_, grads_, shadow_;
};

}  // namespace slipstream
