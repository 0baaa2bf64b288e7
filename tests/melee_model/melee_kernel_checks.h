// Checks of the Melee stages' CUDA kernels (stages/melee/melee_cuda.cu) against their CPU
// references in model_math.h, run in float64, on fresh random inputs: the embedding's gather,
// mirror draws and table gradients; the BC loss's statistics (loss, NLL, accuracy, repeat counts,
// the baseline from them, the bad-label flag) and its logit gradients. Written against a kernel
// table K (melee::cuda::Kernels or its emulated twin) and a memory backend
// (tests/kernels_cuda/device_checks.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "stages/melee/controller_choice.h"
#include "stages/melee/melee_kernels.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

namespace slipstream::melee::test {

using kernels::test::cast;
using kernels::test::rand_vec;
using kernels::test::rel_error;
using kernels::test::values;

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline uint64_t splitmix64(uint64_t z) {  // the embedding's draw
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Random loader tensors for B windows of W frames: slot 2 (Nana) mostly absent.
struct MeleeInputs {
  std::vector<float> numeric, prev;
  std::vector<int32_t> action, character, stage;
  MeleeInputs(size_t B, size_t W, std::mt19937_64& rng) {
    const size_t rows = B * W;
    numeric = cast<float>(rand_vec(rows * kSlots * kNumericFeatures, rng, 0.0, 3.0));
    std::bernoulli_distribution present(0.8), nana(0.2);
    for (size_t rs = 0; rs < rows * kSlots; ++rs)
      numeric[rs * kNumericFeatures + kExists] = (rs % kSlots == 2 ? nana(rng) : present(rng));
    prev = cast<float>(rand_vec(rows * kControllerFeatures, rng, 0.0, 1.0));
    std::uniform_int_distribution<int32_t> a(0, kActionStates - 1), c(0, kCharacters - 1),
        s(0, kStages - 1);
    for (size_t i = 0; i < rows * kSlots; ++i)
      action.push_back(a(rng)), character.push_back(c(rng));
    // Few distinct stages, so table rows collect many items (the summation order matters).
    for (size_t r = 0; r < rows; ++r) stage.push_back(s(rng) % 3);
  }
};

template <class K, class Mem>
void check_embedding(size_t B, size_t W, EmbedLayout L, uint64_t seed) {
  SCOPED_TRACE("embedding B " + std::to_string(B) + " W " + std::to_string(W));
  std::mt19937_64 rng(seed);
  Mem mem;
  const MeleeInputs in(B, W, rng);
  const size_t rows = B * W, E = static_cast<size_t>(L.width());
  const auto at = rand_vec(size_t(kActionStates) * L.action_dim, rng);
  const auto ct = rand_vec(size_t(kCharacters) * L.character_dim, rng);
  const auto st = rand_vec(size_t(kStages) * L.stage_dim, rng);
  const auto dims = embed_dims<typename K::EmbedDims>(L);
  const uint64_t key = splitmix64(seed);

  const float* g_num = mem.upload(in.numeric);
  const int32_t *g_a = mem.upload(in.action), *g_c = mem.upload(in.character),
                *g_s = mem.upload(in.stage);
  const float *g_at = mem.upload(cast<float>(at)), *g_ct = mem.upload(cast<float>(ct)),
              *g_st = mem.upload(cast<float>(st)), *g_pc = mem.upload(in.prev);
  float* g_out = mem.template alloc<float>(rows * E);
  const size_t P = size_t(L.prev_input_width());
  float* g_prev = mem.template alloc<float>(rows * P);
  // The bf16 copies of both, for the next stages' GEMMs.
  auto* g_out_bf = mem.template alloc<kernels::bfloat16>(rows * E);
  auto* g_prev_bf = mem.template alloc<kernels::bfloat16>(rows * P);
  // The forward draws the windows' mirror flags as it uses them.
  uint8_t* g_m = mem.template alloc<uint8_t>(B);
  const uint64_t* g_key = mem.upload(std::vector<uint64_t>{key});
  K::embed_forward(dims, rows, W, g_num, g_a, g_c, g_s, g_pc, {g_m, g_key, nullptr, 1}, g_at, g_ct,
                   g_st, g_out, g_prev, g_out_bf, g_prev_bf, mem.stream());
  const auto m = mem.download(g_m, B);
  for (size_t w = 0; w < B; ++w) EXPECT_EQ(m[w], splitmix64(key + w) >> 63) << "window " << w;
  {  // rows that continue their game keep their flag; the others draw with the new key
    std::vector<float> cont(B);
    for (size_t w = 0; w < B; ++w) cont[w] = w % 2 ? 1.0f : 0.0f;
    uint8_t* g_kept = mem.upload(m);  // a copy: g_m's flags stay the forward's checked below
    float* scratch_out = mem.template alloc<float>(rows * E);
    K::embed_forward(dims, rows, W, g_num, g_a, g_c, g_s, g_pc,
                     {g_kept, mem.upload(std::vector<uint64_t>{key + 7}), mem.upload(cont), 1},
                     g_at, g_ct, g_st, scratch_out, nullptr, nullptr, nullptr, mem.stream());
    const auto kept = mem.download(g_kept, B);
    for (size_t w = 0; w < B; ++w)
      EXPECT_EQ(kept[w], w % 2 ? m[w] : uint8_t(splitmix64(key + 7 + w) >> 63)) << "window " << w;
    // ... and the features were made with those flags.
    std::vector<double> ref_kept(rows * E);
    const auto num64 = widen(in.numeric), prev64 = widen(in.prev);
    embed_forward<double>(L, rows, W, num64.data(), in.action.data(), in.character.data(),
                          in.stage.data(), prev64.data(), kept.data(), at.data(), ct.data(),
                          st.data(), ref_kept.data());
    EXPECT_CLOSE(values(mem.download(scratch_out, rows * E)), ref_kept, 1e-6,
                 "embedding forward with kept flags");
    // Disabled: no flag, whatever the key.
    uint8_t* g_none = mem.upload(std::vector<uint8_t>(B, 1));
    K::embed_forward(dims, rows, W, g_num, g_a, g_c, g_s, g_pc,
                     {g_none, mem.upload(std::vector<uint64_t>{key}), nullptr, 0}, g_at, g_ct, g_st,
                     scratch_out, nullptr, nullptr, nullptr, mem.stream());
    const auto none = mem.download(g_none, B);
    for (size_t w = 0; w < B; ++w) EXPECT_EQ(none[w], 0) << "window " << w << " (disabled)";
  }
  std::vector<double> ref(rows * E);
  const auto num64 = widen(in.numeric), prev64 = widen(in.prev);
  embed_forward<double>(L, rows, W, num64.data(), in.action.data(), in.character.data(),
                        in.stage.data(), prev64.data(), m.data(), at.data(), ct.data(), st.data(),
                        ref.data());
  const auto out_dev = mem.download(g_out, rows * E);
  EXPECT_CLOSE(values(out_dev), ref, 1e-6, "embedding forward");
  // The previous-input columns again, as they are in out.
  const auto prev_dev = mem.download(g_prev, rows * P);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < P; ++c)
      ASSERT_EQ(prev_dev[r * P + c], out_dev[r * E + size_t(L.controller_offset()) + c])
          << "prev_input row " << r << " column " << c;
  // The bf16 copies hold fp32_to_bf16 of every element, bit for bit; noise keeps them in step.
  auto expect_copy = [&](const kernels::bfloat16* copy, const std::vector<float>& of,
                         const char* what) {
    const auto got = mem.download(copy, of.size());
    for (size_t i = 0; i < of.size(); ++i)
      ASSERT_EQ(got[i].bits, kernels::fp32_to_bf16(of[i])) << what << " element " << i;
  };
  expect_copy(g_out_bf, out_dev, "x's bf16 copy");
  expect_copy(g_prev_bf, prev_dev, "prev_input's bf16 copy");
  K::embed_add_noise(dims, rows, g_num, g_key, 0.5f, g_out, g_out_bf, mem.stream());
  const auto noised = mem.download(g_out, rows * E);
  EXPECT_NE(noised, out_dev) << "the noise changed nothing";
  expect_copy(g_out_bf, noised, "x's bf16 copy after the noise");

  const auto dout = rand_vec(rows * E, rng);
  std::vector<double> da(at.size(), 0.0), dc(ct.size(), 0.0), ds(st.size(), 0.0);
  embed_backward<double>(L, rows, num64.data(), in.action.data(), in.character.data(),
                         in.stage.data(), dout.data(), da.data(), dc.data(), ds.data());
  // The kernel accumulates (+=) into what is there: start from ones, subtract after. Both forms
  // (EmbedBackwardVariant), the sorted one twice: its result repeats bit for bit.
  const std::vector<float> ones_a(at.size(), 1.f), ones_c(ct.size(), 1.f), ones_s(st.size(), 1.f);
  void* ws = mem.alloc_bytes(K::embed_backward_workspace_bytes(dims, rows));
  const float* g_dout = mem.upload(cast<float>(dout));
  auto minus_one = [](std::vector<double> v) {
    for (double& x : v) x -= 1.0;
    return v;
  };
  using Variant = typename K::EmbedBackwardVariant;
  const Variant was = K::embed_backward_variant();
  std::vector<float> first_sorted;
  for (const Variant v : {Variant::partials, Variant::sorted, Variant::sorted}) {
    SCOPED_TRACE(v == Variant::sorted ? "sorted" : "partials");
    K::set_embed_backward_variant(v);
    float *g_da = mem.upload(ones_a), *g_dc = mem.upload(ones_c), *g_ds = mem.upload(ones_s);
    K::embed_backward(dims, rows, g_num, g_a, g_c, g_s, g_dout, g_da, g_dc, g_ds, ws, mem.stream());
    const auto got_a = mem.download(g_da, at.size());
    EXPECT_CLOSE(minus_one(values(got_a)), da, 1e-5, "action table grad");
    EXPECT_CLOSE(minus_one(values(mem.download(g_dc, ct.size()))), dc, 1e-5, "character grad");
    EXPECT_CLOSE(minus_one(values(mem.download(g_ds, st.size()))), ds, 1e-5, "stage table grad");
    if (v != Variant::sorted) continue;
    if (first_sorted.empty())
      first_sorted = got_a;
    else
      EXPECT_EQ(0, std::memcmp(first_sorted.data(), got_a.data(), got_a.size() * sizeof(float)))
          << "the sorted form's action table gradient differs between two runs";
  }
  K::set_embed_backward_variant(was);
}

template <class K, class Mem>
void check_bc_loss(size_t B, size_t W, double eps, uint64_t seed) {
  SCOPED_TRACE("bc_loss B " + std::to_string(B) + " W " + std::to_string(W) + " eps " +
               std::to_string(eps));
  std::mt19937_64 rng(seed);
  Mem mem;
  const size_t M = B * W;
  const MeleeInputs in(B, W, rng);
  std::vector<std::vector<double>> logits(kHeads);
  typename K::HeadPointers g_logits{};
  for (int h = 0; h < kHeads; ++h) {
    logits[h] = rand_vec(M * static_cast<size_t>(head_width(h)), rng, 0.0, 4.0);
    g_logits.logits[h] = mem.upload(cast<float>(logits[h]));
  }
  std::vector<float> tb(M * kButtons), mask(M);
  std::vector<int32_t> ts(M * kStickHeads);
  std::vector<uint8_t> mirrored(B);
  std::bernoulli_distribution coin(0.5), masked(0.2);
  for (auto& y : tb) y = coin(rng);
  for (size_t i = 0; i < M; ++i) {
    mask[i] = masked(rng) ? 0.0f : (coin(rng) ? 1.0f : 0.5f);
    for (int h = 0; h < kStickHeads; ++h)
      ts[i * kStickHeads + size_t(h)] =
          std::uniform_int_distribution<int>(0, head_classes(h) - 1)(rng);
  }
  for (auto& m : mirrored) m = coin(rng);
  // Some labels repeat the previous input exactly, as most frames do.
  std::vector<float> prev = in.prev;
  for (size_t i = 0; i < M; i += 2) {
    prev[i * kControllerFeatures + kButtons + kMainX] = stick_value(ts[i * kStickHeads + kMainX]);
    prev[i * kControllerFeatures] = tb[i * kButtons];
  }
  // Some repeat it whole (the baseline gets every head right there), and at some the model gets
  // every head right (its logits planted at the prepared, mirrored targets).
  for (size_t i = 0; i < M; i += 4) {
    for (int b = 0; b < kButtons; ++b)
      prev[i * kControllerFeatures + size_t(b)] = tb[i * kButtons + size_t(b)];
    for (int h = 0; h < kStickHeads; ++h) {
      const int c = ts[i * kStickHeads + size_t(h)];
      prev[i * kControllerFeatures + kButtons + size_t(h)] =
          h == kShoulder ? shoulder_value(c) : stick_value(c);
    }
  }
  {
    std::vector<int32_t> planted(kStickHeads * M);
    std::vector<double> bw(M * kButtons);
    bc_loss_prepare<double>(M, W, ts.data(), widen(mask).data(), mirrored.data(),
                            BcLossScratch<double>{planted.data(), bw.data()});
    for (size_t i = 1; i < M; i += 3) {
      for (int b = 0; b < kButtons; ++b)
        logits[0][i * kButtons + size_t(b)] = tb[i * kButtons + size_t(b)] > 0.5f ? 2.0 : -2.0;
      for (int h = 1; h < kHeads; ++h) {
        const int c = planted[size_t(h - 1) * M + i];
        if (c >= 0) logits[h][i * size_t(head_width(h)) + size_t(c)] = 9.0;
      }
    }
    for (int h = 0; h < kHeads; ++h) g_logits.logits[h] = mem.upload(cast<float>(logits[h]));
  }
  const float *g_tb = mem.upload(tb), *g_mask = mem.upload(mask), *g_prev = mem.upload(prev);
  const int32_t* g_ts = mem.upload(ts);
  const uint8_t* g_m = mem.upload(mirrored);

  float* g_stats = mem.template alloc<float>(M * kBcStats);
  float* g_sums = mem.template alloc<float>(kBcStats);
  void* ws = mem.alloc_bytes(K::bc_loss_rows_workspace_bytes(M));
  K::bc_loss_rows(g_logits, g_tb, g_ts, g_mask, g_m, g_prev, M, W, float(eps), g_stats, g_sums, ws,
                  mem.stream());
  const auto stats = mem.download(g_stats, M * kBcStats);
  float sums[kBcStats] = {};
  const auto dev_sums = mem.download(g_sums, kBcStats);
  for (int c = 0; c < kBcStats; ++c) {
    double s = 0;
    for (size_t i = 0; i < M; ++i) s += stats[i * kBcStats + size_t(c)];
    sums[c] = static_cast<float>(s);
    // The launch's own column sums (stored over what the buffer held): the rows' sums in its order.
    EXPECT_NEAR(dev_sums[size_t(c)], s, 1e-5 * (1.0 + std::abs(s))) << "column " << c;
  }
  EXPECT_EQ(sums[kBcBadLabel], 0.0f);

  // The reference, in float64.
  const auto tb64 = widen(tb), mask64 = widen(mask), prev64 = widen(prev);
  std::vector<int32_t> targets(kStickHeads * M);
  std::vector<double> button_weights(M * kButtons);
  const BcLossScratch<double> s{targets.data(), button_weights.data()};
  bc_loss_prepare<double>(M, W, ts.data(), mask64.data(), mirrored.data(), s);
  const double* lp[kHeads];
  for (int h = 0; h < kHeads; ++h) lp[h] = logits[h].data();
  const double hw64[kHeads] = {1.0, 0.5, 2.0, 1.0, 1.0, 0.25};
  const float hw[kHeads] = {1.0f, 0.5f, 2.0f, 1.0f, 1.0f, 0.25f};
  const BcLossResult ref = bc_loss_forward<double>(M, lp, tb64.data(), mask64.data(), hw64, eps, s);
  const BcLossResult got = bc_loss_result(sums, hw);
  EXPECT_NEAR(got.weight_sum, ref.weight_sum, 1e-6 * ref.weight_sum);
  EXPECT_NEAR(got.total, ref.total, 1e-5 * ref.total);
  EXPECT_NEAR(got.total_nll, ref.total_nll, 1e-5 * ref.total_nll);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(got.loss[h], ref.loss[h], 1e-5 * ref.loss[h]) << kHeadNames[h];
    EXPECT_NEAR(got.nll[h], ref.nll[h], 1e-5 * ref.nll[h]) << kHeadNames[h];
    EXPECT_NEAR(got.acc[h], ref.acc[h], 1e-6) << kHeadNames[h];
  }

  RepeatCounts want, have;
  count_repeats<double>(M, prev64.data(), tb64.data(), ts.data(), mask64.data(), want);
  add_repeats(sums, have);
  EXPECT_NEAR(have.total, want.total, 1e-6 * want.total);
  double p[kRepeatItems];
  for (int k = 0; k < kRepeatItems; ++k) {
    EXPECT_NEAR(have.same[k], want.same[k], 1e-5 * want.total) << "repeat item " << k;
    p[k] = want.p(k, 0.9);
  }
  EXPECT_GT(want.same[kButtons + kMainX], 0.3 * want.total);  // the planted repeats were seen
  const BaselineResult bref =
      baseline_forward<double>(M, prev64.data(), tb64.data(), ts.data(), mask64.data(), hw64, p);
  const BaselineResult bgot = baseline_from_sums(sums, hw, p);
  EXPECT_NEAR(bgot.total, bref.total, 1e-5 * bref.total);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(bgot.loss[h], bref.loss[h], 1e-5 * bref.loss[h]) << kHeadNames[h];
    EXPECT_NEAR(bgot.acc[h], bref.acc[h], 1e-6) << kHeadNames[h];
    EXPECT_NEAR(bgot.changed_nll[h], bref.changed_nll[h], 1e-5 * bref.changed_nll[h])
        << kHeadNames[h];
  }
  EXPECT_NEAR(bgot.all_right, bref.all_right, 1e-6);
  EXPECT_GT(bref.all_right, 0.05);  // the planted whole repeats

  // The changed items and the all-heads-right share, against bc_change_forward in float64.
  BcLossResult cref = ref;
  bc_change_forward<double>(M, lp, tb64.data(), ts.data(), mask64.data(), prev64.data(), s, cref);
  EXPECT_NEAR(got.all_right, cref.all_right, 1e-6);
  EXPECT_GT(cref.all_right, 0.1);  // the planted right answers
  EXPECT_NEAR(got.acts_recorded, cref.acts_recorded, 1e-6);
  EXPECT_NEAR(got.acts_sampled, cref.acts_sampled, 1e-5);
  EXPECT_NEAR(got.acts_most_likely, cref.acts_most_likely, 1e-6);
  EXPECT_GT(cref.acts_sampled, 0.0);
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_NEAR(got.changed[h], cref.changed[h], 1e-5 * want.total * kButtons) << kHeadNames[h];
    EXPECT_GT(cref.changed[h], 0.1 * want.total) << kHeadNames[h];
    EXPECT_NEAR(got.changed_acc[h], cref.changed_acc[h], 1e-5) << kHeadNames[h];
    EXPECT_NEAR(got.changed_nll[h], cref.changed_nll[h], 1e-5 * cref.changed_nll[h])
        << kHeadNames[h];
  }

  std::vector<std::vector<double>> dref(kHeads);
  double* dp[kHeads];
  typename K::HeadGradPointers g_dl{};
  typename K::HeadWeights g_hw{};
  for (int h = 0; h < kHeads; ++h) {
    dref[h].assign(logits[h].size(), 0.0);
    dp[h] = dref[h].data();
    g_dl.dlogits[h] = mem.template alloc<float>(logits[h].size());
    g_hw.w[h] = hw[h];
  }
  bc_loss_backward<double>(M, lp, tb64.data(), mask64.data(), hw64, eps, ref.weight_sum, s, dp);
  std::vector<float> sums_v(sums, sums + kBcStats);
  K::bc_loss_backward(g_logits, g_tb, g_ts, g_mask, g_m, M, W, float(eps), g_hw, mem.upload(sums_v),
                      g_dl, mem.stream());
  for (int h = 0; h < kHeads; ++h)
    EXPECT_CLOSE(values(mem.download(g_dl.dlogits[h], dref[h].size())), dref[h], 1e-5,
                 std::string("dlogits ") + kHeadNames[h]);

  // A class out of range at a valid position is flagged and that position left out.
  size_t bad = 0;
  while (mask[bad] <= 0) ++bad;
  ts[bad * kStickHeads + kCY] = kStickClasses;
  K::bc_loss_rows(g_logits, g_tb, mem.upload(ts), g_mask, g_m, g_prev, M, W, float(eps), g_stats,
                  nullptr, nullptr, mem.stream());
  const auto flagged = mem.download(g_stats, M * kBcStats);
  EXPECT_EQ(flagged[bad * kBcStats + kBcBadLabel], 1.0f);
  EXPECT_EQ(flagged[bad * kBcStats + kBcWeight], 0.0f);
}

// The autoregressive heads' kernels: the teacher one-hot (mirrored x classes, classes out of
// range left out), the weight's mask and the in-order decode, against model_math.h's heads_ar_*.
template <class K, class Mem>
void check_autoregressive_heads(size_t B, size_t W, uint64_t seed) {
  SCOPED_TRACE("autoregressive heads B " + std::to_string(B) + " W " + std::to_string(W));
  std::mt19937_64 rng(seed);
  Mem mem;
  const size_t M = B * W, N = size_t(kHeadsWidth) * kHeadsWidth;
  std::bernoulli_distribution coin(0.3);
  std::uniform_int_distribution<int32_t> cls(-1, kStickClasses);
  std::vector<float> tb(M * kButtons);
  std::vector<int32_t> ts(M * kStickHeads);
  std::vector<uint8_t> mirrored(B);
  for (auto& v : tb) v = coin(rng) ? 1.0f : 0.0f;
  for (auto& v : ts) v = cls(rng);
  for (size_t w = 0; w < B; ++w) mirrored[w] = w % 2;  // windows of both kinds
  std::vector<double> teacher(M * kHeadsWidth), tbd(tb.begin(), tb.end());
  heads_ar_teacher<double>(M, W, tbd.data(), ts.data(), mirrored.data(), teacher.data());
  float* g_t = mem.template alloc<float>(M * kHeadsWidth);
  K::heads_ar_teacher(M, W, mem.upload(tb), mem.upload(ts), mem.upload(mirrored), g_t,
                      mem.stream());
  EXPECT_CLOSE(values(mem.download(g_t, M * kHeadsWidth)), teacher, 1e-12, "teacher");

  const auto Wa = cast<float>(rand_vec(N, rng, -3.0, 3.0));
  std::vector<double> masked(Wa.begin(), Wa.end());
  heads_ar_mask(masked.data());
  float* g_w = mem.upload(Wa);
  K::heads_ar_mask(g_w, mem.stream());
  EXPECT_CLOSE(values(mem.download(g_w, N)), masked, 1e-12, "mask");

  // Logits near the decision points, so a wrong order or a missed column changes choices.
  const auto logits = cast<float>(rand_vec(M * kHeadsWidth, rng, -2.0, 2.0));
  std::vector<float> ref = logits, mw = cast<float>(masked);
  heads_ar_decode<float>(M, mw.data(), ref.data());
  float* g_z = mem.upload(logits);
  K::heads_ar_decode(M, g_w, g_z, mem.stream());
  EXPECT_CLOSE(values(mem.download(g_z, M * kHeadsWidth)), widen(ref), 1e-6, "decode");
}

// The policy's draws (policy_choose) against controller_choice.h: per game, the distribution
// (heads_distribution) and the controller choose_controller draws with the game's key at its frame
// (which the kernel counts on), at temperatures 0 (the largest logit, a tie placed on purpose),
// below, at and above 1, with independent heads and with a random autoregressive weight.
// `bit_exact` (the emulator: the same float operations on the same libm) asks every float and every
// choice to be equal; a GPU's expf differs in its last bits, so there distributions agree to 1e-6
// and a choice may differ only where a uniform falls within that of a decision: at most 2 of them.
template <class K, class Mem>
void check_policy_choose(size_t games, uint64_t seed, bool bit_exact) {
  SCOPED_TRACE("policy_choose, " + std::to_string(games) + " games");
  std::mt19937_64 rng(seed);
  Mem mem;
  typename K::HeadPointers hp{};
  std::vector<std::vector<float>> heads(kHeads);
  for (int h = 0; h < kHeads; ++h) {
    heads[h] = cast<float>(rand_vec(games * size_t(head_width(h)), rng, -3.0, 3.0));
    if (h == 1) heads[h][5] = heads[h][3] = 9.0f;  // game 0's main x: a tie at the top
    hp.logits[h] = mem.upload(heads[h]);
  }
  std::vector<double> masked = rand_vec(size_t(kHeadsWidth) * kHeadsWidth, rng, -2.0, 2.0);
  heads_ar_mask(masked.data());
  const std::vector<float> ar = cast<float>(masked);
  const float* g_ar = mem.upload(ar);
  // Each game its own key and frame counter; the kernel counts the frames on, on the device.
  std::vector<uint64_t> game_keys(games), frames(games);
  for (size_t g = 0; g < games; ++g) {
    game_keys[g] = splitmix64(seed + g);
    frames[g] = g % 3 == 0 ? 0 : splitmix64(g) % 1000;
  }
  const uint64_t* g_keys = mem.upload(game_keys);
  uint64_t* g_frames = mem.upload(frames);
  float* g_dist = mem.template alloc<float>(games * kHeadsWidth);
  int32_t* g_chosen = mem.template alloc<int32_t>(games * (1 + kStickHeads));
  size_t choices_differ = 0, acting = 0;
  double worst = 0;
  for (const bool with_ar : {false, true})
    for (const float T : {0.0f, 0.6f, 1.0f, 1.7f}) {
      SCOPED_TRACE(std::string(with_ar ? "autoregressive" : "independent") + " heads, T " +
                   std::to_string(T));
      K::policy_choose(hp, with_ar ? g_ar : nullptr, T, g_keys, g_frames, games, g_dist, g_chosen,
                       mem.stream());
      const auto dist = mem.download(g_dist, games * kHeadsWidth);
      const auto chosen = mem.download(g_chosen, games * (1 + kStickHeads));
      for (size_t g = 0; g < games; ++g) {
        float z[kHeadsWidth], d[kHeadsWidth];
        for (int h = 0; h < kHeads; ++h)
          std::copy_n(heads[h].data() + g * size_t(head_width(h)), head_width(h),
                      z + head_offset(h));
        heads_distribution(z, d);
        const ChosenController want = choose_controller(z, with_ar ? ar.data() : nullptr, T,
                                                        frame_draws_key(game_keys[g], frames[g]));
        acting += want.acts();
        for (int c = 0; c < kHeadsWidth; ++c) {
          const float got = dist[g * kHeadsWidth + size_t(c)];
          ASSERT_TRUE(!bit_exact || got == d[c])
              << "game " << g << " column " << c << ": " << got << " vs " << d[c];
          worst = std::max(worst, std::abs(double(got) - d[c]));
        }
        const int32_t* c = chosen.data() + g * (1 + kStickHeads);
        bool same = uint32_t(c[0]) == want.buttons;
        for (int h = 0; h < kStickHeads; ++h) same = same && c[1 + h] == want.classes[h];
        if (!same && bit_exact) {
          ADD_FAILURE() << "game " << g << ": buttons " << c[0] << " vs " << want.buttons
                        << ", main x " << c[1] << " vs " << want.classes[kMainX];
        }
        choices_differ += !same;
      }
      const auto counted = mem.download(g_frames, games);
      for (size_t g = 0; g < games; ++g) {
        ASSERT_EQ(counted[g], frames[g] + 1) << "game " << g << "'s frame counter";
        frames[g] = counted[g];  // the next call draws the next frame's uniforms
      }
      EXPECT_TRUE(T != 0.0f || chosen[1] == 3)
          << "game 0's main x at T 0: " << chosen[1] << ", not the first of a tie (3)";
    }
  EXPECT_LE(worst, 1e-6) << "distributions";
  EXPECT_LE(choices_differ, bit_exact ? 0u : 2u) << "controllers drawn differently";
  EXPECT_GT(acting, games) << "the draws pressed almost nothing: nothing was compared";
}

// The heads' fused logits split into the six outputs (plus the bias, in one float addition) and
// the six gradients joined back (a null one as zeros), with the joined gradient's bf16 copy:
// exact, checked element by element.
template <class K, class Mem>
void check_heads_split_join(size_t M, uint64_t seed) {
  SCOPED_TRACE("heads split/join, M " + std::to_string(M));
  std::mt19937_64 rng(seed);
  Mem mem;
  const auto fused = cast<float>(rand_vec(M * kHeadsWidth, rng, -3.0, 3.0));
  const auto bias = cast<float>(rand_vec(kHeadsWidth, rng, -1.0, 1.0));
  typename K::HeadGradPointers out{};
  for (int h = 0; h < kHeads; ++h) out.dlogits[h] = mem.template alloc<float>(M * head_width(h));
  K::heads_split(mem.upload(fused), mem.upload(bias), M, out, mem.stream());
  std::vector<std::vector<float>> heads(kHeads);
  for (int h = 0; h < kHeads; ++h) {
    const size_t w = size_t(head_width(h));
    heads[h] = mem.download(out.dlogits[h], M * w);
    for (size_t r = 0; r < M; ++r)
      for (size_t c = 0; c < w; ++c)
        ASSERT_EQ(heads[h][r * w + c], fused[r * kHeadsWidth + size_t(head_offset(h)) + c] +
                                           bias[size_t(head_offset(h)) + c])
            << "head " << h << " row " << r << " column " << c;
  }
  K::heads_split(mem.upload(fused), nullptr, M, out, mem.stream());  // no bias: exact copies
  for (int h = 0; h < kHeads; ++h) {
    const size_t w = size_t(head_width(h));
    heads[h] = mem.download(out.dlogits[h], M * w);
    for (size_t r = 0; r < M; ++r)
      for (size_t c = 0; c < w; ++c)
        ASSERT_EQ(heads[h][r * w + c], fused[r * kHeadsWidth + size_t(head_offset(h)) + c])
            << "head " << h << " row " << r << " column " << c << " (no bias)";
  }
  typename K::HeadPointers in{};
  for (int h = 0; h < kHeads; ++h)
    in.logits[h] = h == 2 ? nullptr : mem.upload(heads[h]);  // main y: no gradient
  float* g_dl = mem.template alloc<float>(M * kHeadsWidth);
  kernels::bfloat16* g_dlbf = mem.template alloc<kernels::bfloat16>(M * kHeadsWidth);
  const auto db0 = cast<float>(rand_vec(kHeadsWidth, rng, -1.0, 1.0));
  float* g_db = mem.upload(db0);
  void* ws = mem.alloc_bytes(K::heads_join_workspace_bytes(M));
  K::heads_join(in, M, g_dl, g_dlbf, g_db, ws, mem.stream());
  const auto dl = mem.download(g_dl, M * kHeadsWidth);
  const auto dlbf = mem.download(g_dlbf, M * kHeadsWidth);
  std::vector<double> col(kHeadsWidth, 0.0), mag(kHeadsWidth, 0.0);
  for (size_t i = 0; i < M * kHeadsWidth; ++i) {
    const int c = int(i % kHeadsWidth);
    const bool main_y = c >= head_offset(2) && c < head_offset(3);
    ASSERT_EQ(dl[i], main_y ? 0.0f : fused[i]) << "element " << i;
    ASSERT_EQ(dlbf[i].bits, kernels::fp32_to_bf16(dl[i])) << "bf16 copy, element " << i;
    col[size_t(c)] += dl[i];
    mag[size_t(c)] += std::abs(dl[i]);
  }
  // The output bias's gradient: the columns' sums added onto what dbias held.
  const auto db = mem.download(g_db, kHeadsWidth);
  for (int c = 0; c < kHeadsWidth; ++c) {
    const double want = double(db0[size_t(c)]) + col[size_t(c)];
    EXPECT_NEAR(db[size_t(c)], want, 1e-6 * (1.0 + mag[size_t(c)])) << "dbias " << c;
  }
}

// The heads' forward of a few rows in one launch (heads_small_rows): every head's output against
// x Woᵀ + prev Wpᵀ + bias in double on the same operands (bf16: the rounded ones), element by
// element to the fp32 sums' rounding; without the direct path (P 0) too.
template <class K, class Mem>
void check_heads_small_rows(size_t M, int H, int P, bool bf16, uint64_t seed) {
  SCOPED_TRACE("heads small rows, M " + std::to_string(M) + " H " + std::to_string(H) + " P " +
               std::to_string(P) + (bf16 ? " bf16" : " fp32"));
  std::mt19937_64 rng(seed);
  Mem mem;
  auto values = [&](size_t n, double scale) {
    auto v = cast<float>(rand_vec(n, rng, -scale, scale));
    if (bf16)
      for (float& e : v) e = kernels::bf16_to_fp32(kernels::fp32_to_bf16(e));
    return v;
  };
  const auto x = values(M * size_t(H), 1.0), Wo = values(size_t(kHeadsWidth) * H, 0.2);
  const auto prev = values(M * size_t(P), 1.0), Wp = values(size_t(kHeadsWidth) * P, 0.2);
  const auto bias = cast<float>(rand_vec(kHeadsWidth, rng, -1.0, 1.0));
  typename K::HeadGradPointers out{};
  for (int h = 0; h < kHeads; ++h) out.dlogits[h] = mem.template alloc<float>(M * head_width(h));
  auto to_bf = [](const std::vector<float>& v) {
    std::vector<kernels::bfloat16> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i].bits = kernels::fp32_to_bf16(v[i]);
    return b;
  };
  if (bf16)
    K::heads_small_rows(M, mem.upload(to_bf(x)), H, mem.upload(to_bf(Wo)),
                        P ? mem.upload(to_bf(prev)) : nullptr, P,
                        P ? mem.upload(to_bf(Wp)) : nullptr, mem.upload(bias), out, mem.stream());
  else
    K::heads_small_rows(M, mem.upload(x), H, mem.upload(Wo), P ? mem.upload(prev) : nullptr, P,
                        P ? mem.upload(Wp) : nullptr, mem.upload(bias), out, mem.stream());
  for (int h = 0; h < kHeads; ++h) {
    const size_t w = size_t(head_width(h));
    const auto got = mem.download(out.dlogits[h], M * w);
    for (size_t r = 0; r < M; ++r)
      for (size_t j = 0; j < w; ++j) {
        const size_t c = size_t(head_offset(h)) + j;
        double want = bias[c], mag = std::abs(bias[c]);
        for (int k = 0; k < H; ++k) {
          const double term = double(x[r * H + k]) * Wo[c * H + k];
          want += term, mag += std::abs(term);
        }
        for (int k = 0; k < P; ++k) {
          const double term = double(prev[r * P + k]) * Wp[c * P + k];
          want += term, mag += std::abs(term);
        }
        ASSERT_NEAR(got[r * w + j], want, 2e-6 * mag)
            << "head " << h << " row " << r << " col " << j;
      }
  }
}

}  // namespace slipstream::melee::test
