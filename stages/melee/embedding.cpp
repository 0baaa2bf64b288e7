// melee_embedding: the loader's game-state tensors -> one feature vector per frame, x (B, W, E).
// Per slot: numeric features × kNumericScale, learned action and character embeddings (zero where
// the slot does not exist); then a stage embedding and the previous controller (its analog values
// and, with prev_classes, its stick and shoulder classes one-hot); zero-padded to a multiple of 8.
// Training-only augmentation: left-right mirroring per window (published as `mirrored` so bc_loss
// mirrors the x-stick labels alike) and Gaussian noise on numeric features. The stage takes no
// label tensor at all, so the label cannot leak into the features. Math: model_math.h; layout and
// choices: docs/melee_features.md. On a device (CUDA, or the emulator) the same math runs as
// melee_kernels.h's kernels on the run's stream, the mirror and noise draws included (the same
// counter-based hashes); ids there are not checked per batch (the loader clamps them; an id out of
// range gives a zero row, as a missing slot does).
#include <cmath>
#include <random>

#include "engine/registry.h"
#include "kernels/bf16.h"
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

// One batch's inputs as the embedding's paths read them.
struct EmbedBatch {
  size_t rows = 0, window = 0, windows = 0;  // rows = windows · window
  const float* numeric = nullptr;
  const int32_t* action = nullptr;
  const int32_t* character = nullptr;
  const int32_t* stage = nullptr;
  const float* prev = nullptr;
  const float* continues = nullptr;  // (windows) 1: the window continues the row's game; or null
};

// Offsets of the three tables in the stage's store.
struct TableOffsets {
  size_t action = 0, character = 0, stage = 0;
};

// The stage's math on one backend, built once in setup by ops::with_ops: EmbedOnCpu (the
// reference, ids checked per batch) or EmbedOnDevice<Ops> (the Melee kernels on the ops' stream).
class EmbedPath {
 public:
  virtual ~EmbedPath() = default;
  // x (rows, E) into `out`, its previous-input columns into `prev` (rows, P) and the windows'
  // mirror flags into `mirrored`; `key` is the batch's draw key (mirror flags, noise). out_bf and
  // prev_bf (may be null) receive the bf16 copies of out and prev (fp32_to_bf16's rounding).
  virtual void forward(const EmbedBatch& in, bool mirror, uint64_t key, float noise_sd,
                       const float* tables, uint8_t* mirrored, float* out, float* prev,
                       uint16_t* out_bf, uint16_t* prev_bf) = 0;
  // Table gradients (+=) from dout (rows, E).
  virtual void backward(const EmbedBatch& in, const float* dout, float* dtables) = 0;
};

class EmbedOnCpu final : public EmbedPath {
 public:
  EmbedOnCpu(const EmbedLayout& L, TableOffsets off, std::string who)
      : layout_(L), off_(off), who_(std::move(who)) {}

  void forward(const EmbedBatch& in, bool mirror, uint64_t key, float noise_sd, const float* tables,
               uint8_t* mirrored, float* out, float* prev, uint16_t* out_bf,
               uint16_t* prev_bf) override {
    const size_t slots = in.rows * kSlots;
    check_ids(in.action, slots, kActionStates, "action");
    check_ids(in.character, slots, kCharacters, "character");
    check_ids(in.stage, in.rows, kStages, "stage");
    for (size_t w = 0; w < in.windows; ++w) {
      if (mirror && in.continues && in.continues[w] > 0.5f) continue;  // the game's flag stays
      mirrored[w] = mirror ? static_cast<uint8_t>(mix64(key + static_cast<uint64_t>(w)) >> 63) : 0;
    }
    embed_forward<float>(layout_, in.rows, in.window, in.numeric, in.action, in.character, in.stage,
                         in.prev, mirrored, tables + off_.action, tables + off_.character,
                         tables + off_.stage, out);
    if (noise_sd > 0) add_noise(in.numeric, in.rows, mix64(key ^ kEmbedNoiseSalt), noise_sd, out);
    const size_t E = static_cast<size_t>(layout_.width()),
                 P = static_cast<size_t>(layout_.prev_input_width());
    for (size_t r = 0; r < in.rows; ++r)
      std::copy_n(out + r * E + layout_.controller_offset(), P, prev + r * P);
    if (out_bf) kernels::fp32_to_bf16(out, out_bf, in.rows * E);
    if (prev_bf) kernels::fp32_to_bf16(prev, prev_bf, in.rows * P);
  }

  void backward(const EmbedBatch& in, const float* dout, float* dtables) override {
    embed_backward<float>(layout_, in.rows, in.numeric, in.action, in.character, in.stage, dout,
                          dtables + off_.action, dtables + off_.character, dtables + off_.stage);
  }

 private:
  void check_ids(const int32_t* p, size_t n, int32_t limit, const char* port) const {
    for (size_t i = 0; i < n; ++i)
      if (p[i] < 0 || p[i] >= limit)
        throw std::runtime_error(who_ + ": " + port + " id " + std::to_string(p[i]) +
                                 " at element " + std::to_string(i) + " is outside [0, " +
                                 std::to_string(limit) + ")");
  }

  // Noise on the normalised numeric columns of existing slots (absent slots stay exactly zero).
  void add_noise(const float* numeric, size_t rows, uint64_t key, float sd, float* out) const {
    const size_t E = static_cast<size_t>(layout_.width());
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
  TableOffsets off_;
  std::string who_;
};

template <class Ops>
class EmbedOnDevice final : public EmbedPath {
  using K = typename Ops::Table;

 public:
  EmbedOnDevice(Ops ops, const ExecContext& exec, const EmbedLayout& L, TableOffsets off)
      : dims_(embed_dims<typename K::EmbedDims>(L)), layout_(L), off_(off), o_(ops), exec_(exec) {
    key_ = o_.template alloc<uint8_t>(sizeof(uint64_t), "melee_embedding batch key");
  }

  void forward(const EmbedBatch& in, bool mirror, uint64_t key, float noise_sd, const float* tables,
               uint8_t* mirrored, float* out, float* prev, uint16_t* out_bf,
               uint16_t* prev_bf) override {
    // The batch's key reaches the kernels through device memory, in stream order: the step's
    // launches are then the same from batch to batch, as a CUDA graph of the step needs. Without
    // draws (no mirroring, no noise: validation, inference) no kernel reads it, and a frame has
    // no upload for it.
    const auto* k = reinterpret_cast<const uint64_t*>(key_.raw());
    if (mirror || noise_sd > 0) exec_.upload_later(key_.raw(), &key, sizeof key);
    const typename K::MirrorDraw draw{mirrored, k, in.continues, mirror ? 1 : 0};
    K::embed_forward(dims_, in.rows, in.window, in.numeric, in.action, in.character, in.stage,
                     in.prev, draw, tables + off_.action, tables + off_.character,
                     tables + off_.stage, out, prev, bf(out_bf), bf(prev_bf), o_.stream());
    if (noise_sd > 0)
      K::embed_add_noise(dims_, in.rows, in.numeric, k, noise_sd, out, bf(out_bf), o_.stream());
  }

  void backward(const EmbedBatch& in, const float* dout, float* dtables) override {
    const size_t bytes = K::embed_backward_workspace_bytes(dims_, in.rows);
    if (!ws_.defined() || ws_.nbytes() < bytes)
      ws_ = o_.template alloc<uint8_t>(std::max<size_t>(bytes, 1), "melee_embedding workspace");
    K::embed_backward(dims_, in.rows, in.numeric, in.action, in.character, in.stage, dout,
                      dtables + off_.action, dtables + off_.character, dtables + off_.stage,
                      ws_.raw(), o_.stream());
  }

 private:
  static kernels::bfloat16* bf(uint16_t* p) { return reinterpret_cast<kernels::bfloat16*>(p); }

  typename K::EmbedDims dims_;
  EmbedLayout layout_;
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
        .optional_input("continues", DType::f32, 1,
                        "(B) the loader's: a window that continues its row's game keeps the "
                        "game's mirror flag (rows: streams)")
        .output("x", DType::f32, 3, "(B, W, E) features, zero-padded to a multiple of 8")
        .output("prev_input", DType::f32, 3,
                "(B, W, P) the previous-input columns of x (the controller's 13, then with "
                "prev_classes its 73 class columns): controller_heads' direct path")
        .output("mirrored", DType::u8, 1,
                "(B) 1 where the window was mirrored left-right (for bc_loss)")
        .param("action_dim", int64_t{32}, "width of the action-state embedding (399 rows)")
        .range(1, 4096)
        .param("character_dim", int64_t{8}, "width of the character embedding (33 rows)")
        .range(1, 4096)
        .param("stage_dim", int64_t{4}, "width of the stage embedding (64 rows)")
        .range(1, 4096)
        .param("prev_classes", true,
               "also give the previous input in the heads' terms: each stick axis's and the "
               "shoulder's class one-hot (73 columns; false: the analog values alone, as models "
               "before this feature)")
        .in_older_runs(false)
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
    layout_.prev_classes = p.boolean("prev_classes");
    mirror_ = p.boolean("mirror");
    noise_ = p.number("noise");
    // The bf16 copies the stages after this one read (the core's input projection, the heads'
    // direct path) under precision bf16: written by the embedding itself, no cast launch there.
    copy_x_ = ctx.output_bf16_copy_wanted("x");
    copy_prev_ = ctx.output_bf16_copy_wanted("prev_input");

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
    Shape ps = xs;
    ps[2] = layout_.prev_input_width();
    ctx.declare_output("prev_input", ps, DType::f32);
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
    const std::string who = "melee_embedding '" + ctx.name() + "'";
    path_ = ops::with_ops<MeleeKernelFamily>(
        ctx.exec(), who, [&](auto o) -> std::unique_ptr<EmbedPath> {
          using Ops = decltype(o);
          if constexpr (Ops::kBackend == KernelBackend::cpu)
            return std::make_unique<EmbedOnCpu>(layout_, off_, who);
          else
            return std::make_unique<EmbedOnDevice<Ops>>(o, ctx.exec(), layout_, off_);
        });
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
    path_->forward(batch_of(ctx, b), training && mirror_, key,
                   training ? static_cast<float>(noise_) : 0.0f, store_.values(),
                   mirrored_.data<uint8_t>(), x_.data<float>(), prev_.data<float>(),
                   copy_x_ ? x_bf_.data<uint16_t>() : nullptr,
                   copy_prev_ ? prev_bf_.data<uint16_t>() : nullptr);
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
    path_->backward(batch_of(ctx, b), g.data<float>(), store_.grads());
  }

  std::vector<Parameter*> parameters() override { return store_.pointers(); }

 private:
  static EmbedBatch batch_of(const StageContext& ctx, const Batch& b) {
    const Tensor& numeric = ctx.input(b, "numeric");
    EmbedBatch in;
    in.windows = static_cast<size_t>(numeric.dim(0));
    in.window = static_cast<size_t>(numeric.dim(1));
    in.rows = in.windows * in.window;
    in.numeric = numeric.data<float>();
    in.action = ctx.input(b, "action").data<int32_t>();
    in.character = ctx.input(b, "character").data<int32_t>();
    in.stage = ctx.input(b, "stage").data<int32_t>();
    in.prev = ctx.input(b, "prev_controller").data<float>();
    if (ctx.input_connected("continues")) {
      const Tensor& c = ctx.input(b, "continues");
      if (c.numel() != numeric.dim(0) || c.dtype() != DType::f32)
        throw std::runtime_error("melee_embedding '" + ctx.name() +
                                 "': continues must be (B) f32, " + "got " + c.describe());
      in.continues = c.data<float>();
    }
    return in;
  }

  void publish(Batch& b, StageContext& ctx, int64_t B, int64_t W) {
    ctx.set_output(b, "x", x_.slice_rows(0, B * W).reshape(Shape{B, W, layout_.width()}));
    ctx.set_output(b, "prev_input",
                   prev_.slice_rows(0, B * W).reshape(Shape{B, W, layout_.prev_input_width()}));
    ctx.set_output(b, "mirrored", mirrored_.slice_rows(0, B));
    if (copy_x_)
      ctx.set_output_bf16_copy(b, "x",
                               x_bf_.slice_rows(0, B * W).reshape(Shape{B, W, layout_.width()}));
    if (copy_prev_)
      ctx.set_output_bf16_copy(
          b, "prev_input",
          prev_bf_.slice_rows(0, B * W).reshape(Shape{B, W, layout_.prev_input_width()}));
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
      prev_ = Tensor::empty(Shape{rows_cap_, layout_.prev_input_width()}, DType::f32, device_,
                            "melee_embedding prev_input");
      if (copy_x_)
        x_bf_ = Tensor::empty(Shape{rows_cap_, layout_.width()}, DType::bf16, device_,
                              "melee_embedding x (bf16 copy)");
      if (copy_prev_)
        prev_bf_ = Tensor::empty(Shape{rows_cap_, layout_.prev_input_width()}, DType::bf16, device_,
                                 "melee_embedding prev_input (bf16 copy)");
    }
    if (B > windows_cap_) {
      windows_cap_ = B;
      mirrored_ =
          Tensor::zeros(Shape{windows_cap_}, DType::u8, device_, "melee_embedding mirrored");
    }
  }

  EmbedLayout layout_;
  bool mirror_ = false, copy_x_ = false, copy_prev_ = false;
  double noise_ = 0;
  nn::ParamStore store_;  // the three tables
  TableOffsets off_;
  Device device_;
  std::unique_ptr<EmbedPath> path_;              // the CPU or the device form
  Tensor x_, prev_, mirrored_, x_bf_, prev_bf_;  // the copies: where a stage after reads them
  int64_t rows_cap_ = 0, windows_cap_ = 0;
};
SLIPSTREAM_REGISTER_STAGE(MeleeEmbeddingStage);

}  // namespace slipstream
