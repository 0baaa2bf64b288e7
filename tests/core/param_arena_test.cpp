// The run's parameter arena (engine/param_arena.h): stores registered in setup move into one
// allocation each for values, gradients and bf16 copies, back to back, with their values, and
// are told their slices; a store added after packing keeps its own buffers.
#include <gtest/gtest.h>

#include "engine/param_arena.h"

namespace slipstream {
namespace {

struct FakeStore {
  Tensor values, grads, shadow;
  int rebinds = 0;
  FakeStore(int64_t n, float first, bool copy) {
    values = Tensor::zeros({n}, DType::f32);
    grads = Tensor::zeros({n}, DType::f32);
    for (int64_t i = 0; i < n; ++i) values.data<float>()[i] = first + float(i);
    for (int64_t i = 0; i < n; ++i) grads.data<float>()[i] = 9.0f;  // stale: packing zeroes it
    if (copy) {
      shadow = Tensor::zeros({n}, DType::bf16);
      for (int64_t i = 0; i < n; ++i) shadow.data<uint16_t>()[i] = uint16_t(100 + i);
    }
  }
  void add_to(ParamArena& a) {
    a.add(values, grads, shadow, [this](const Tensor& v, const Tensor& g, const Tensor& c) {
      values = v, grads = g, shadow = c;
      ++rebinds;
    });
  }
};

TEST(ParamArena, PacksStoresBackToBackWithTheirValues) {
  ParamArena arena;
  FakeStore a(5, 1.0f, true), b(3, 50.0f, false), c(7, -4.0f, true);
  a.add_to(arena);
  b.add_to(arena);
  c.add_to(arena);
  EXPECT_EQ(arena.stores(), 3u);
  arena.pack();
  ASSERT_TRUE(arena.packed());
  EXPECT_EQ(arena.values().numel(), 15);
  EXPECT_EQ(arena.shadow().numel(), 15);
  for (FakeStore* s : {&a, &b, &c}) {
    EXPECT_EQ(s->rebinds, 1);
    EXPECT_TRUE(s->values.same_block(arena.values()));
    EXPECT_TRUE(s->grads.same_block(arena.grads()));
  }
  EXPECT_TRUE(a.shadow.same_block(arena.shadow()));
  EXPECT_FALSE(b.shadow.defined());  // no copy asked, none given
  // Back to back, in order: b's first value follows a's last.
  EXPECT_EQ(b.values.data<float>(), a.values.data<float>() + 5);
  EXPECT_EQ(c.grads.data<float>(), b.grads.data<float>() + 3);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.values.data<float>()[i], 1.0f + float(i));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(b.values.data<float>()[i], 50.0f + float(i));
  for (int i = 0; i < 7; ++i) EXPECT_EQ(c.shadow.data<uint16_t>()[i], uint16_t(100 + i));
  for (int i = 0; i < 15; ++i) EXPECT_EQ(arena.grads().data<float>()[i], 0.0f);

  FakeStore late(4, 0.0f, false);  // set up after packing: its own buffers
  late.add_to(arena);
  EXPECT_EQ(late.rebinds, 0);
  EXPECT_FALSE(late.values.same_block(arena.values()));
}

TEST(ParamArena, RefusesMismatchedStores) {
  ParamArena arena;
  const Tensor v = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW(arena.add(v, Tensor::zeros({3}, DType::f32), Tensor(), nullptr),
               std::invalid_argument);
  EXPECT_THROW(
      arena.add(v, Tensor::zeros({4}, DType::f32), Tensor::zeros({4}, DType::f32), nullptr),
      std::invalid_argument);
  ParamArena empty;
  empty.pack();  // nothing registered: nothing allocated
  EXPECT_FALSE(empty.values().defined());
}

}  // namespace
}  // namespace slipstream
