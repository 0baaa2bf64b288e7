// melee_embedding: the loader's game-state tensors -> one feature vector per frame, x (B, W, E).
// Per slot: numeric features × kNumericScale, learned action and character embeddings (zero where
// the slot does not exist); then a stage embedding and the previous controller; zero-padded to a
// multiple of 8. Training-only augmentation: left-right mirroring per window (published as
// `mirrored` so bc_loss mirrors the x-stick labels alike) and Gaussian noise on numeric features.
// The stage takes no label tensor at all, so the label cannot leak into the features.
// Math: model_math.h; layout and choices: docs/melee_features.md. On a device (CUDA, or the
// emulator) the same math runs as melee_kernels.h's kernels on the run's stream, the mirror and
// noise draws included (the same counter-based hashes); ids there are not checked per batch
// (the loader clamps them; an id out of range gives a zero row, as a missing slot does).
#include <cmath>
#include <random>

#include "engine/registry.h"
#include "stages/melee/melee_kernels.h"
#include "stages/melee/model_math.h"
#include "stages/nn/param_store.h"
#include "stages/ops/with_ops.h"

namespace slipstream {
namespace {

using namespace melee;

uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Counter-based, so any element's draw depends only on (key, index): deterministic for a batch
// whatever the thread count, and exact on resume.
double uniform01(uint64_t key, uint64_t i) {
  return static_cast<double>(mix64(key + i) >> 11) * 0x1p-53;
}
double gaussian(uint64_t key, uint64_t i) {
  const double u1 = 1.0 - uniform01(key, 2 * i);  // (0, 1]
  const double u2 = uniform01(key, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void check_ids(const Tensor& t, int32_t limit, const char* port, const std::string& stage) {
  const int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] < 0 || p[i] >= limit)
      throw std::runtime_error("melee_embedding '" + stage + "': " + port + " id " +
                               std::to_string(p[i]) + " at element " + std::to_string(i) +
                               " is outside [0, " + std::to_string(limit) + ")");
}

// The device path: kernels and workspace of one backend.
class EmbedDevice {
 public:
  virtual ~EmbedDevice() = default;
  virtual void forward(size_t rows, size_t window, size_t windows, const float* numeric,
                       const int32_t* action, const int32_t* character, const int32_t* stage,
                       const float* prev, bool mirror, uint64_t key, float noise_sd,
                       const float* tables, uint8_t* mirrored, float* out) = 0;
  virtual void backward(size_t rows, const float* numeric, const int32_t* action,
                        const int32_t* character, const int32_t* stage, const float* dout,
                        float* dtables) = 0;
};

// Offsets of the three tables in the stage's store.
struct TableOffsets {
  size_t action = 0, character = 0, stage = 0;
};

template <class Ops>
class EmbedDeviceOn final : public EmbedDevice {
  using K = typename Ops::Table;

 public:
  EmbedDeviceOn(Ops ops, const ExecContext& exec, const EmbedLayout& L, TableOffsets off)
      : dims_(embed_dims<typename K::EmbedDims>(L)), off_(off), o_(ops), exec_(exec) {
    key_ = o_.template alloc<uint8_t>(sizeof(uint64_t), "melee_embedding batch key");
  }

  void forward(size_t rows, size_t window, size_t windows, const float* numeric,
               const int32_t* action, const int32_t* character, const int32_t* stage,
               const float* prev, bool mirror, uint64_t key, float noise_sd, const float* tables,
               uint8_t* mirrored, float* out) override {
    // The batch's key reaches the kernels through device memory, in stream order: the step's
    // launches are then the same from batch to batch, as a CUDA graph of the step needs.
    const auto* k = reinterpret_cast<const uint64_t*>(key_.raw());
    exec_.upload_later(key_.raw(), &key, sizeof key);
    K::embed_mirror_flags(mirrored, windows, k, mirror ? 1 : 0, o_.stream());
    K::embed_forward(dims_, rows, window, numeric, action, character, stage, prev, mirrored,
                     tables + off_.action, tables + off_.character, tables + off_.stage, out,
                     o_.stream());
    if (noise_sd > 0) K::embed_add_noise(dims_, rows, numeric, k, noise_sd, out, o_.stream());
  }

  void backward(size_t rows, const float* numeric, const int32_t* action, const int32_t* character,
                const int32_t* stage, const float* dout, float* dtables) override {
    const size_t bytes = K::embed_backward_workspace_bytes(dims_, rows);
    if (!ws_.defined() || ws_.nbytes() < bytes)
      ws_ = o_.template alloc<uint8_t>(std::max<size_t>(bytes, 1), "melee_embedding workspace");
    K::embed_backward(dims_, rows, numeric, action, character, stage, dout, dtables + off_.action,
                      dtables + off_.character, dtables + off_.stage, ws_.raw(), o_.stream());
  }

 private:
  typename K::EmbedDims dims_;
  TableOffsets off_;
  Ops o_;
  const ExecContext& exec_;
  Tensor ws_, key_;
};

}  // namespace

class MeleeEmbeddingStage : public Stage {
 public:
  static StageSchema schema() {
    return StageSchema("melee_embedding")
        .family("melee")
        .streaming(Streaming::per_position)
        .doc(
            "Melee game state (stages/melee/batch_layout.h) -> per-frame features x (B, W, E), E % "
            "8 == 0.")
        .trainable()
        .input("numeric", DType::f32, 4, "(B, W, 3, 18) raw numeric features per slot")
        .input("action", DType::i32, 3, "(B, W, 3) action state ids")
        .input("character", DType::i32, 3, "(B, W, 3) character ids")
        .input("stage", DType::i32, 2, "(B, W) stage id")
        .input("prev_controller", DType::f32, 3, "(B, W, 13) the player's last controller input")
        .output("x", DType::f32, 3, "(B, W, E) features, zero-padded to a multiple of 8")
        .output("mirrored", DType::u8, 1,
                "(B) 1 where the window was mirrored left-right (for bc_loss)")
        .param("action_dim", int64_t{32}, "width of the action-state embedding (399 rows)")
        .range(1, 4096)
        .param("character_dim", int64_t{8}, "width of the character embedding (33 rows)")
        .range(1, 4096)
        .param("stage_dim", int64_t{4}, "width of the stage embedding (64 rows)")
        .range(1, 4096)
        .param("init_scale", 0.1, "tables start as normal(0, 1) * init_scale")
        .range(0, std::nullopt)
        .param("mirror", false, "training only: mirror each window left-right with probability 0.5")
        .param("noise", 0.0,
               "training only: std of Gaussian noise on the normalised numeric features")
        .range(0, std::nullopt);
  }

  void setup(StageContext& ctx) override {
    const Params& p = ctx.params();
    layout_.action_dim = static_cast<int>(p.integer("action_dim"));
    layout_.character_dim = static_cast<int>(p.integer("character_dim"));
    layout_.stage_dim = static_cast<int>(p.integer("stage_dim"));
    mirror_ = p.boolean("mirror");
    noise_ = p.number("noise");

    const Shape& ns = ctx.input_shape("numeric");
    expect(ctx, "numeric", {-2, -2, kSlots, kNumericFeatures});
    expect(ctx, "action", {ns[0], ns[1], kSlots});
    expect(ctx, "character", {ns[0], ns[1], kSlots});
    expect(ctx, "stage", {ns[0], ns[1]});
    expect(ctx, "prev_controller", {ns[0], ns[1], kControllerFeatures});
    // Copy dimensions through operator[]: a batch size known only per batch stays -1.
    Shape xs{1, 1, layout_.width()}, ms{1};
    xs[0] = ms[0] = ns[0];
    xs[1] = ns[1];
    ctx.declare_output("x", xs, DType::f32);
    ctx.declare_output("mirrored", ms, DType::u8);

    // Lookup tables: no weight decay, which would shrink rare states' rows towards zero.
    nn::ParamLayout tables;
    off_.action = tables.add("action_table.weight", {kActionStates, layout_.action_dim}, false);
    off_.character =
        tables.add("character_table.weight", {kCharacters, layout_.character_dim}, false);
    off_.stage = tables.add("stage_table.weight", {kStages, layout_.stage_dim}, false);
    device_ = ctx.exec().device();
    store_.allocate(tables, false, device_, ctx.run().param_arena.get());
    const double scale = p.number("init_scale");
    store_.initialize([&](float* w) {  // normal(0, 1) * scale, table by table from one stream
      std::mt19937_64 rng(ctx.seed());
      for (const auto& t : tables.slots()) {
        std::normal_distribution<double> nd(0.0, 1.0);
        for (size_t i = 0; i < t.numel; ++i) w[t.offset + i] = static_cast<float>(nd(rng) * scale);
      }
    });
    dev_ = ops::make_device_path<EmbedDevice, EmbedDeviceOn, MeleeKernelFamily>(
        ctx.exec(), "melee_embedding '" + ctx.name() + "'", ctx.exec(), layout_, off_);
    if (ns[0] > 0 && ns[1] > 0) reserve(ns[0], ns[1]);
  }

  void forward(Batch& b, StageContext& ctx) override {
    const Tensor& numeric = ctx.input(b, "numeric");
    const Tensor& action = ctx.input(b, "action");
    const Tensor& character = ctx.input(b, "character");
    const Tensor& stage = ctx.input(b, "stage");
    const Tensor& prev = ctx.input(b, "prev_controller");
    const int64_t B = numeric.dim(0), W = numeric.dim(1);
    if (numeric.device() != device_ || numeric.dim(2) != kSlots ||
        numeric.dim(3) != kNumericFeatures || action.numel() != B * W * kSlots ||
        character.numel() != B * W * kSlots || stage.numel() != B * W ||
        prev.numel() != B * W * kControllerFeatures)
      throw std::runtime_error("melee_embedding '" + ctx.name() +
                               "': inconsistent inputs in batch " + std::to_string(b.index) +
                               ": numeric " + numeric.describe() + ", action " + action.describe() +
                               ", character " + character.describe() + ", stage " +
                               stage.describe() + ", prev_controller " + prev.describe());
    reserve(B, W);
    const bool training = ctx.run().training;
    const uint64_t key = mix64(ctx.seed() ^ mix64(b.index * 0x100000001B3ull + b.epoch));
    const size_t rows = static_cast<size_t>(B * W);
    if (dev_) {
      dev_->forward(rows, static_cast<size_t>(W), static_cast<size_t>(B), numeric.data<float>(),
                    action.data<int32_t>(), character.data<int32_t>(), stage.data<int32_t>(),
                    prev.data<float>(), training && mirror_, key,
                    training ? static_cast<float>(noise_) : 0.0f, store_.values(),
                    mirrored_.data<uint8_t>(), x_.data<float>());
      publish(b, ctx, B, W);
      return;
    }
    check_ids(action, kActionStates, "action", ctx.name());
    check_ids(character, kCharacters, "character", ctx.name());
    check_ids(stage, kStages, "stage", ctx.name());
    uint8_t* m = mirrored_.data<uint8_t>();
    for (int64_t w = 0; w < B; ++w)
      m[w] = (training && mirror_)
                 ? static_cast<uint8_t>(mix64(key + static_cast<uint64_t>(w)) >> 63)
                 : 0;

    float* out = x_.data<float>();
    const float* t = store_.values();
    embed_forward<float>(layout_, rows, static_cast<size_t>(W), numeric.data<float>(),
                         action.data<int32_t>(), character.data<int32_t>(), stage.data<int32_t>(),
                         prev.data<float>(), m, t + off_.action, t + off_.character, t + off_.stage,
                         out);
    if (training && noise_ > 0)
      add_noise(numeric.data<float>(), rows, mix64(key ^ kEmbedNoiseSalt), out);
    publish(b, ctx, B, W);
  }

  void backward(Batch& b, StageContext& ctx) override {
    const Tensor& g = ctx.output_grad(b, "x");
    if (!g.defined()) return;
    const Tensor& numeric = ctx.input(b, "numeric");
    const size_t rows = static_cast<size_t>(numeric.dim(0) * numeric.dim(1));
    if (g.numel() != static_cast<int64_t>(rows) * layout_.width())
      throw std::runtime_error("melee_embedding '" + ctx.name() + "': gradient " + g.describe() +
                               " does not match x of batch " + std::to_string(b.index));
    const int32_t* action = ctx.input(b, "action").data<int32_t>();
    const int32_t* character = ctx.input(b, "character").data<int32_t>();
    const int32_t* stage = ctx.input(b, "stage").data<int32_t>();
    float* d = store_.grads();
    if (dev_)
      dev_->backward(rows, numeric.data<float>(), action, character, stage, g.data<float>(), d);
    else
      embed_backward<float>(layout_, rows, numeric.data<float>(), action, character, stage,
                            g.data<float>(), d + off_.action, d + off_.character, d + off_.stage);
  }

  std::vector<Parameter*> parameters() override { return store_.pointers(); }

 private:
  void publish(Batch& b, StageContext& ctx, int64_t B, int64_t W) {
    ctx.set_output(b, "x", x_.slice_rows(0, B * W).reshape(Shape{B, W, layout_.width()}));
    ctx.set_output(b, "mirrored", mirrored_.slice_rows(0, B));
  }

  // want: -2 = any size (batch and window), -1 in the declared shape = known per batch only.
  static void expect(StageContext& ctx, const char* port, std::initializer_list<int64_t> want) {
    const Shape& s = ctx.input_shape(port);
    bool ok = s.rank() == static_cast<int>(want.size());
    int i = 0;
    for (int64_t d : want) {
      if (ok && d >= 0 && s[i] >= 0 && s[i] != d) ok = false;
      ++i;
    }
    if (!ok) {
      std::string w = "[";
      for (int64_t d : want)
        w += (w.size() > 1 ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
      throw std::runtime_error("melee_embedding '" + ctx.name() + "': input '" + port + "' is " +
                               s.str() + ", expected " + w + "] (stages/melee/batch_layout.h)");
    }
  }

  // Buffers grow to the largest batch seen; steady state allocates nothing.
  void reserve(int64_t B, int64_t W) {
    if (B * W > rows_cap_) {
      rows_cap_ = B * W;
      x_ = Tensor::empty(Shape{rows_cap_, layout_.width()}, DType::f32, device_,
                         "melee_embedding x");
    }
    if (B > windows_cap_) {
      windows_cap_ = B;
      mirrored_ =
          Tensor::zeros(Shape{windows_cap_}, DType::u8, device_, "melee_embedding mirrored");
    }
  }

  // Noise on the normalised numeric columns of existing slots (absent slots stay exactly zero).
  void add_noise(const float* numeric, size_t rows, uint64_t key, float* out) const {
    const size_t E = static_cast<size_t>(layout_.width());
    const float sd = static_cast<float>(noise_);
    kernels::parallel_blocks(rows, 64 * kSlots * kNumericFeatures, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r)
        for (int s = 0; s < kSlots; ++s) {
          const size_t rs = r * kSlots + static_cast<size_t>(s);
          if (!slot_exists(numeric + rs * kNumericFeatures)) continue;
          float* o = out + r * E + layout_.slot_offset(s);
          for (int f = 0; f < kNumericFeatures; ++f)
            o[f] += sd * static_cast<float>(
                             gaussian(key, rs * kNumericFeatures + static_cast<size_t>(f)));
        }
    });
  }

  EmbedLayout layout_;
  bool mirror_ = false;
  double noise_ = 0;
  nn::ParamStore store_;  // the three tables
  TableOffsets off_;
  Device device_;
  std::unique_ptr<EmbedDevice> dev_;  // null on the CPU
  Tensor x_, mirrored_;
  int64_t rows_cap_ = 0, windows_cap_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(MeleeEmbeddingStage);

}  // namespace slipstream
