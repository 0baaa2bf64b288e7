// StageContext: what a stage sees of the run and the graph around it (engine/stage.h): its
// ports' slots and shapes, its inputs and outputs in a batch, metrics, log lines, its upstream
// stages and parameters, the gradient announcements, its seed.
#include <iostream>
#include <stdexcept>
#include <string>

#include "engine/graph.h"

namespace slipstream {

namespace {
template <class Ports>
int port_index(const Ports& ports, std::string_view port, const std::string& stage,
               const char* what) {
  for (size_t i = 0; i < ports.size(); ++i)
    if (ports[i].name == port) return static_cast<int>(i);
  throw std::logic_error("stage '" + stage + "' has no " + what + " port '" + std::string(port) +
                         "'");
}
}  // namespace

const ExecContext& StageContext::exec() const {
  if (run_->exec) return *run_->exec;
  static const ExecContext cpu(Device::cpu());
  return cpu;
}

int StageContext::slot_of_input(std::string_view port) const {
  return input_slots_[port_index(schema_->inputs(), port, name_, "input")];
}
int StageContext::slot_of_output(std::string_view port) const {
  return output_slots_[port_index(schema_->outputs(), port, name_, "output")];
}
int StageContext::grad_slot_of_input(std::string_view port) const {
  return plan_->stages[index_]
      .inputs[port_index(schema_->inputs(), port, name_, "input")]
      .grad_slot;
}
int StageContext::grad_slot_of_output(std::string_view port) const {
  return plan_->stages[index_]
      .output_grad_slots[port_index(schema_->outputs(), port, name_, "output")];
}

bool StageContext::input_connected(std::string_view port) const {
  return slot_of_input(port) >= 0;
}

const Shape& StageContext::input_shape(std::string_view port) const {
  int s = slot_of_input(port);
  if (s < 0)
    throw std::logic_error("stage '" + name_ + "': input '" + std::string(port) +
                           "' is not connected");
  return plan_->slots[s].shape;
}
DType StageContext::input_dtype(std::string_view port) const {
  int s = slot_of_input(port);
  if (s < 0)
    throw std::logic_error("stage '" + name_ + "': input '" + std::string(port) +
                           "' is not connected");
  return plan_->slots[s].dtype;
}
void StageContext::declare_output(std::string_view port, const Shape& shape, DType dtype) {
  auto& slot = plan_->slots[slot_of_output(port)];
  slot.shape = shape;
  slot.dtype = dtype;
  slot.declared = true;
}
const Shape& StageContext::output_shape(std::string_view port) const {
  return plan_->slots[slot_of_output(port)].shape;
}
const Params* StageContext::stage_params(std::string_view stage_name) const {
  for (const auto& s : plan_->stages)
    if (s.name == stage_name) return &s.params;
  return nullptr;
}

const Tensor& StageContext::input(const Batch& b, std::string_view port) const {
  const int i = port_index(schema_->inputs(), port, name_, "input");
  const int s = input_slots_[static_cast<size_t>(i)];
  if (s < 0 || !b.slots[s].defined()) {
    // The producer that left it unset is the stage to look at, not this one.
    const PortBinding& from = plan_->stages[index_].inputs[static_cast<size_t>(i)];
    std::string why;
    if (s >= 0 && from.producer >= 0) {
      const PlannedStage& p = plan_->stages[static_cast<size_t>(from.producer)];
      why = ": stage '" + p.name + "' (" + p.schema->kind() + ") did not set its output '" +
            p.schema->outputs()[static_cast<size_t>(from.producer_port)].name + "'";
    }
    throw std::runtime_error("stage '" + name_ + "': input '" + std::string(port) +
                             "' is empty in batch " + std::to_string(b.index) + why);
  }
  return b.slots[s];
}
bool StageContext::has_input(const Batch& b, std::string_view port) const {
  int s = slot_of_input(port);
  return s >= 0 && b.slots[s].defined();
}
void StageContext::set_output(Batch& b, std::string_view port, Tensor t) const {
  const int i = port_index(schema_->outputs(), port, name_, "output");
  const int s = output_slots_[static_cast<size_t>(i)];
  // What its consumers were promised (the port, and the shape and dtype declared at setup): a
  // tensor of another dtype or shape is this stage's error, not theirs when they read it.
  if (t.defined()) {
    const PortSpec& spec = schema_->outputs()[static_cast<size_t>(i)];
    const SlotInfo& slot = plan_->slots[static_cast<size_t>(s)];
    std::string promised;
    if (slot.declared) {
      // The leading (batch, window) sizes may differ from setup's (a policy's games a call, a
      // stage run on another shape); the width of a row of features (the last dimension of a
      // tensor of rank 3 or more: (B, W) tensors have no such width) may not.
      const int r = slot.shape.rank();
      const bool same = t.dtype() == slot.dtype && t.shape().rank() == r &&
                        (r < 3 || slot.shape[r - 1] < 0 || slot.shape[r - 1] == t.shape()[r - 1]);
      if (!same)
        promised = std::string(dtype_name(slot.dtype)) + slot.shape.str() + " declared at setup";
    } else if ((spec.dtype && t.dtype() != *spec.dtype) ||
               (spec.rank >= 0 && t.shape().rank() != spec.rank)) {
      promised = std::string(spec.dtype ? dtype_name(*spec.dtype) : "any dtype") + ", " +
                 (spec.rank < 0 ? "any rank" : "rank " + std::to_string(spec.rank)) +
                 " by its schema";
    }
    if (!promised.empty())
      throw std::runtime_error("stage '" + name_ + "': output '" + std::string(port) + "' is " +
                               t.describe() + " in batch " + std::to_string(b.index) + ", not " +
                               promised + " (" + schema_->kind() + ")");
  }
  b.slots[s] = std::move(t);
}
const Tensor& StageContext::output(const Batch& b, std::string_view port) const {
  return b.slots[slot_of_output(port)];
}
bool StageContext::output_bf16_copy_wanted(std::string_view port) const {
  return run_->precision == Precision::bf16 && run_->bf16_copies &&
         plan_->slots[static_cast<size_t>(slot_of_output(port))].bf16_copy >= 0;
}
void StageContext::set_output_bf16_copy(Batch& b, std::string_view port, Tensor t) const {
  const int copy = plan_->slots[static_cast<size_t>(slot_of_output(port))].bf16_copy;
  if (copy < 0 || run_->precision != Precision::bf16 || !run_->bf16_copies)
    throw std::logic_error("stage '" + name_ + "': output '" + std::string(port) +
                           "' has no reader of a bf16 copy (output_bf16_copy_wanted)");
  if (t.dtype() != DType::bf16)
    throw std::logic_error("stage '" + name_ + "': the bf16 copy of '" + std::string(port) +
                           "' is " + std::string(dtype_name(t.dtype())));
  b.slots[static_cast<size_t>(copy)] = std::move(t);
}
const Tensor* StageContext::input_bf16_copy(const Batch& b, std::string_view port) const {
  const int s = slot_of_input(port);
  if (s < 0) return nullptr;
  const int copy = plan_->slots[static_cast<size_t>(s)].bf16_copy;
  if (copy < 0 || !b.slots[static_cast<size_t>(copy)].defined()) return nullptr;
  const Tensor& c = b.slots[static_cast<size_t>(copy)];
  const Tensor& t = b.slots[static_cast<size_t>(s)];
  if (c.numel() != t.numel() || c.device() != t.device())
    throw std::logic_error("stage '" + name_ + "': input '" + std::string(port) + "''s bf16 copy " +
                           c.describe() + " does not match " + t.describe());
  return &c;
}
const Tensor& StageContext::output_grad(const Batch& b, std::string_view port) const {
  return b.slots[grad_slot_of_output(port)];
}
void StageContext::add_input_grad(Batch& b, std::string_view port, const Tensor& grad) const {
  int s = grad_slot_of_input(port);
  if (s < 0) return;
  // A gradient has its input's shape: a wrong one is this stage's error, not the producer's
  // that receives it.
  if (const int in = slot_of_input(port);
      in >= 0 && b.slots[in].defined() && grad.defined() && !(b.slots[in].shape() == grad.shape()))
    throw std::runtime_error("stage '" + name_ + "': the gradient of input '" + std::string(port) +
                             "' is " + grad.describe() + ", not the input's shape " +
                             b.slots[in].shape().str() + " (" + schema_->kind() + ")");
  Tensor& dst = b.slots[s];
  if (!dst.defined()) {
    dst = grad;
    return;
  }
  // Two consumers of one tensor: their gradients add, into a buffer of the batch's own (never
  // one a consumer still owns), from the pool on the run's stream (reused step after step).
  if (dst.dtype() != DType::f32 || grad.dtype() != DType::f32 || !(dst.shape() == grad.shape()) ||
      dst.device() != grad.device())
    throw std::runtime_error("stage '" + name_ + "': cannot add gradients for input '" +
                             std::string(port) + "': " + dst.describe() + " vs " + grad.describe());
  void* stream = exec().stream();
  Tensor sum = Tensor::empty(dst.shape(), DType::f32, dst.device(),
                             "sum of two consumers' gradients", stream);
  add_f32(dst, grad, sum, stream);
  dst = sum;
}
void StageContext::metric(std::string_view name, double value, MetricKind kind,
                          double weight) const {
  if (run_->metric_sink) run_->metric_sink(name, value, kind, weight);
}

void StageContext::log(const std::string& line, bool every_rank) const {
  if (run_->log_sink)
    run_->log_sink(name_, line, every_rank);
  else
    std::cerr << name_ << ": " << line << "\n";
}

std::vector<Tensor*> StageContext::passthrough_tensors(Batch& b) const {
  std::vector<Tensor*> out;
  for (int slot : plan_->stages[index_].passthrough_slots)
    if (b.slots[slot].defined()) out.push_back(&b.slots[slot]);
  return out;
}

std::vector<std::pair<std::string, Stage*>> StageContext::upstream_stages() const {
  std::vector<std::pair<std::string, Stage*>> out;
  std::set<int> seen;
  std::deque<int> queue(plan_->stages[index_].upstream.begin(),
                        plan_->stages[index_].upstream.end());
  while (!queue.empty()) {
    int u = queue.front();
    queue.pop_front();
    if (!seen.insert(u).second) continue;
    out.emplace_back(plan_->stages[u].name, plan_->instances[u]);
    for (int uu : plan_->stages[u].upstream) queue.push_back(uu);
  }
  return out;
}

std::vector<std::pair<std::string, Parameter*>> StageContext::upstream_parameters() const {
  std::vector<std::pair<std::string, Parameter*>> out;
  auto ups = upstream_stages();
  // Graph order (not nearest-first) so names come out in a stable, readable order.
  std::sort(ups.begin(), ups.end(), [&](const auto& a, const auto& b) {
    int ia = 0, ib = 0;
    for (size_t k = 0; k < plan_->stages.size(); ++k) {
      if (plan_->stages[k].name == a.first) ia = static_cast<int>(k);
      if (plan_->stages[k].name == b.first) ib = static_cast<int>(k);
    }
    return ia < ib;
  });
  for (auto& [name, stage] : ups)
    for (Parameter* p : stage->parameters()) out.emplace_back(name + "." + p->name, p);
  return out;
}

void StageContext::gradients_ready(std::span<Parameter* const> params) const {
  for (auto& [stage, listener] : run_->gradient_listeners) listener(params);
}

void StageContext::on_gradients_ready(
    std::function<void(std::span<Parameter* const>)> listener) const {
  run_->gradient_listeners[index_] = std::move(listener);
}

bool StageContext::gradients_heard() const {
  return !run_->gradient_listeners.empty();
}

namespace {

void require_role(const StageContext& ctx, StageRole role, const char* what) {
  if (ctx.schema().stage_role() != role)
    throw std::logic_error("stage '" + ctx.name() + "' (role " +
                           std::string(stage_role_name(ctx.schema().stage_role())) + ") " + what +
                           ": only a stage of role " + std::string(stage_role_name(role)) +
                           " does");
}

}  // namespace

void StageContext::declare_source_batches(uint64_t batches) const {
  require_role(*this, StageRole::source, "declared the run's batches");
  run_->source_batches = batches;
}

void StageContext::declare_validation_per_rank() const {
  require_role(*this, StageRole::source, "declared a validation split per rank");
  run_->validation_per_rank = true;
}

void StageContext::declare_gradients_averaged() const {
  require_role(*this, StageRole::update, "declared the gradients averaged over the ranks");
  run_->gradients_averaged_over_ranks = true;
}

void StageContext::share_optimizer_state(std::shared_ptr<OptimizerShard> shard) const {
  require_role(*this, StageRole::update, "split the optimizer's state over the ranks");
  run_->optimizer_shard = std::move(shard);
}

const std::shared_ptr<OptimizerShard>& StageContext::optimizer_shard() const {
  return run_->optimizer_shard;
}

uint64_t StageContext::seed() const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, mixed with the run seed
  for (char c : name_) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  uint64_t z = h ^ (run_->seed + 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace slipstream
