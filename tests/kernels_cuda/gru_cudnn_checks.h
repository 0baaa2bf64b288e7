// cuDNN's GRU stack (kernels/gru_cudnn.h) against the CPU layer (kernels/gru.h in float64)
// chained layer by layer, as the gru stage's model chains it: the last layer's y, dx, and every
// weight and bias gradient added onto non-zero starts. The weights lie in nn.GRU's layout in one
// flat buffer with gaps between layers (a store's offsets, not cuDNN's); the gaps' gradients must
// stay untouched. The bf16 form sees the weights' bf16 copies and x rounded to bf16, so the
// reference is given those; its states are rounded as it goes, so it is held to bf16's
// tolerance, and its y must be bf16 values widened. Run by the gpu test (cuDNN has no
// emulation).
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/gru.h"
#include "kernels/gru_cudnn.h"
#include "tests/kernels/gradcheck.h"
#include "tests/kernels_cuda/device_checks.h"

namespace slipstream::kernels::test {

struct GruStackShape {
  int B, L, In, H, layers;
};

template <class Mem>
void check_cudnn_gru(const GruStackShape& s, uint64_t seed, bool bf16 = false) {
  SCOPED_TRACE("B" + std::to_string(s.B) + " L" + std::to_string(s.L) + " In" +
               std::to_string(s.In) + " H" + std::to_string(s.H) + " layers " +
               std::to_string(s.layers) + (bf16 ? " bf16" : " fp32"));
  std::mt19937_64 rng(seed);
  const size_t G = 3 * size_t(s.H), M = size_t(s.B) * s.L, H = size_t(s.H);
  std::vector<cuda::CudnnGru::LayerOffsets> off;
  std::vector<size_t> ins;
  size_t total = 0;
  for (int k = 0; k < s.layers; ++k) {
    const size_t in = k == 0 ? size_t(s.In) : H;
    off.push_back({total, total + G * in, total + G * in + G * H, total + G * in + G * H + G});
    ins.push_back(in);
    total += G * in + G * H + 2 * G + 5;  // 5 floats of gap
  }
  // nn.GRU's scale, 1/sqrt(H), everywhere (gaps included: they must not matter).
  std::vector<double> w = rand_vec(total, rng);
  for (double& e : w) e /= std::sqrt(double(s.H));
  w = bf16 ? round_trip<bfloat16>(w) : round_trip<float>(w);
  const auto x = bf16 ? round_trip<bfloat16>(rand_vec(M * s.In, rng))
                      : round_trip<float>(rand_vec(M * s.In, rng));
  const auto dy = round_trip<float>(rand_vec(M * H, rng));
  const auto g0 = round_trip<float>(rand_vec(total, rng));

  // The reference, layer by layer.
  std::vector<std::vector<double>> ys(size_t(s.layers), std::vector<double>(M * H));
  std::vector<std::vector<double>> saved(size_t(s.layers),
                                         std::vector<double>(gru_saved_elems(s.B, s.L, s.H)));
  std::vector<double> fws(gru_forward_workspace_elems(s.B, s.L, s.H));
  for (int k = 0; k < s.layers; ++k) {
    const auto& o = off[size_t(k)];
    const double* in = k == 0 ? x.data() : ys[size_t(k) - 1].data();
    gru_forward<double>(in, nullptr, &w[o.w_ih], &w[o.w_hh], &w[o.b_ih], &w[o.b_hh],
                        ys[size_t(k)].data(), saved[size_t(k)].data(), fws.data(), s.B, s.L,
                        int(ins[size_t(k)]), s.H);
  }
  std::vector<double> g = g0, dout = dy, din;
  std::vector<double> bws(gru_backward_workspace_elems(s.B, s.L, s.H));
  for (int k = s.layers - 1; k >= 0; --k) {
    const auto& o = off[size_t(k)];
    const double* in = k == 0 ? x.data() : ys[size_t(k) - 1].data();
    din.assign(M * ins[size_t(k)], 0.0);
    gru_backward<double>(in, nullptr, &w[o.w_ih], &w[o.w_hh], ys[size_t(k)].data(),
                         saved[size_t(k)].data(), dout.data(), nullptr, din.data(), nullptr,
                         &g[o.w_ih], &g[o.w_hh], &g[o.b_ih], &g[o.b_hh], bws.data(), s.B, s.L,
                         int(ins[size_t(k)]), s.H);
    dout = din;
  }

  Mem mem;
  cuda::CudnnGru gru(mem.stream(), s.In, s.H, off, bf16);
  const auto needs = gru.describe_batch(s.B, s.L);
  EXPECT_EQ(needs.staging_bytes > 0, bf16);
  const cuda::CudnnGru::Buffers b{mem.alloc_bytes(gru.weight_space_bytes()),
                                  mem.alloc_bytes(gru.weight_space_bytes()),
                                  mem.alloc_bytes(needs.work_bytes),
                                  mem.alloc_bytes(needs.reserve_bytes),
                                  bf16 ? mem.alloc_bytes(needs.staging_bytes) : nullptr,
                                  mem.template alloc<int>(size_t(s.B))};
  gru.set_batch(b.seq_lengths);
  const float* g_x = mem.upload(elems<float>(x));
  // The bf16 form reads only the weights' bf16 copies: its fp32 ones are not given.
  const float* g_w = bf16 ? nullptr : mem.upload(elems<float>(w));
  const bfloat16* g_wb = bf16 ? mem.upload(elems<bfloat16>(w)) : nullptr;
  float* g_y = mem.template alloc<float>(M * H);
  float* g_dx = mem.template alloc<float>(M * s.In);
  float* g_g = mem.upload(elems<float>(g0));
  gru.forward(g_x, g_w, g_wb, g_y, b, true);
  gru.backward(g_x, g_y, mem.upload(elems<float>(dy)), g_dx, g_g, b);
  mem.sync();
  const double tol = bf16 ? 2e-2 : 1e-5, grad_tol = bf16 ? 3e-2 : 1e-5;
  const auto y = mem.download(g_y, M * H);
  EXPECT_CLOSE(values(y), ys.back(), tol, "y");
  EXPECT_CLOSE(values(mem.download(g_dx, M * s.In)), dout, tol, "dx");
  EXPECT_CLOSE(values(mem.download(g_g, total)), g, grad_tol, "weight and bias gradients");
  if (bf16) {  // y came out of bf16: the low halves of its fp32 bits are zero
    size_t wide = 0;
    for (float e : y) {
      uint32_t u;
      std::memcpy(&u, &e, 4);
      wide += (u & 0xffffu) != 0;
    }
    EXPECT_EQ(wide, 0u) << "elements of y that are not bf16 values";
  }
  const auto got = values(mem.download(g_g, total));
  for (int k = 0; k < s.layers; ++k) {  // the gaps after each layer's bias_hh
    const size_t gap = off[size_t(k)].b_hh + G;
    for (size_t i = gap; i < gap + 5; ++i) EXPECT_EQ(got[i], g0[i]) << "gap element " << i;
  }
}

}  // namespace slipstream::kernels::test
