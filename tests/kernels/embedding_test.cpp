#include "kernels/embedding.h"

#include <gtest/gtest.h>

#include <tbb/global_control.h>

#include "tests/kernels/gradcheck.h"

namespace slipstream::kernels {
namespace {
using test::rand_vec;

TEST(Embedding, GradCheckWithRepeatedIds) {
  std::mt19937_64 rng(1);
  const size_t V = 6, D = 5;
  const std::vector<int32_t> ids = {3, 0, 3, 5, 3, 1};
  auto table = rand_vec(V * D, rng), g = rand_vec(ids.size() * D, rng);
  auto loss = [&] {
    std::vector<double> out(ids.size() * D);
    embedding_forward(ids.data(), table.data(), out.data(), ids.size(), D);
    return test::dot(g, out);
  };
  std::vector<double> out(ids.size() * D);
  embedding_forward(ids.data(), table.data(), out.data(), ids.size(), D);
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = 0; j < D; ++j) EXPECT_EQ(out[i * D + j], table[ids[i] * D + j]);
  std::vector<double> dt(V * D, 0.0);
  embedding_backward(ids.data(), g.data(), dt.data(), ids.size(), D);
  test::check_gradient("table", loss, table, dt);
  auto dt1 = dt;
  embedding_backward(ids.data(), g.data(), dt.data(), ids.size(), D);
  EXPECT_DOUBLED(dt, dt1);
}

TEST(Embedding, ParallelScatterEqualsSerial) {
  std::mt19937_64 rng(2);
  const size_t V = 40, D = 300, N = 5000;  // many collisions, many column blocks
  std::vector<int32_t> ids(N);
  for (auto& i : ids) i = int32_t(rng() % V);
  std::vector<float> g(N * D);
  for (auto& x : g) x = float(int(rng() % 200) - 100) / 64.0f;  // exact sums in float
  std::vector<float> par(V * D, 0.0f), ref(V * D, 0.0f);
  embedding_backward(ids.data(), g.data(), par.data(), N, D);
  for (size_t i = 0; i < N; ++i)
    for (size_t j = 0; j < D; ++j) ref[ids[i] * D + j] += g[i * D + j];
  EXPECT_EQ(par, ref);
}

}  // namespace
}  // namespace slipstream::kernels
