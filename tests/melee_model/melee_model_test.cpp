// Tests of the Melee model stages: float64 gradient checks of their math (model_math.h), the
// stages against that math, losses and the baseline on hand-computed inputs, mirroring,
// shapes, save/load, and no heap allocation in steady state.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/registry.h"
#include "engine/stage_harness.h"
#include "engine/state_io.h"
#include "stages/melee/batch_layout.h"
#include "stages/melee/controller_choice.h"
#include "stages/melee/model_math.h"
#include "tests/kernels/gradcheck.h"
#include "tests/support/onednn_allocations.h"

// ---- counting global operator new (for the steady-state allocation test) ----
// GCC pairs the inlined malloc with the library's delete and warns; both are ours here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
// Only the test's own thread counts: a TBB worker that first joins a parallel loop late (seen on
// 16 cores, steps after the warm-up) allocates its scheduler's structures once, which is not
// the steady state's business. The stages' loops run chunks on the calling thread too, so an
// allocation per chunk or per batch in our code still counts.
namespace {
std::atomic<bool> g_count_news{false};
std::atomic<uint64_t> g_news{0};
thread_local bool t_counted_thread = false;
}  // namespace
void* operator new(size_t n) {
  if (t_counted_thread && g_count_news.load(std::memory_order_relaxed))
    g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace slipstream {
namespace {

using namespace melee;
using TensorMap = std::map<std::string, Tensor>;

// ---------------------------------------------------------------- helpers

template <class T>
Tensor make(const Shape& s, const std::vector<T>& v) {
  Tensor t = Tensor::empty(s, dtype_of<T>());
  EXPECT_EQ(static_cast<size_t>(t.numel()), v.size());
  std::memcpy(t.raw(), v.data(), t.nbytes());
  return t;
}
template <class T>
std::vector<T> vec(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}
std::vector<double> to_double(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = t.data<float>()[i];
  return out;
}

// Random data, dot products and the finite-difference checker shared with the kernel tests.
using kernels::test::check_gradient;
using kernels::test::dot;
using kernels::test::rand_vec;

void expect_close(const std::vector<double>& want, const Tensor& got, double rtol,
                  const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  double scale = 1e-3;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.data<float>()[i], want[i], rtol * scale) << what << "[" << i << "]";
}

// A random batch in the loader's layout (batch_layout.h).
struct MeleeBatch {
  int64_t B = 0, W = 0;
  std::vector<float> numeric, prev, target_buttons, mask;
  std::vector<int32_t> action, character, stage, target_sticks;

  TensorMap embed_inputs() const {
    return {{"numeric", make(Shape{B, W, kSlots, kNumericFeatures}, numeric)},
            {"action", make(Shape{B, W, kSlots}, action)},
            {"character", make(Shape{B, W, kSlots}, character)},
            {"stage", make(Shape{B, W}, stage)},
            {"prev_controller", make(Shape{B, W, kControllerFeatures}, prev)}};
  }
  TensorMap loss_inputs() const {
    return {{"target_buttons", make(Shape{B, W, kButtons}, target_buttons)},
            {"target_sticks", make(Shape{B, W, kStickHeads}, target_sticks)},
            {"mask", make(Shape{B, W}, mask)},
            {"prev_controller", make(Shape{B, W, kControllerFeatures}, prev)}};
  }
};

MeleeBatch random_batch(int64_t B, int64_t W, std::mt19937_64& rng) {
  MeleeBatch b;
  b.B = B;
  b.W = W;
  const size_t N = static_cast<size_t>(B * W);
  auto v = rand_vec(N * kSlots * kNumericFeatures, rng);
  b.numeric.assign(v.begin(), v.end());
  std::bernoulli_distribution coin(0.5);
  for (size_t r = 0; r < N; ++r)
    for (int s = 0; s < kSlots; ++s) {
      float* f = &b.numeric[(r * kSlots + static_cast<size_t>(s)) * kNumericFeatures];
      f[kX] *= 80;
      f[kFacing] = coin(rng) ? 1.0f : -1.0f;
      f[kExists] = (s < 2 || coin(rng)) ? 1.0f : 0.0f;
    }
  std::uniform_int_distribution<int32_t> act(0, kActionStates - 1), chr(0, kCharacters - 1),
      stg(0, kStages - 1), stick(0, kStickClasses - 1), sh(0, kShoulderClasses - 1);
  for (size_t i = 0; i < N * kSlots; ++i)
    b.action.push_back(act(rng)), b.character.push_back(chr(rng));
  for (size_t i = 0; i < N; ++i) b.stage.push_back(stg(rng));
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t i = 0; i < N; ++i) {
    for (int k = 0; k < kButtons; ++k) b.prev.push_back(coin(rng) ? 1.0f : 0.0f);
    for (int k = 0; k < 4; ++k) b.prev.push_back(u(rng));
    b.prev.push_back((u(rng) + 1) / 2);
    for (int k = 0; k < kButtons; ++k) b.target_buttons.push_back(coin(rng) ? 1.0f : 0.0f);
    for (int h = 0; h < kStickHeads; ++h)
      b.target_sticks.push_back(h == kShoulder ? sh(rng) : stick(rng));
    b.mask.push_back(i % 5 == 3 ? 0.0f : 1.0f);
  }
  return b;
}

// Random logits for the six heads (B, W, width_h).
TensorMap random_logits(int64_t B, int64_t W, std::mt19937_64& rng) {
  TensorMap m;
  for (int h = 0; h < kHeads; ++h) {
    auto v = rand_vec(static_cast<size_t>(B * W * head_width(h)), rng);
    for (auto& x : v) x *= 3;
    m[kHeadNames[h]] = make(Shape{B, W, head_width(h)}, std::vector<float>(v.begin(), v.end()));
  }
  return m;
}

TensorMap merge(TensorMap a, const TensorMap& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

// Drives the stages through their own forward/backward on a batch we lay out like the harness
// does (input i: slots 2i, 2i+1; then outputs), so no test code allocates between calls.
struct Direct {
  StageHarness& h;
  Batch b;
  size_t nin;
  explicit Direct(StageHarness& hh) : h(hh) {
    const auto& s = h.context().schema();
    nin = s.inputs().size();
    b.slots.resize(2 * (nin + s.outputs().size()));
    h.run().metric_sink = [](std::string_view, double, MetricKind, double) {};
  }
  void set_input(const std::string& port, const Tensor& t) {
    const auto& ins = h.context().schema().inputs();
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i].name == port) b.slots[2 * i] = t;
  }
  const Tensor& out(const std::string& port) const { return h.context().output(b, port); }
  const Tensor& in_grad(const std::string& port) const {
    const auto& ins = h.context().schema().inputs();
    for (size_t i = 0; i < ins.size(); ++i)
      if (ins[i].name == port) return b.slots[2 * i + 1];
    throw std::logic_error(port);
  }
  void set_out_grad(size_t o, const Tensor& t) { b.slots[2 * nin + 2 * o + 1] = t; }
  void clear_grads() {
    for (size_t i = 1; i < b.slots.size(); i += 2) b.slots[i] = Tensor();
  }
};

// ---------------------------------------------------------------- melee_embedding

TEST(MeleeEmbedding, SchemaTakesNoLabels) {
  const StageSchema* s = StageRegistry::find("melee_embedding");
  ASSERT_NE(s, nullptr);
  std::set<std::string> ins;
  for (const auto& p : s->inputs()) ins.insert(p.name);
  EXPECT_EQ(ins, (std::set<std::string>{"numeric", "action", "character", "stage",
                                        "prev_controller", "continues"}));
  for (const auto& p : s->inputs()) {
    EXPECT_EQ(p.name.find("target"), std::string::npos);
    EXPECT_NE(p.name, "mask");
  }
  EXPECT_TRUE(s->is_trainable());
  // A label tensor cannot even be wired in.
  std::mt19937_64 rng(1);
  MeleeBatch mb = random_batch(2, 3, rng);
  StageHarness h("melee_embedding", {});
  EXPECT_THROW(h.setup(merge(mb.embed_inputs(), mb.loss_inputs())), std::runtime_error);
}

// The controller features are the input at t + D (prev_controller), never the label at t + D + 1:
// with labels that differ from every feature value, no output column holds them.
TEST(MeleeEmbedding, LabelNeverAmongFeatures) {
  std::mt19937_64 rng(2);
  MeleeBatch mb = random_batch(2, 4, rng);
  for (size_t i = 0; i < mb.mask.size(); ++i) {
    // prev main stick x strictly inside (-0.5, 0.5); the label's main x is full right (class 16).
    mb.prev[i * kControllerFeatures + kButtons + kMainX] =
        0.25f * mb.prev[i * kControllerFeatures + kButtons + kMainX];
    mb.target_sticks[i * kStickHeads + kMainX] = kStickClasses - 1;
  }
  StageHarness h("melee_embedding", {});
  h.setup(mb.embed_inputs());
  Tensor x = h.forward(mb.embed_inputs(), false).at("x");
  EmbedLayout L;
  const int E = L.width();
  for (size_t i = 0; i < mb.mask.size(); ++i) {
    const float* row = x.data<float>() + i * static_cast<size_t>(E);
    const float* ctrl = row + L.controller_offset();
    for (int c = 0; c < kControllerFeatures; ++c)
      EXPECT_EQ(ctrl[c], mb.prev[i * kControllerFeatures + static_cast<size_t>(c)]);
    EXPECT_NE(ctrl[kButtons + kMainX], stick_value(kStickClasses - 1));
  }
}

TEST(MeleeEmbedding, ShapesPaddingAndParams) {
  std::mt19937_64 rng(3);
  MeleeBatch mb = random_batch(3, 5, rng);
  {
    StageHarness h("melee_embedding", {});
    h.setup(mb.embed_inputs());
    // 3·(18+32+8) + 4 + 13 + 73 (the previous input's classes) = 264.
    EXPECT_EQ(h.context().output_shape("x"), (Shape{3, 5, 264}));
    auto w = h.weights();
    ASSERT_EQ(w.size(), 3u);
    EXPECT_EQ(w.at("action_table.weight").shape(), (Shape{kActionStates, 32}));
    EXPECT_EQ(w.at("character_table.weight").shape(), (Shape{kCharacters, 8}));
    EXPECT_EQ(w.at("stage_table.weight").shape(), (Shape{kStages, 4}));
    // init normal(0, 1) * 0.1
    double ss = 0;
    for (float v : w.at("action_table.weight").span<float>()) ss += double(v) * v;
    EXPECT_NEAR(std::sqrt(ss / (kActionStates * 32)), 0.1, 0.005);
  }
  {
    StageHarness h("melee_embedding", {"prev_classes=false"});
    h.setup(mb.embed_inputs());
    EXPECT_EQ(h.context().output_shape("x"), (Shape{3, 5, 192}));  // 191 -> 192
  }
  for (int a : {1, 5, 7, 32}) {
    StageHarness h("melee_embedding",
                   {"action_dim=" + std::to_string(a), "character_dim=3", "stage_dim=2"});
    h.setup(mb.embed_inputs());
    EmbedLayout L{a, 3, 2};
    auto out = h.forward(mb.embed_inputs(), false);
    const Tensor& x = out.at("x");
    ASSERT_EQ(x.dim(2) % 8, 0);
    ASSERT_EQ(x.dim(2), L.width());
    ASSERT_GE(x.dim(2), L.raw_width());
    EXPECT_EQ(x.shape(), (Shape{3, 5, L.width()}));
    for (int64_t r = 0; r < 15; ++r)
      for (int c = L.raw_width(); c < L.width(); ++c)
        EXPECT_EQ(x.data<float>()[r * L.width() + c], 0.0f);
    EXPECT_EQ(out.at("mirrored").shape(), (Shape{3}));
  }
}

// The previous input in the heads' terms: per head exactly one 1, at the class of the analog
// value in prev_controller (the targets' bins); under a mirror the x axes' classes mirror as
// the targets do (16 - c, which is the class of the negated value).
TEST(MeleeEmbedding, PreviousInputClassesOneHot) {
  std::mt19937_64 rng(5);
  MeleeBatch mb = random_batch(2, 9, rng);
  // Values on the bins' edges and outside their range too.
  const float edges[] = {-1.2f, -1.0f, -0.0625f, 0.0f, 0.0625f, 0.97f, 1.0f, 1.5f};
  for (size_t i = 0; i < mb.prev.size(); ++i)
    if (i % kControllerFeatures >= kButtons && i % 3 == 0) mb.prev[i] = edges[i % 8];
  const EmbedLayout L;
  const size_t rows = 18, E = static_cast<size_t>(L.width());
  std::vector<float> tables(size_t(kActionStates) * 32 + kCharacters * 8 + kStages * 4, 0.5f);
  const std::vector<uint8_t> mirrored = {0, 1};
  std::vector<float> x(rows * E);
  embed_forward<float>(L, rows, 9, mb.numeric.data(), mb.action.data(), mb.character.data(),
                       mb.stage.data(), mb.prev.data(), mirrored.data(), tables.data(),
                       tables.data() + size_t(kActionStates) * 32,
                       tables.data() + size_t(kActionStates) * 32 + kCharacters * 8, x.data());
  for (size_t r = 0; r < rows; ++r) {
    const float* pc = mb.prev.data() + r * kControllerFeatures;
    const bool m = mirrored[r / 9];
    for (int h = 0; h < kStickHeads; ++h) {
      const float v = pc[kButtons + h];
      const int want = h == kShoulder                     ? shoulder_class(v)
                       : (m && (h == kMainX || h == kCX)) ? stick_class(-v)
                                                          : stick_class(v);
      const float* col = x.data() + r * E + L.prev_class_offset() + prev_class_column(h);
      for (int c = 0; c < head_classes(h); ++c)
        EXPECT_EQ(col[c], c == want ? 1.0f : 0.0f) << "row " << r << " head " << h << " v " << v;
    }
  }
}

// The stage equals the float64 math; features are scaled as documented; absent slots read zero.
TEST(MeleeEmbedding, MatchesReference) {
  std::mt19937_64 rng(4);
  MeleeBatch mb = random_batch(3, 7, rng);
  StageHarness h("melee_embedding", {});
  h.setup(mb.embed_inputs());
  Tensor x = h.forward(mb.embed_inputs(), true).at("x");  // training, but mirror/noise are off
  auto w = h.weights();
  EmbedLayout L;
  const size_t rows = 21;
  std::vector<double> num(mb.numeric.begin(), mb.numeric.end()),
      prev(mb.prev.begin(), mb.prev.end());
  std::vector<double> out(rows * static_cast<size_t>(L.width()));
  embed_forward<double>(L, rows, 7, num.data(), mb.action.data(), mb.character.data(),
                        mb.stage.data(), prev.data(), nullptr,
                        to_double(w.at("action_table.weight")).data(),
                        to_double(w.at("character_table.weight")).data(),
                        to_double(w.at("stage_table.weight")).data(), out.data());
  expect_close(out, x, 1e-7, "x");
  int absent = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x.data<float>() + r * static_cast<size_t>(L.width());
    for (int s = 0; s < kSlots; ++s) {
      const float* f = &mb.numeric[(r * kSlots + static_cast<size_t>(s)) * kNumericFeatures];
      EXPECT_FLOAT_EQ(row[L.slot_offset(s) + kX], f[kX] * 0.05f);
      EXPECT_FLOAT_EQ(row[L.slot_offset(s) + kPercent], f[kPercent] * 0.01f);
      if (f[kExists] == 0) {
        ++absent;
        for (int k = L.action_offset(s); k < L.slot_offset(s) + L.slot_width(); ++k)
          EXPECT_EQ(row[k], 0.0f);
      }
    }
  }
  EXPECT_GT(absent, 0);
}

TEST(MeleeEmbedding, GradCheckFloat64) {
  std::mt19937_64 rng(5);
  MeleeBatch mb = random_batch(2, 3, rng);
  EmbedLayout L{3, 2, 2};
  const size_t rows = 6, E = static_cast<size_t>(L.width());
  std::vector<double> num(mb.numeric.begin(), mb.numeric.end()),
      prev(mb.prev.begin(), mb.prev.end());
  // Few ids, so rows repeat and their gradients must sum.
  for (auto& a : mb.action) a %= 4;
  for (auto& c : mb.character) c %= 3;
  for (auto& s : mb.stage) s %= 2;
  auto ta = rand_vec(kActionStates * 3, rng), tc = rand_vec(kCharacters * 2, rng),
       ts = rand_vec(kStages * 2, rng);
  auto wout = rand_vec(rows * E, rng);
  std::vector<double> out(rows * E);
  auto loss = [&] {
    embed_forward<double>(L, rows, 3, num.data(), mb.action.data(), mb.character.data(),
                          mb.stage.data(), prev.data(), nullptr, ta.data(), tc.data(), ts.data(),
                          out.data());
    return dot(wout, out);
  };
  std::vector<double> ga(ta.size(), 0.0), gc(tc.size(), 0.0), gs(ts.size(), 0.0);
  embed_backward<double>(L, rows, num.data(), mb.action.data(), mb.character.data(),
                         mb.stage.data(), wout.data(), ga.data(), gc.data(), gs.data());
  check_gradient("action_table", loss, ta, ga);
  check_gradient("character_table", loss, tc, gc);
  check_gradient("stage_table", loss, ts, gs);
  // Accumulation: a second backward doubles the table gradients.
  auto ga2 = ga;
  embed_backward<double>(L, rows, num.data(), mb.action.data(), mb.character.data(),
                         mb.stage.data(), wout.data(), ga2.data(), gc.data(), gs.data());
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_DOUBLE_EQ(ga2[i], 2 * ga[i]);
}

TEST(MeleeEmbedding, StageBackwardMatchesReference) {
  std::mt19937_64 rng(6);
  MeleeBatch mb = random_batch(2, 5, rng);
  StageHarness h("melee_embedding", {"action_dim=4", "character_dim=3", "stage_dim=2"});
  h.setup(mb.embed_inputs());
  EmbedLayout L{4, 3, 2};
  h.forward(mb.embed_inputs());
  const size_t rows = 10;
  auto dy = rand_vec(rows * static_cast<size_t>(L.width()), rng);
  auto grads =
      h.backward({{"x", make(Shape{2, 5, L.width()}, std::vector<float>(dy.begin(), dy.end()))}});
  std::vector<double> num(mb.numeric.begin(), mb.numeric.end());
  std::vector<double> ga(kActionStates * 4, 0.0), gc(kCharacters * 3, 0.0), gs(kStages * 2, 0.0);
  embed_backward<double>(L, rows, num.data(), mb.action.data(), mb.character.data(),
                         mb.stage.data(), dy.data(), ga.data(), gc.data(), gs.data());
  expect_close(ga, grads.at("grad.action_table.weight"), 1e-6, "action grad");
  expect_close(gc, grads.at("grad.character_table.weight"), 1e-6, "character grad");
  expect_close(gs, grads.at("grad.stage_table.weight"), 1e-6, "stage grad");
  for (const auto& [k, v] : grads) EXPECT_EQ(k.find("grad.numeric"), std::string::npos) << k;
}

TEST(MeleeEmbedding, RejectsOutOfRangeIds) {
  std::mt19937_64 rng(7);
  MeleeBatch mb = random_batch(1, 2, rng);
  StageHarness h("melee_embedding", {});
  h.setup(mb.embed_inputs());
  mb.action[1] = kActionStates;
  EXPECT_THROW(h.forward(mb.embed_inputs()), std::runtime_error);
}

// The batch mirrored by hand: x, facing and x speeds negated, prev main/c x negated, x-stick
// labels c -> 16 - c.
MeleeBatch mirror_by_hand(const MeleeBatch& in, const std::vector<uint8_t>& which) {
  MeleeBatch m = in;
  for (int64_t b = 0; b < in.B; ++b) {
    if (!which[static_cast<size_t>(b)]) continue;
    for (int64_t t = 0; t < in.W; ++t) {
      const size_t i = static_cast<size_t>(b * in.W + t);
      for (int s = 0; s < kSlots; ++s)
        for (int f : {kFacing, kX, kSpeedAirX, kSpeedAttackX, kSpeedGroundX})
          m.numeric[(i * kSlots + static_cast<size_t>(s)) * kNumericFeatures +
                    static_cast<size_t>(f)] *= -1;
      m.prev[i * kControllerFeatures + kButtons + kMainX] *= -1;
      m.prev[i * kControllerFeatures + kButtons + kCX] *= -1;
      for (int h : {kMainX, kCX}) {
        int32_t& c = m.target_sticks[i * kStickHeads + static_cast<size_t>(h)];
        c = kStickClasses - 1 - c;
      }
    }
  }
  return m;
}

TEST(MeleeMirror, StickClassIsSymmetric) {
  for (int i = -2000; i <= 2000; ++i) {
    const float v = static_cast<float>(i) / 1000.0f;
    EXPECT_EQ(stick_class(-v), kStickClasses - 1 - stick_class(v)) << v;
  }
  for (int c = 0; c < kStickClasses; ++c) {  // exact class centres and the ties between them
    EXPECT_EQ(stick_class(-stick_value(c)), kStickClasses - 1 - c);
    const float tie = (stick_value(c) + stick_value(std::min(c + 1, kStickClasses - 1))) / 2;
    EXPECT_EQ(stick_class(-tie), kStickClasses - 1 - stick_class(tie)) << tie;
  }
}

// Mirrored features + mirrored labels == the features and labels of the batch mirrored by hand.
TEST(MeleeMirror, FeaturesAndLabelsConsistent) {
  std::mt19937_64 rng(8);
  MeleeBatch mb = random_batch(64, 3, rng);
  StageHarness emb("melee_embedding", {"mirror=true"});
  emb.setup(mb.embed_inputs());
  // Outputs live in the stage's buffers until its next forward: keep copies.
  TensorMap train = emb.forward(mb.embed_inputs(), true);
  for (auto& [k, v] : train) v = v.clone();
  std::vector<uint8_t> which = vec<uint8_t>(train.at("mirrored"));
  int n = 0;
  for (uint8_t w : which) n += w;
  EXPECT_GT(n, 16);
  EXPECT_LT(n, 48);
  // Deterministic for a batch; validation never mirrors.
  EXPECT_EQ(vec<uint8_t>(emb.forward(mb.embed_inputs(), true).at("mirrored")), which);
  auto val = emb.forward(mb.embed_inputs(), false);
  for (uint8_t w : vec<uint8_t>(val.at("mirrored"))) EXPECT_EQ(w, 0);

  MeleeBatch hand = mirror_by_hand(mb, which);
  auto ref = emb.forward(hand.embed_inputs(), false).at("x");
  std::vector<float> a = vec<float>(train.at("x")), b = vec<float>(ref);
  ASSERT_EQ(a, b);

  // The loss with the published flags equals the loss on the hand-mirrored labels.
  TensorMap logits = random_logits(64, 3, rng);
  StageHarness l1("bc_loss", {}), l2("bc_loss", {});
  TensorMap in1 = merge(merge(logits, mb.loss_inputs()), {{"mirrored", train.at("mirrored")}});
  TensorMap in2 = merge(logits, hand.loss_inputs());
  l1.setup(in1);
  l2.setup(in2);
  l1.forward(in1);
  l2.forward(in2);
  EXPECT_EQ(l1.metrics().at("loss"), l2.metrics().at("loss"));
  auto g1 = l1.backward({}), g2 = l2.backward({});
  for (int h = 0; h < kHeads; ++h) {
    std::string k = std::string("grad.") + kHeadNames[h];
    EXPECT_EQ(vec<float>(g1.at(k)), vec<float>(g2.at(k))) << k;
  }
  // Without the flags the labels would disagree with the mirrored features.
  StageHarness l3("bc_loss", {});
  TensorMap in3 = merge(logits, mb.loss_inputs());
  l3.setup(in3);
  l3.forward(in3);
  EXPECT_NE(l3.metrics().at("loss"), l2.metrics().at("loss"));
}

TEST(MeleeMirror, DependsOnSeedAndBatch) {
  std::mt19937_64 rng(9);
  MeleeBatch mb = random_batch(64, 2, rng);
  StageHarness a("melee_embedding", {"mirror=true"}, "stage", Precision::fp32, 1);
  StageHarness b("melee_embedding", {"mirror=true"}, "stage", Precision::fp32, 2);
  a.setup(mb.embed_inputs());
  b.setup(mb.embed_inputs());
  const auto flags_a0 = vec<uint8_t>(a.forward(mb.embed_inputs()).at("mirrored"));
  EXPECT_NE(flags_a0, vec<uint8_t>(b.forward(mb.embed_inputs()).at("mirrored")));
  // Batch index 1 draws differently from batch index 0 (the harness always runs index 0).
  Direct d(a);
  for (const auto& [k, v] : mb.embed_inputs()) d.set_input(k, v);
  d.b.index = 1;
  a.stage().forward(d.b, a.context());
  EXPECT_NE(vec<uint8_t>(d.out("mirrored")), flags_a0);
  d.b.index = 0;
  a.stage().forward(d.b, a.context());
  EXPECT_EQ(vec<uint8_t>(d.out("mirrored")), flags_a0);
}

TEST(MeleeEmbedding, NoiseOnlyInTrainingAndOnlyOnNumericOfExistingSlots) {
  std::mt19937_64 rng(10);
  MeleeBatch mb = random_batch(4, 6, rng);
  StageHarness plain("melee_embedding", {}), noisy("melee_embedding", {"noise=0.1"});
  plain.setup(mb.embed_inputs());
  noisy.setup(mb.embed_inputs());
  auto x0 = vec<float>(plain.forward(mb.embed_inputs(), false).at("x"));
  EXPECT_EQ(vec<float>(noisy.forward(mb.embed_inputs(), false).at("x")), x0);
  auto x1 = vec<float>(noisy.forward(mb.embed_inputs(), true).at("x"));
  EXPECT_EQ(vec<float>(noisy.forward(mb.embed_inputs(), true).at("x")), x1);  // deterministic
  EmbedLayout L;
  double ss = 0;
  int n = 0;
  for (size_t r = 0; r < 24; ++r)
    for (int c = 0; c < L.width(); ++c) {
      const size_t i = r * static_cast<size_t>(L.width()) + static_cast<size_t>(c);
      const int s = c < L.stage_offset() ? c / L.slot_width() : -1;
      const bool numeric_col = s >= 0 && c - L.slot_offset(s) < kNumericFeatures;
      const bool exists =
          s >= 0 &&
          mb.numeric[(r * kSlots + static_cast<size_t>(s)) * kNumericFeatures + kExists] > 0.5f;
      if (numeric_col && exists) {
        ss += (x1[i] - x0[i]) * (x1[i] - x0[i]);
        ++n;
      } else {
        EXPECT_EQ(x1[i], x0[i]) << r << "," << c;
      }
    }
  EXPECT_NEAR(std::sqrt(ss / n), 0.1, 0.02);
}

// ---------------------------------------------------------------- controller_heads

// The heads' weights fused as heads_forward takes them: the (81, In) rows and the 81 biases.
void fused_head_params(const TensorMap& wts, std::vector<double>& Wo, std::vector<double>& bo) {
  for (int h = 0; h < kHeads; ++h) {
    auto w = to_double(wts.at(std::string(kHeadNames[h]) + ".weight"));
    auto b = to_double(wts.at(std::string(kHeadNames[h]) + ".bias"));
    Wo.insert(Wo.end(), w.begin(), w.end());
    bo.insert(bo.end(), b.begin(), b.end());
  }
}

// Each head's output against its columns of the reference `logits` (M, 81); draws every head's
// output gradient: the stage's gradient inputs (returned) and the same as dlogits `dl` (M, 81).
TensorMap check_heads_draw_grads(const TensorMap& out, const std::vector<double>& logits, int M,
                                 std::mt19937_64& rng, std::vector<double>& dl) {
  TensorMap grads_in;
  dl.assign(logits.size(), 0.0);
  for (int h = 0; h < kHeads; ++h) {
    const Tensor& o = out.at(kHeadNames[h]);
    EXPECT_EQ(o.numel(), int64_t{M} * head_width(h)) << kHeadNames[h];
    std::vector<double> want_h, g = rand_vec(static_cast<size_t>(M * head_width(h)), rng);
    for (int i = 0; i < M; ++i)
      for (int k = 0; k < head_width(h); ++k) {
        want_h.push_back(logits[static_cast<size_t>(i * kHeadsWidth + head_offset(h) + k)]);
        dl[static_cast<size_t>(i * kHeadsWidth + head_offset(h) + k)] =
            g[static_cast<size_t>(i * head_width(h) + k)];
      }
    expect_close(want_h, o, 1e-5, kHeadNames[h]);
    grads_in[kHeadNames[h]] = make(o.shape(), std::vector<float>(g.begin(), g.end()));
  }
  return grads_in;
}

TEST(ControllerHeads, GradCheckFloat64) {
  for (int hidden : {0, 4}) {
    SCOPED_TRACE("hidden=" + std::to_string(hidden));
    std::mt19937_64 rng(11 + static_cast<uint64_t>(hidden));
    const int M = 5, H = 6, In = hidden > 0 ? hidden : H;
    auto x = rand_vec(M * H, rng), Wh = rand_vec(static_cast<size_t>(hidden * H), rng),
         bh = rand_vec(static_cast<size_t>(hidden), rng),
         Wo = rand_vec(static_cast<size_t>(kHeadsWidth * In), rng), bo = rand_vec(kHeadsWidth, rng),
         w = rand_vec(static_cast<size_t>(M * kHeadsWidth), rng);
    std::vector<double> pre(static_cast<size_t>(M * hidden)), act(pre.size()), dact(pre.size()),
        logits(static_cast<size_t>(M * kHeadsWidth));
    auto loss = [&] {
      heads_forward<double>(x.data(), M, H, hidden, Wh.data(), bh.data(), pre.data(), act.data(),
                            Wo.data(), bo.data(), logits.data());
      return dot(w, logits);
    };
    loss();
    std::vector<double> dx(x.size(), 7.0), dWh(Wh.size(), 0.0), dbh(bh.size(), 0.0),
        dWo(Wo.size(), 0.0), dbo(bo.size(), 0.0);
    heads_backward<double>(x.data(), M, H, hidden, Wh.data(), pre.data(), act.data(), Wo.data(),
                           w.data(), dx.data(), dWh.data(), dbh.data(), dWo.data(), dbo.data(),
                           dact.data());
    check_gradient("x", loss, x, dx);
    check_gradient("Wo", loss, Wo, dWo);
    check_gradient("bo", loss, bo, dbo);
    if (hidden) {
      check_gradient("Wh", loss, Wh, dWh);
      check_gradient("bh", loss, bh, dbh);
    }
  }
}

TEST(ControllerHeads, StageMatchesReference) {
  for (int hidden : {0, 16}) {
    SCOPED_TRACE("hidden=" + std::to_string(hidden));
    std::mt19937_64 rng(13);
    const int64_t B = 3, W = 4, H = 24;
    const int M = static_cast<int>(B * W), In = hidden > 0 ? hidden : static_cast<int>(H);
    auto xv = rand_vec(static_cast<size_t>(M * H), rng);
    Tensor x = make(Shape{B, W, H}, std::vector<float>(xv.begin(), xv.end()));
    StageHarness st("controller_heads", {"hidden=" + std::to_string(hidden)});
    st.setup({{"x", x}});
    std::vector<std::string> names;
    for (Parameter* p : st.stage().parameters()) names.push_back(p->name);
    std::vector<std::string> want;
    if (hidden) want = {"hidden.weight", "hidden.bias"};
    for (int h = 0; h < kHeads; ++h) {
      want.push_back(std::string(kHeadNames[h]) + ".weight");
      want.push_back(std::string(kHeadNames[h]) + ".bias");
    }
    EXPECT_EQ(names, want);
    auto wts = st.weights();
    EXPECT_EQ(wts.at("main_x.weight").shape(), (Shape{17, In}));
    EXPECT_EQ(wts.at("shoulder.bias").shape(), (Shape{5}));
    // Reference parameters: fused from the per-head views.
    std::vector<double> Wo, bo;
    fused_head_params(wts, Wo, bo);
    std::vector<double> Wh = hidden ? to_double(wts.at("hidden.weight")) : std::vector<double>{},
                        bh = hidden ? to_double(wts.at("hidden.bias")) : std::vector<double>{};
    std::vector<double> pre(static_cast<size_t>(M * hidden)), act(pre.size()), dact(pre.size()),
        logits(static_cast<size_t>(M * kHeadsWidth));
    heads_forward<double>(xv.data(), M, static_cast<int>(H), hidden, Wh.data(), bh.data(),
                          pre.data(), act.data(), Wo.data(), bo.data(), logits.data());
    auto out = st.forward({{"x", x}});
    for (int h = 0; h < kHeads; ++h)
      ASSERT_EQ(out.at(kHeadNames[h]).shape(), (Shape{B, W, head_width(h)}));
    std::vector<double> dl;
    const TensorMap grads_in = check_heads_draw_grads(out, logits, M, rng, dl);
    std::vector<double> dx(xv.size()), dWh(Wh.size(), 0.0), dbh(bh.size(), 0.0),
        dWo(Wo.size(), 0.0), dbo(bo.size(), 0.0);
    heads_backward<double>(xv.data(), M, static_cast<int>(H), hidden, Wh.data(), pre.data(),
                           act.data(), Wo.data(), dl.data(), dx.data(), dWh.data(), dbh.data(),
                           dWo.data(), dbo.data(), dact.data());
    auto g = st.backward(grads_in);
    expect_close(dx, g.at("grad.x"), 1e-5, "dx");
    for (int h = 0; h < kHeads; ++h) {
      const int off = head_offset(h), wd = head_width(h);
      expect_close(std::vector<double>(dWo.begin() + off * In, dWo.begin() + (off + wd) * In),
                   g.at("grad." + std::string(kHeadNames[h]) + ".weight"), 1e-5, "dW");
      expect_close(std::vector<double>(dbo.begin() + off, dbo.begin() + off + wd),
                   g.at("grad." + std::string(kHeadNames[h]) + ".bias"), 1e-5, "db");
    }
    if (hidden) {
      expect_close(dWh, g.at("grad.hidden.weight"), 1e-5, "dWh");
      expect_close(dbh, g.at("grad.hidden.bias"), 1e-5, "dbh");
    }
  }
}

// The direct path from the previous input: finite differences of the float64 math, then the
// stage with prev_input connected equals heads_forward + heads_prev_forward, its weight starts
// at zero, gets heads_prev_backward's gradient, and prev_input (data) gets none; bf16 is close.
TEST(ControllerHeads, DirectPathFromThePreviousInput) {
  std::mt19937_64 rng(16);
  {
    const int M = 4, P = 7;
    auto prev = rand_vec(static_cast<size_t>(M * P), rng),
         Wp = rand_vec(static_cast<size_t>(kHeadsWidth * P), rng),
         w = rand_vec(static_cast<size_t>(M * kHeadsWidth), rng);
    std::vector<double> logits(static_cast<size_t>(M * kHeadsWidth));
    auto loss = [&] {
      std::fill(logits.begin(), logits.end(), 0.5);
      heads_prev_forward<double>(prev.data(), M, P, Wp.data(), logits.data());
      return dot(w, logits);
    };
    loss();
    std::vector<double> dWp(Wp.size(), 0.0);
    heads_prev_backward<double>(prev.data(), M, P, w.data(), dWp.data());
    check_gradient("Wp", loss, Wp, dWp);
  }
  const int64_t B = 2, W = 3, H = 12, P = 86;
  const int M = static_cast<int>(B * W);
  auto xv = rand_vec(static_cast<size_t>(M * H), rng),
       pv = rand_vec(static_cast<size_t>(M * P), rng);
  Tensor x = make(Shape{B, W, H}, std::vector<float>(xv.begin(), xv.end()));
  Tensor prev = make(Shape{B, W, P}, std::vector<float>(pv.begin(), pv.end()));
  StageHarness st("controller_heads", {});
  st.setup({{"x", x}, {"prev_input", prev}});
  EXPECT_EQ(st.stage().parameters().back()->name, "prev.weight");
  auto wts = st.weights();
  ASSERT_EQ(wts.at("prev.weight").shape(), (Shape{kHeadsWidth, P}));
  for (float v : wts.at("prev.weight").span<float>()) ASSERT_EQ(v, 0.0f);
  // Non-zero direct weights, so the path shows in the outputs.
  auto wpv = rand_vec(static_cast<size_t>(kHeadsWidth * P), rng);
  wts["prev.weight"] = make(Shape{kHeadsWidth, P}, std::vector<float>(wpv.begin(), wpv.end()));
  st.load_weights(wts);
  std::vector<double> Wo, bo;
  fused_head_params(wts, Wo, bo);
  std::vector<double> logits(static_cast<size_t>(M * kHeadsWidth));
  heads_forward<double>(xv.data(), M, static_cast<int>(H), 0, nullptr, nullptr, nullptr, nullptr,
                        Wo.data(), bo.data(), logits.data());
  heads_prev_forward<double>(pv.data(), M, static_cast<int>(P), wpv.data(), logits.data());
  auto out = st.forward({{"x", x}, {"prev_input", prev}});
  std::vector<double> dl;
  const TensorMap grads_in = check_heads_draw_grads(out, logits, M, rng, dl);
  std::vector<double> dWp(wpv.size(), 0.0);
  heads_prev_backward<double>(pv.data(), M, static_cast<int>(P), dl.data(), dWp.data());
  auto g = st.backward(grads_in);
  expect_close(dWp, g.at("grad.prev.weight"), 1e-5, "dWp");
  EXPECT_FALSE(g.count("grad.prev_input"));
  // bf16 GEMM operands: close to fp32.
  StageHarness b("controller_heads", {}, "heads", Precision::bf16);
  b.setup({{"x", x}, {"prev_input", prev}});
  b.load_weights(wts);
  auto ob = b.forward({{"x", x}, {"prev_input", prev}});
  for (int h = 0; h < kHeads; ++h)
    expect_close(to_double(out.at(kHeadNames[h])), ob.at(kHeadNames[h]), 3e-2, kHeadNames[h]);
  expect_close(to_double(g.at("grad.prev.weight")), b.backward(grads_in).at("grad.prev.weight"),
               3e-2, "bf16 dWp");
}

TEST(ControllerHeads, Bf16CloseToFp32) {
  for (int hidden : {0, 16}) {
    SCOPED_TRACE("hidden=" + std::to_string(hidden));
    std::mt19937_64 rng(14);
    auto xv = rand_vec(2 * 5 * 32, rng);
    Tensor x = make(Shape{2, 5, 32}, std::vector<float>(xv.begin(), xv.end()));
    StageHarness f("controller_heads", {"hidden=" + std::to_string(hidden)}, "heads",
                   Precision::fp32);
    StageHarness b("controller_heads", {"hidden=" + std::to_string(hidden)}, "heads",
                   Precision::bf16);
    f.setup({{"x", x}});
    b.setup({{"x", x}});
    b.load_weights(f.weights());
    auto of = f.forward({{"x", x}}), ob = b.forward({{"x", x}});
    TensorMap g;
    for (int h = 0; h < kHeads; ++h) {
      expect_close(to_double(of.at(kHeadNames[h])), ob.at(kHeadNames[h]), 3e-2, kHeadNames[h]);
      auto gv = rand_vec(static_cast<size_t>(10 * head_width(h)), rng);
      g[kHeadNames[h]] = make(Shape{2, 5, head_width(h)}, std::vector<float>(gv.begin(), gv.end()));
    }
    auto gf = f.backward(g), gb = b.backward(g);
    for (const auto& [k, v] : gf) expect_close(to_double(v), gb.at(k), 3e-2, k);
  }
}

// ---------------------------------------------------------------- autoregressive heads

// Random recorded items for M positions (some classes out of range: masked positions), and
// an autoregressive weight with its structural zeros (heads_ar_mask).
struct ArCase {
  std::vector<float> tb;
  std::vector<int32_t> ts;
  std::vector<double> Wa;
  ArCase(int M, std::mt19937_64& rng) {
    std::bernoulli_distribution coin(0.3);
    std::uniform_int_distribution<int32_t> cls(-1, kStickClasses);
    for (int i = 0; i < M * kButtons; ++i) tb.push_back(coin(rng) ? 1.0f : 0.0f);
    for (int i = 0; i < M; ++i)
      for (int h = 0; h < kStickHeads; ++h)
        ts.push_back(h == kShoulder ? cls(rng) % (kShoulderClasses + 1) : cls(rng));
    Wa = rand_vec(static_cast<size_t>(kHeadsWidth * kHeadsWidth), rng, -2.0, 2.0);
    heads_ar_mask(Wa.data());
  }
};

// The item order: 8 buttons one by one, then main x, main y, c x, c y, shoulder; an item sees
// exactly the items before it; the mask keeps the rest zero.
TEST(AutoregressiveHeads, ItemOrderAndMask) {
  EXPECT_EQ(kArItems, 13);
  EXPECT_EQ(ar_item_of_column(0), 0);
  EXPECT_EQ(ar_item_of_column(7), 7);
  EXPECT_EQ(ar_item_of_column(head_offset(1)), 8);
  EXPECT_EQ(ar_item_of_column(head_offset(2) - 1), 8);
  EXPECT_EQ(ar_item_of_column(head_offset(2)), 9);
  EXPECT_EQ(ar_item_of_column(head_offset(5)), 12);
  EXPECT_EQ(ar_item_of_column(kHeadsWidth - 1), 12);
  for (int k = 0; k < kArItems; ++k)
    for (int q = 0; q < ar_item_width(k); ++q)
      EXPECT_EQ(ar_item_of_column(ar_item_first_column(k) + q), k);
  std::vector<double> Wa(kHeadsWidth * kHeadsWidth, 1.0);
  heads_ar_mask(Wa.data());
  int kept = 0;
  for (int r = 0; r < kHeadsWidth; ++r)
    for (int c = 0; c < kHeadsWidth; ++c) {
      const bool before = ar_item_of_column(c) < ar_item_of_column(r);
      EXPECT_EQ(Wa[static_cast<size_t>(r * kHeadsWidth + c)], before ? 1.0 : 0.0) << r << "," << c;
      kept += before;
    }
  // A's row sees nothing; the shoulder's 5 rows see all 76 earlier columns.
  EXPECT_EQ(Wa[0 * kHeadsWidth + 1], 0.0);
  EXPECT_EQ(Wa[1 * kHeadsWidth + 0], 1.0);
  EXPECT_GT(kept, 0);
}

// Teacher forcing: the stage's logits equal heads_forward + teacher Waᵀ (the recorded items
// one-hot, x classes mirrored with the window), its Wa starts at zero and gets the masked
// heads_prev_backward gradient (finite differences of the float64 math first); outside training
// the logits are heads_ar_decode's, and a hand case decodes in order.
TEST(AutoregressiveHeads, TeacherForcedInTrainingDecodedOtherwise) {
  std::mt19937_64 rng(41);
  {
    const int M = 3;
    ArCase c(M, rng);
    std::vector<double> teacher(static_cast<size_t>(M * kHeadsWidth)),
        tbd(c.tb.begin(), c.tb.end());
    heads_ar_teacher<double>(M, 3, tbd.data(), c.ts.data(), nullptr, teacher.data());
    auto w = rand_vec(static_cast<size_t>(M * kHeadsWidth), rng);
    std::vector<double> logits(static_cast<size_t>(M * kHeadsWidth));
    auto loss = [&] {
      std::fill(logits.begin(), logits.end(), 0.25);
      heads_prev_forward<double>(teacher.data(), M, kHeadsWidth, c.Wa.data(), logits.data());
      return dot(w, logits);
    };
    loss();
    std::vector<double> dWa(c.Wa.size(), 0.0);
    heads_prev_backward<double>(teacher.data(), M, kHeadsWidth, w.data(), dWa.data());
    check_gradient("Wa", loss, c.Wa, dWa);
  }
  const int64_t B = 2, W = 3, H = 10;
  const int M = static_cast<int>(B * W);
  ArCase c(M, rng);
  auto xv = rand_vec(static_cast<size_t>(M * H), rng);
  Tensor x = make(Shape{B, W, H}, std::vector<float>(xv.begin(), xv.end()));
  const std::vector<uint8_t> mirrored = {0, 1};
  const TensorMap in = {{"x", x},
                        {"target_buttons", make(Shape{B, W, kButtons}, c.tb)},
                        {"target_sticks", make(Shape{B, W, kStickHeads}, c.ts)},
                        {"mirrored", make(Shape{B}, mirrored)}};
  StageHarness st("controller_heads", {"autoregressive=true"});
  st.setup(in);
  EXPECT_EQ(st.stage().parameters().back()->name, "ar.weight");
  auto wts = st.weights();
  for (float v : wts.at("ar.weight").span<float>()) ASSERT_EQ(v, 0.0f);
  wts["ar.weight"] =
      make(Shape{kHeadsWidth, kHeadsWidth}, std::vector<float>(c.Wa.begin(), c.Wa.end()));
  st.load_weights(wts);
  std::vector<double> Wo, bo, base(static_cast<size_t>(M * kHeadsWidth));
  fused_head_params(wts, Wo, bo);
  heads_forward<double>(xv.data(), M, static_cast<int>(H), 0, nullptr, nullptr, nullptr, nullptr,
                        Wo.data(), bo.data(), base.data());
  std::vector<double> teacher(base.size()), tbd(c.tb.begin(), c.tb.end()), logits = base;
  heads_ar_teacher<double>(static_cast<size_t>(M), static_cast<size_t>(W), tbd.data(), c.ts.data(),
                           mirrored.data(), teacher.data());
  // The mirrored window's recorded main x class 3 is class 13 in the teacher.
  for (int i = 0; i < M; ++i) {
    const int mx = c.ts[static_cast<size_t>(i * kStickHeads + kMainX)];
    if (mx < 0 || mx >= kStickClasses) continue;
    const int want = i >= W ? mirror_stick_class(mx) : mx;
    EXPECT_EQ(teacher[static_cast<size_t>(i * kHeadsWidth + head_offset(1) + want)], 1.0) << i;
  }
  heads_prev_forward<double>(teacher.data(), M, kHeadsWidth, c.Wa.data(), logits.data());
  auto out = st.forward(in);
  std::vector<double> dl;
  const TensorMap grads_in = check_heads_draw_grads(out, logits, M, rng, dl);
  std::vector<double> dWa(c.Wa.size(), 0.0);
  heads_prev_backward<double>(teacher.data(), M, kHeadsWidth, dl.data(), dWa.data());
  heads_ar_mask(dWa.data());
  expect_close(dWa, st.backward(grads_in).at("grad.ar.weight"), 1e-5, "dWa");
  // Outside training: the most likely items in order.
  std::vector<double> decoded = base;
  heads_ar_decode<double>(static_cast<size_t>(M), c.Wa.data(), decoded.data());
  check_heads_draw_grads(st.forward(in, false), decoded, M, rng, dl);
  // No backward from a decoded pass: dWa reads the teacher of a training forward.
  EXPECT_THROW(st.backward(grads_in), std::logic_error);
  // By hand: A likely pressed; main x's rest class likely unless A is pressed, which sends it to
  // class 16. Decoded: A, main x 16; without the A column main x would stay at 8.
  std::vector<double> z(kHeadsWidth, -1.0), Wz(kHeadsWidth * kHeadsWidth, 0.0);
  z[kA] = 0.5;
  z[head_offset(1) + 8] = 1.0;
  Wz[static_cast<size_t>((head_offset(1) + 16) * kHeadsWidth + kA)] = 5.0;
  Wz[static_cast<size_t>(kA * kHeadsWidth + head_offset(1))] = 9.0;  // not allowed: ignored
  heads_ar_mask(Wz.data());
  heads_ar_decode<double>(1, Wz.data(), z.data());
  EXPECT_EQ(z[head_offset(1) + 16], 4.0);
  EXPECT_EQ(z[kA], 0.5);
}

// Autoregressive heads refuse to set up without the recorded input to condition on.
TEST(AutoregressiveHeads, NeedsTheRecordedInput) {
  Tensor x = make(Shape{1, 2, 4}, std::vector<float>(8, 0.0f));
  StageHarness st("controller_heads", {"autoregressive=true"});
  try {
    st.setup({{"x", x}});
    FAIL() << "setup accepted autoregressive heads without targets";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("target_buttons"), std::string::npos) << e.what();
  }
}

// A bot's draws in item order: with a weight that moves main x to class 16 exactly when A is
// pressed, every sampled controller is consistent (independent draws would mix them), and at
// temperature 0 the choice is the decoded controller; without a weight each item is its head's
// own draw with the item's uniform of the frame's key.
TEST(AutoregressiveHeads, BotDrawsItemsInOrder) {
  std::vector<float> Wa(kHeadsWidth * kHeadsWidth, 0.0f);
  Wa[static_cast<size_t>((head_offset(1) + 16) * kHeadsWidth + kA)] = 40.0f;
  Wa[static_cast<size_t>((head_offset(1) + 8) * kHeadsWidth + kA)] = -40.0f;
  std::vector<double> base(kHeadsWidth, -30.0);
  base[kA] = 0.0;  // A: a fair coin
  base[head_offset(1) + 8] = 20.0;
  for (int h = 2; h < kHeads; ++h) base[static_cast<size_t>(head_offset(h))] = 0.0;
  std::vector<double> Wd(Wa.begin(), Wa.end()), z = base;
  heads_ar_decode<double>(1, Wd.data(), z.data());  // what the heads answer outside training
  const std::vector<float> logits(z.begin(), z.end());
  int pressed = 0;
  for (uint64_t f = 0; f < 400; ++f) {
    const ChosenController c =
        choose_controller(logits.data(), Wa.data(), 1.0f, frame_draws_key(5, f));
    const bool a = c.buttons & (1u << kA);
    pressed += a;
    ASSERT_EQ(c.classes[kMainX], a ? 16 : 8) << f;
  }
  EXPECT_GT(pressed, 150);
  EXPECT_LT(pressed, 250);
  const ChosenController greedy = choose_controller(logits.data(), Wa.data(), 0.0f, 0);
  EXPECT_EQ(greedy.buttons, 0u);  // logit 0 is not > 0
  EXPECT_EQ(greedy.classes[kMainX], 8);
  // Independent heads: item k drawn alone with the frame's uniform k.
  const uint64_t key = frame_draws_key(9, 3);
  const std::vector<float> flat(base.begin(), base.end());
  const ChosenController ind = choose_controller(flat.data(), nullptr, 1.0f, key);
  uint32_t buttons = 0;
  for (int b = 0; b < kButtons; ++b)
    if (item_uniform(key, b) < 1.0f / (1.0f + std::exp(-flat[static_cast<size_t>(b)])))
      buttons |= 1u << b;
  EXPECT_EQ(ind.buttons, buttons);
  for (int h = 0; h < kStickHeads; ++h)
    EXPECT_EQ(ind.classes[h], choose_class(flat.data() + head_offset(h + 1), head_classes(h), 1.0f,
                                           item_uniform(key, kButtons + h)))
        << h;
}

// The tempered draw is the softmax of z / T: over many uniforms each class comes up at its
// probability (within 4 standard errors), T = 0 takes the largest logit (the first on ties), and
// a uniform just below 1 still lands on a class of nonzero weight.
TEST(ControllerChoice, ClassDrawsFollowTheTemperedSoftmax) {
  const float z[5] = {0.5f, -1.0f, 2.0f, 2.0f, -400.0f};
  EXPECT_EQ(choose_class(z, 5, 0.0f, 0.3f), 2);
  for (float T : {0.5f, 1.0f, 2.0f}) {
    double w[5], sum = 0;
    for (int i = 0; i < 5; ++i) sum += w[i] = std::exp((z[i] - 2.0) / T);
    int counts[5] = {};
    const int n = 200000;
    for (int i = 0; i < n; ++i)
      ++counts[choose_class(z, 5, T, item_uniform(frame_draws_key(11, uint64_t(i)), 0))];
    for (int i = 0; i < 5; ++i) {
      const double p = w[i] / sum, se = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(double(counts[i]) / n, p, 4 * se + 1e-9) << "T " << T << " class " << i;
    }
    EXPECT_LT(choose_class(z, 5, T, 1.0f - 0x1p-24f), 4) << "the last class has weight ~0";
  }
  // The uniforms are on a 2^-24 grid in [0, 1), and differ between items and frames.
  const float u = item_uniform(frame_draws_key(1, 2), 3);
  EXPECT_GE(u, 0.0f);
  EXPECT_LT(u, 1.0f);
  EXPECT_EQ(u * 0x1p24f, std::floor(u * 0x1p24f));
  EXPECT_NE(u, item_uniform(frame_draws_key(1, 2), 4));
  EXPECT_NE(u, item_uniform(frame_draws_key(1, 3), 3));
}

// ---------------------------------------------------------------- bc_loss

TEST(BcLoss, GradCheckFloat64) {
  std::mt19937_64 rng(15);
  const int64_t B = 2, W = 3;
  const size_t M = 6;
  MeleeBatch mb = random_batch(B, W, rng);
  std::vector<double> tb(mb.target_buttons.begin(), mb.target_buttons.end()),
      mask(mb.mask.begin(), mb.mask.end());
  mask[1] = 0.5;  // fractional weights are means too
  std::vector<uint8_t> mirrored = {1, 0};
  std::vector<std::vector<double>> lg(kHeads);
  for (int h = 0; h < kHeads; ++h)
    lg[static_cast<size_t>(h)] = rand_vec(M * static_cast<size_t>(head_width(h)), rng);
  const double hw[kHeads] = {1.0, 0.5, 2.0, 1.0, 0.25, 1.5};
  std::vector<int32_t> targets(kStickHeads * M);
  std::vector<double> bw(M * kButtons);
  BcLossScratch<double> s{targets.data(), bw.data()};
  bc_loss_prepare<double>(M, W, mb.target_sticks.data(), mask.data(), mirrored.data(), s);
  for (double eps : {0.0, 0.1}) {
    auto loss = [&] {
      const double* p[kHeads];
      for (int h = 0; h < kHeads; ++h) p[h] = lg[static_cast<size_t>(h)].data();
      return bc_loss_forward<double>(M, p, tb.data(), mask.data(), hw, eps, s).total;
    };
    const double* p[kHeads];
    double* d[kHeads];
    std::vector<std::vector<double>> dl(kHeads);
    for (int h = 0; h < kHeads; ++h) {
      p[h] = lg[static_cast<size_t>(h)].data();
      dl[static_cast<size_t>(h)].assign(lg[static_cast<size_t>(h)].size(), 0.0);
      d[h] = dl[static_cast<size_t>(h)].data();
    }
    const BcLossResult r = bc_loss_forward<double>(M, p, tb.data(), mask.data(), hw, eps, s);
    bc_loss_backward<double>(M, p, tb.data(), mask.data(), hw, eps, r.weight_sum, s, d);
    for (int h = 0; h < kHeads; ++h)
      check_gradient(std::string(kHeadNames[h]) + " eps=" + std::to_string(eps), loss,
                     lg[static_cast<size_t>(h)], dl[static_cast<size_t>(h)]);
  }
}

TEST(BcLoss, StageMatchesReference) {
  std::mt19937_64 rng(16);
  const int64_t B = 3, W = 5;
  const size_t M = 15;
  MeleeBatch mb = random_batch(B, W, rng);
  TensorMap logits = random_logits(B, W, rng);
  StageHarness st("bc_loss", {"label_smoothing=0.05", "head_weights=[1, 0.5, 0.5, 2, 2, 1]"});
  TensorMap in = merge(logits, mb.loss_inputs());
  st.setup(in);
  auto out = st.forward(in);
  std::vector<double> tb(mb.target_buttons.begin(), mb.target_buttons.end()),
      mask(mb.mask.begin(), mb.mask.end());
  std::vector<int32_t> targets(kStickHeads * M);
  std::vector<double> bw(M * kButtons);
  BcLossScratch<double> s{targets.data(), bw.data()};
  bc_loss_prepare<double>(M, W, mb.target_sticks.data(), mask.data(), nullptr, s);
  std::vector<std::vector<double>> lg(kHeads), dl(kHeads);
  const double* p[kHeads];
  double* d[kHeads];
  for (int h = 0; h < kHeads; ++h) {
    lg[static_cast<size_t>(h)] = to_double(logits.at(kHeadNames[h]));
    dl[static_cast<size_t>(h)].resize(lg[static_cast<size_t>(h)].size());
    p[h] = lg[static_cast<size_t>(h)].data();
    d[h] = dl[static_cast<size_t>(h)].data();
  }
  const double hw[kHeads] = {1, 0.5, 0.5, 2, 2, 1};
  const BcLossResult r = bc_loss_forward<double>(M, p, tb.data(), mask.data(), hw, 0.05, s);
  bc_loss_backward<double>(M, p, tb.data(), mask.data(), hw, 0.05, r.weight_sum, s, d);
  auto m = st.metrics();
  EXPECT_NEAR(m.at("loss"), r.total, 1e-5 * r.total);
  EXPECT_NEAR(m.at("nll"), r.total_nll, 1e-5 * r.total_nll);
  EXPECT_GT(r.total_nll, 0);
  EXPECT_NEAR(out.at("loss").data<float>()[0], r.total, 1e-5 * r.total);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(m.at(std::string("loss/") + kHeadNames[h]), r.loss[h], 1e-5 * r.loss[h]);
    EXPECT_NEAR(m.at(std::string("nll/") + kHeadNames[h]), r.nll[h], 1e-5 * r.nll[h]);
    EXPECT_DOUBLE_EQ(m.at(std::string("acc/") + kHeadNames[h]), r.acc[h]);
  }
  EXPECT_EQ(m.count("baseline/loss"), 0u);  // training pass: no baseline
  auto g = st.backward({});
  for (int h = 0; h < kHeads; ++h)
    expect_close(dl[static_cast<size_t>(h)], g.at(std::string("grad.") + kHeadNames[h]), 1e-5,
                 kHeadNames[h]);
}

// One valid and one masked position, logits chosen by hand.
TEST(BcLoss, KnownValues) {
  const int64_t B = 1, W = 2;
  TensorMap in;
  std::vector<float> buttons(16, 0.0f);
  buttons[0] = 2.0f;   // A: predicted pressed
  buttons[1] = -1.0f;  // B: predicted released
  buttons[8] = 50.0f;  // masked position: anything
  in["buttons"] = make(Shape{B, W, 8}, buttons);
  for (int h = 1; h < kHeads; ++h) {
    std::vector<float> v(static_cast<size_t>(2 * head_width(h)), 0.0f);
    if (h == 1) v[3] = 1.0f;                        // main_x: class 3 gets logit 1
    v[static_cast<size_t>(head_width(h))] = 99.0f;  // masked position
    in[kHeadNames[h]] = make(Shape{B, W, head_width(h)}, v);
  }
  std::vector<float> tb(16, 0.0f);
  tb[0] = 1;  // A pressed (right), B released (right), rest released: logits 0 -> "released" (x > 0
              // false): right
  tb[2] = 1;  // X pressed: logit 0 predicts released: wrong
  in["target_buttons"] = make(Shape{B, W, 8}, tb);
  in["target_sticks"] =
      make(Shape{B, W, 5}, std::vector<int32_t>{3, 8, 8, 8, 0, -7, 99, 99, 99, 99});
  in["mask"] = make(Shape{B, W}, std::vector<float>{1, 0});
  in["prev_controller"] = make(Shape{B, W, 13}, std::vector<float>(26, 0.0f));
  StageHarness st("bc_loss", {});
  st.setup(in);
  st.forward(in);
  auto m = st.metrics();
  const double l2 = std::log(2.0);
  // BCE: A: log1p(e^-2); B (label 0, x = -1): log1p(e^-1); X (label 1, x = 0): ln 2; 5 others ln 2.
  const double bce = std::log1p(std::exp(-2.0)) + std::log1p(std::exp(-1.0)) + 6 * l2;
  EXPECT_NEAR(m.at("loss/buttons"), bce, 1e-6);
  EXPECT_NEAR(m.at("acc/buttons"), 7.0 / 8.0, 1e-12);
  const double main_x = std::log(std::exp(1.0) + 16) - 1.0;  // target class 3 has the logit 1
  EXPECT_NEAR(m.at("loss/main_x"), main_x, 1e-6);
  EXPECT_EQ(m.at("acc/main_x"), 1.0);
  EXPECT_NEAR(m.at("loss/main_y"), std::log(17.0), 1e-6);
  EXPECT_EQ(m.at("acc/main_y"), 0.0);  // all logits 0: argmax is class 0, the label is 8
  EXPECT_NEAR(m.at("loss/shoulder"), std::log(5.0), 1e-6);
  EXPECT_EQ(m.at("acc/shoulder"), 1.0);  // label 0 == argmax 0
  EXPECT_NEAR(m.at("loss"), bce + main_x + 3 * std::log(17.0) + std::log(5.0), 1e-5);
  EXPECT_EQ(m.at("loss"), m.at("nll"));  // no smoothing
  // Gradient of the mean: softmax - onehot at the valid position, zero at the masked one.
  auto g = st.backward({});
  const float* gx = g.at("grad.main_x").data<float>();
  const double z = std::exp(1.0) + 16;
  EXPECT_NEAR(gx[3], std::exp(1.0) / z - 1, 1e-6);
  EXPECT_NEAR(gx[0], 1 / z, 1e-6);
  for (int k = 17; k < 34; ++k) EXPECT_EQ(gx[k], 0.0f);
  EXPECT_NEAR(g.at("grad.buttons").data<float>()[0], 1 / (1 + std::exp(-2.0)) - 1, 1e-6);

  // Label smoothing 0.1 on main_x: loss = lse - Σ q x with q_3 = 0.9 + 0.1/17.
  StageHarness sm("bc_loss", {"label_smoothing=0.1", "head_weights=[0, 1, 0, 0, 0, 0]"});
  sm.setup(in);
  sm.forward(in);
  EXPECT_NEAR(sm.metrics().at("loss"), std::log(z) - (0.9 + 0.1 / 17), 1e-6);
  EXPECT_NEAR(sm.metrics().at("nll"), main_x, 1e-6);
}

TEST(BcLoss, RejectsBadLabelsAndHeadWeights) {
  std::mt19937_64 rng(17);
  MeleeBatch mb = random_batch(1, 2, rng);
  mb.target_sticks[kShoulder] = kShoulderClasses;  // position 0 is valid
  TensorMap in = merge(random_logits(1, 2, rng), mb.loss_inputs());
  StageHarness st("bc_loss", {});
  st.setup(in);
  EXPECT_THROW(st.forward(in), std::runtime_error);
  EXPECT_THROW(StageHarness("bc_loss", {"head_weights=[1, 1]"}), ConfigError);
}

// "Repeat the previous input": p measured on training positions, NLL on validation positions.
// Validation's figures where the input changes: position 0 repeats its previous input whole and
// the model gets every head right; at position 1 the A button changes (0 -> 1) and the model
// misses it (logit -2), every other item repeating and right.
TEST(BcLoss, ChangedItemsAndAllHeadsRightKnownValues) {
  const int64_t B = 1, W = 2;
  std::vector<float> prev(2 * 13, 0.0f), tb(16, 0.0f);
  prev[kA] = 1;
  prev[kButtons + kMainX] = 1.0f;  // class 16
  prev[13 + kButtons + kMainX] = 1.0f;
  tb[kA] = 1;      // repeats
  tb[8 + kA] = 1;  // changes
  const std::vector<int32_t> ts = {16, 8, 8, 8, 0, 16, 8, 8, 8, 0};
  TensorMap val;
  std::vector<float> buttons(16, -3.0f);
  buttons[kA] = 3.0f;
  buttons[8 + kA] = -2.0f;
  val["buttons"] = make(Shape{B, W, 8}, buttons);
  for (int h = 1; h < kHeads; ++h) {
    const int K = head_width(h);
    std::vector<float> x(static_cast<size_t>(2 * K), 0.0f);
    for (int i = 0; i < 2; ++i)
      x[static_cast<size_t>(i * K + ts[static_cast<size_t>(i * 5 + h - 1)])] = 5.0f;
    val[kHeadNames[h]] = make(Shape{B, W, K}, x);
  }
  val["prev_controller"] = make(Shape{B, W, 13}, prev);
  val["target_buttons"] = make(Shape{B, W, 8}, tb);
  val["target_sticks"] = make(Shape{B, W, 5}, ts);
  val["mask"] = make(Shape{B, W}, std::vector<float>{1, 1});
  StageHarness st("bc_loss", {});
  st.setup(val);
  st.forward(val, false);
  auto m = st.metrics();
  EXPECT_DOUBLE_EQ(m.at("all_right"), 0.5);
  EXPECT_DOUBLE_EQ(m.at("baseline/all_right"), 0.5);
  EXPECT_DOUBLE_EQ(m.at("changed/share/buttons"), 1.0 / 16);
  EXPECT_DOUBLE_EQ(m.at("changed/share/main_x"), 0.0);
  EXPECT_DOUBLE_EQ(m.at("changed/acc/buttons"), 0.0);
  EXPECT_NEAR(m.at("changed/nll/buttons"), std::log1p(std::exp(2.0)), 1e-6);
  EXPECT_NEAR(m.at("baseline/changed/nll/buttons"), -std::log(0.1), 1e-9);  // prior 0.9
  // Nothing changed on main_x: its figures are named (every rank of a run names the same
  // metrics) but weigh nothing (the runner leaves a metric measured over nothing out of rows).
  EXPECT_EQ(m.at("changed/acc/main_x"), 0.0);
  // How often the controller acts: both recorded inputs press A; the most likely input holds
  // main x full right at both; drawn at temperature 1 the controller does nothing with
  // probability Π_b σ(-x_b) · Π_h p_h(rest).
  EXPECT_DOUBLE_EQ(m.at("acts/recorded"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("acts/most_likely"), 1.0);
  {
    const double e5 = std::exp(5.0),
                 sticks_still = 1.0 / (e5 + 16) * std::pow(e5 / (e5 + 16), 3) * (e5 / (e5 + 4));
    auto still = [&](double xa) {
      return 1.0 / (1.0 + std::exp(xa)) * std::pow(1.0 / (1.0 + std::exp(-3.0)), 7) * sticks_still;
    };
    EXPECT_NEAR(m.at("acts/sampled"), 1.0 - (still(3.0) + still(-2.0)) / 2, 1e-9);
  }
  // The model right on the change too: every head right at both positions.
  buttons[8 + kA] = 2.0f;
  val["buttons"] = make(Shape{B, W, 8}, buttons);
  st.forward(val, false);
  m = st.metrics();
  EXPECT_DOUBLE_EQ(m.at("all_right"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("changed/acc/buttons"), 1.0);
  EXPECT_NEAR(m.at("changed/nll/buttons"), std::log1p(std::exp(-2.0)), 1e-6);
}

TEST(BcLoss, BaselineKnownValues) {
  const int64_t B = 1, W = 4;
  auto prev_row = [](float a, float mx, float sh) {
    std::vector<float> r(13, 0.0f);
    r[kA] = a;
    r[kButtons + kMainX] = mx;
    r[kButtons + kShoulder] = sh;
    return r;
  };
  // Training: main_x label repeats prev in 3 of 4 positions; A repeats in 2 of 4; shoulder in 4
  // of 4.
  std::vector<float> prev, tb(32, 0.0f);
  for (auto r :
       {prev_row(1, 0.0f, 0), prev_row(0, 1.0f, 0), prev_row(1, -1.0f, 0), prev_row(0, 0.0f, 0)})
    prev.insert(prev.end(), r.begin(), r.end());
  tb[0 * 8 + kA] = 1;  // same
  tb[1 * 8 + kA] = 1;  // differs
  tb[2 * 8 + kA] = 0;  // differs
  tb[3 * 8 + kA] = 0;  // same
  std::vector<int32_t> ts = {8, 8, 8, 8, 0, 16, 8, 8, 8, 0, 0, 8, 8, 8, 0, 4, 8, 8, 8, 0};
  // main_x: prev classes 8, 16, 0, 8; labels 8, 16, 0, 4 -> 3 of 4 repeat. Others: prev class 8
  // (main_y, c_x, c_y values 0) = label 8; shoulder 0 = 0.
  std::mt19937_64 rng(1);
  TensorMap train = random_logits(B, W, rng);
  train["prev_controller"] = make(Shape{B, W, 13}, prev);
  train["target_buttons"] = make(Shape{B, W, 8}, tb);
  train["target_sticks"] = make(Shape{B, W, 5}, ts);
  train["mask"] = make(Shape{B, W}, std::vector<float>{1, 1, 1, 1});
  StageHarness st("bc_loss", {"label_smoothing=0.2"});
  st.setup(train);

  // Before any training: p = baseline_prior (0.9) for every head item.
  TensorMap val = train;
  val["mask"] = make(Shape{B, W}, std::vector<float>{1, 1, 0, 0});
  st.forward(val, false);
  {
    auto m = st.metrics();
    // Position 0: everything repeats. Position 1: A differs, main_x repeats.
    const double same = -std::log(0.9), other2 = -std::log(0.1);
    EXPECT_NEAR(m.at("baseline/loss/buttons"), (8 * same + 7 * same + other2) / 2, 1e-9);
    EXPECT_NEAR(m.at("baseline/loss/main_x"), same, 1e-9);
    EXPECT_NEAR(m.at("baseline/acc/buttons"), 15.0 / 16.0, 1e-12);
  }
  st.forward(train, true);  // counts
  st.forward(val, false);
  auto m = st.metrics();
  // main_x: p = 3/4. Validation positions 0 and 1 both repeat.
  EXPECT_NEAR(m.at("baseline/loss/main_x"), -std::log(0.75), 1e-9);
  EXPECT_EQ(m.at("baseline/acc/main_x"), 1.0);
  // A: p = 1/2 (Bernoulli), other buttons p = 1 (clamped to 1 - 1e-6): pos 0 all repeat, pos 1 A
  // differs.
  const double pc = -std::log(1 - kBaselinePClamp);
  EXPECT_NEAR(m.at("baseline/loss/buttons"),
              ((std::log(2.0) + 7 * pc) + (std::log(2.0) + 7 * pc)) / 2, 1e-9);
  EXPECT_NEAR(m.at("baseline/loss/shoulder"), pc, 1e-9);
  // A differing validation label for main_x: NLL = -log((1 - p) / 16).
  TensorMap val2 = val;
  std::vector<int32_t> ts2 = ts;
  ts2[0] = 3;
  val2["target_sticks"] = make(Shape{B, W, 5}, ts2);
  st.forward(val2, false);
  EXPECT_NEAR(st.metrics().at("baseline/loss/main_x"), (-std::log(0.25 / 16) - std::log(0.75)) / 2,
              1e-9);
  EXPECT_EQ(st.metrics().at("baseline/acc/main_x"), 0.5);
  double total = 0;
  for (int h = 0; h < kHeads; ++h)
    total += st.metrics().at(std::string("baseline/loss/") + kHeadNames[h]);
  EXPECT_NEAR(st.metrics().at("baseline/loss"), total, 1e-9);  // head weights 1; no label smoothing

  // Saved and loaded: a fresh stage reports the same baseline.
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
  StateWriter w(tensors, meta, "loss");
  st.stage().save(w);
  StageHarness st2("bc_loss", {"label_smoothing=0.2"});
  st2.setup(train);
  StateReader r(tensors, meta, "loss", "test");
  st2.stage().load(r);
  st2.forward(val2, false);
  for (const auto& [k, v] : st.metrics()) {
    if (k.starts_with("baseline")) {
      EXPECT_EQ(st2.metrics().at(k), v) << k;
    }
  }
}

// ---------------------------------------------------------------- the three together

TEST(MeleeModel, NoAllocationInSteadyStateAndLearns) {
  t_counted_thread = true;
  for (Precision prec : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(prec == Precision::fp32 ? "fp32" : "bf16");
    std::mt19937_64 rng(18);
    const int64_t B = 4, W = 8;
    MeleeBatch mb = random_batch(B, W, rng);
    // Learnable: the label's main x repeats the previous input's.
    for (size_t i = 0; i < mb.mask.size(); ++i)
      mb.target_sticks[i * kStickHeads + kMainX] =
          stick_class(mb.prev[i * kControllerFeatures + kButtons + kMainX]);
    TensorMap ei = mb.embed_inputs(), li = mb.loss_inputs();
    StageHarness emb("melee_embedding", {"mirror=true", "noise=0.01"}, "embed", prec);
    emb.setup(ei);
    StageHarness heads("controller_heads", {"hidden=32"}, "heads", prec);
    heads.setup({{"x", Tensor::zeros(emb.context().output_shape("x"), DType::f32)}});
    TensorMap loss_setup = merge(li, random_logits(B, W, rng));
    loss_setup["mirrored"] = Tensor::zeros(Shape{B}, DType::u8);
    StageHarness loss("bc_loss", {}, "loss", prec);
    loss.setup(loss_setup);
    Direct de(emb), dh(heads), dl(loss);
    double last_loss = 0, first_loss = -1;
    loss.run().metric_sink = [&](std::string_view n, double v, MetricKind, double) {
      if (n == "nll") last_loss = v;
    };
    std::vector<Parameter*> params;
    for (auto* s : {&emb, &heads})
      for (Parameter* p : s->stage().parameters()) params.push_back(p);
    auto step = [&](uint64_t index) {
      for (Direct* d : {&de, &dh, &dl}) {
        d->b.index = index;
        d->clear_grads();
      }
      for (const auto& [k, v] : ei) de.set_input(k, v);
      emb.stage().forward(de.b, emb.context());
      dh.set_input("x", de.out("x"));
      heads.stage().forward(dh.b, heads.context());
      for (const auto& [k, v] : li) dl.set_input(k, v);
      for (int h = 0; h < kHeads; ++h) dl.set_input(kHeadNames[h], dh.out(kHeadNames[h]));
      dl.set_input("mirrored", de.out("mirrored"));
      loss.stage().forward(dl.b, loss.context());
      loss.stage().backward(dl.b, loss.context());
      for (int h = 0; h < kHeads; ++h)
        dh.set_out_grad(static_cast<size_t>(h), dl.in_grad(kHeadNames[h]));
      heads.stage().backward(dh.b, heads.context());
      de.set_out_grad(0, dh.in_grad("x"));
      emb.stage().backward(de.b, emb.context());
      for (Parameter* p : params) {  // plain SGD
        float* v = p->value.data<float>();
        float* g = p->grad.data<float>();
        for (int64_t i = 0; i < p->value.numel(); ++i) v[i] -= 0.5f * g[i], g[i] = 0;
      }
    };
    for (uint64_t i = 0; i < 3; ++i) step(i);
    first_loss = last_loss;
    g_news = 0;
    g_count_news = true;
    {  // the counter itself works (a library-style allocation the compiler cannot elide)
      std::vector<int> probe(static_cast<size_t>(3 + g_news.load()));
      EXPECT_EQ(probe.size(), 3u);
    }
    ASSERT_EQ(g_news.load(), 1u);
    const uint64_t calls = kernels::onednn_gemm_calls();
    g_news = 0;
    for (uint64_t i = 3; i < 20; ++i) step(i);
    // oneDNN's GEMMs (fp32 at AVX2 and above, native bf16) allocate a few objects of their own per
    // product; our code alone (oneDNN off) allocates nothing.
    const uint64_t products = kernels::onednn_gemm_calls() - calls;
    EXPECT_LE(g_news.load(), slipstream::testing::kOnednnAllocationsPerGemm * products)
        << products << " oneDNN products";
    {
      const slipstream::testing::WithoutOnednn widen;
      g_news = 0;
      for (uint64_t i = 20; i < 40; ++i) step(i);
      EXPECT_EQ(g_news.load(), 0u) << "heap allocations in steady state";
    }
    g_count_news = false;
    EXPECT_LT(last_loss, first_loss);
  }
}

}  // namespace
}  // namespace slipstream
