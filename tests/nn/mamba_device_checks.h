// The Mamba model through its device ops (stages/ops/device_ops.h) against the CPU model in
// float64, forward, input gradient and every parameter gradient, fp32 and bf16. Shared by the
// emulated test (the kernels on the CPU emulator, every build) and the gpu test (a device).
// `Kernels` is a kernel table (kernels/cuda_kernels.h); `memory` where the device ops
// allocate; `gemm` their cuBLASLt context.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/tensor.h"
#include "kernels/bf16.h"
#include "stages/nn/mamba_model.h"
#include "stages/ops/device_ops.h"
#include "tests/kernels/gradcheck.h"

namespace slipstream::nn::test {

struct MambaDeviceCase {
  int din, d_model, d_state, layers, B, L;
  bool bf16;
  bool carry = false;  // the checked window continues a first one on some rows (set_carry)
};

inline std::vector<MambaDeviceCase> mamba_device_cases() {
  // Odd sizes: L not a multiple of the scan chunk, d_inner not of the block, an input_proj.
  return {{12, 16, 8, 2, 2, 21, false},       {16, 16, 16, 1, 3, 17, false},
          {12, 16, 8, 2, 2, 21, true},        {5, 24, 4, 2, 1, 33, false},
          {12, 16, 8, 2, 3, 21, false, true}, {12, 16, 8, 2, 3, 21, true, true},
          {16, 16, 16, 1, 2, 5, false, true}};
}

template <class E>
Tensor to_device(const std::vector<E>& v, DType dt, const Device& device) {
  Tensor host = Tensor::empty({static_cast<int64_t>(v.size())}, dt);
  std::memcpy(host.raw(), v.data(), v.size() * sizeof(E));
  Tensor out = Tensor::empty(host.shape(), dt, device);
  out.copy_from(host);
  return out;
}

template <class E>
std::vector<E> to_host(const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype());
  host.copy_from(t);  // synchronous: waits for the work enqueued before it
  const E* p = host.data<E>();
  return std::vector<E>(p, p + t.numel());
}

template <class Kernels>
void check_mamba_on_device(const MambaDeviceCase& k, const Device& memory, cudaStream_t stream,
                           typename Kernels::GemmContext gemm, uint64_t seed) {
  SCOPED_TRACE("din" + std::to_string(k.din) + " d_model" + std::to_string(k.d_model) + " N" +
               std::to_string(k.d_state) + " layers" + std::to_string(k.layers) + " B" +
               std::to_string(k.B) + " L" + std::to_string(k.L) + (k.bf16 ? " bf16" : " fp32") +
               (k.carry ? " carry" : ""));
  MambaConfig c;
  c.din = k.din, c.d_model = k.d_model, c.d_state = k.d_state, c.layers = k.layers;
  // The CPU reference in float64, on the same (float, or bf16-rounded) inputs.
  MambaModel<double> ref(c);
  ref.set_carry(k.carry);
  ref.resize(k.B, k.L, false);
  const MambaLayout& lay = ref.layout();
  std::vector<float> w(lay.params.total());
  mamba_init(c, lay, w.data(), seed);
  std::mt19937_64 rng(seed + 1);
  const auto noise = kernels::test::rand_vec(w.size(), rng, 0.02, 0.1);
  for (size_t i = 0; i < w.size(); ++i) w[i] += float(noise[i]);
  const size_t nx = size_t(k.B) * k.L * k.din, ny = size_t(k.B) * k.L * k.d_model;
  const auto x = kernels::test::cast<float>(kernels::test::rand_vec(nx, rng));
  const auto dy = kernels::test::cast<float>(kernels::test::rand_vec(ny, rng));
  std::vector<double> wd(w.begin(), w.end()), xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
  std::vector<double> y_ref(ny), g_ref(w.size(), 0.0), dx_ref(nx);
  // With carry: a first window from zero state, then the checked one continuing it on the even
  // rows and starting afresh on the odd ones.
  const auto x0 = kernels::test::cast<float>(kernels::test::rand_vec(nx, rng));
  std::vector<float> cont(size_t(k.B));
  for (int b = 0; b < k.B; ++b) cont[size_t(b)] = b % 2 == 0 ? 1.0f : 0.0f;
  if (k.carry) {
    const std::vector<double> zero(size_t(k.B), 0.0), contd(cont.begin(), cont.end());
    std::vector<double> x0d(x0.begin(), x0.end()), y0(ny);
    ref.carry(zero.data());
    ref.forward(x0d.data(), wd.data(), nullptr, y0.data());
    ref.carry(contd.data());
  }
  ref.forward(xd.data(), wd.data(), nullptr, y_ref.data());
  ref.backward(xd.data(), dyd.data(), wd.data(), nullptr, g_ref.data(), dx_ref.data());

  using Ops = ops::DeviceOps<Kernels>;
  MambaModel<float, Ops> m(c, Ops(memory, stream, gemm));
  m.set_carry(k.carry);
  m.resize(k.B, k.L, k.bf16);
  std::vector<uint16_t> wb(w.size());
  kernels::fp32_to_bf16(w.data(), wb.data(), w.size());
  Tensor d_w = to_device(w, DType::f32, memory), d_x = to_device(x, DType::f32, memory);
  Tensor d_dy = to_device(dy, DType::f32, memory);
  Tensor d_wb = to_device(wb, DType::bf16, memory);
  Tensor d_g = to_device(std::vector<float>(w.size(), 0.0f), DType::f32, memory);
  Tensor d_y = Tensor::empty({int64_t(ny)}, DType::f32, memory);
  Tensor d_dx = Tensor::empty({int64_t(nx)}, DType::f32, memory);
  const uint16_t* wbp = k.bf16 ? d_wb.data<uint16_t>() : nullptr;
  if (k.carry) {
    Tensor d_x0 = to_device(x0, DType::f32, memory);
    Tensor d_zero = to_device(std::vector<float>(size_t(k.B), 0.0f), DType::f32, memory);
    Tensor d_cont = to_device(cont, DType::f32, memory);
    m.carry(d_zero.data<float>());
    m.forward(d_x0.data<float>(), d_w.data<float>(), wbp, d_y.data<float>());
    m.carry(d_cont.data<float>());
    to_host<float>(d_cont);  // d_cont lives until the work using it is done
  }
  m.forward(d_x.data<float>(), d_w.data<float>(), wbp, d_y.data<float>());
  m.backward(d_x.data<float>(), d_dy.data<float>(), d_w.data<float>(), wbp, d_g.data<float>(),
             d_dx.data<float>());
  const auto y = to_host<float>(d_y), g = to_host<float>(d_g), dx = to_host<float>(d_dx);
  // rel_diff ignores NaN; a device op that left an element unwritten must fail here.
  for (const auto* v : {&y, &g, &dx})
    for (float e : *v) ASSERT_TRUE(std::isfinite(e)) << "non-finite output";
  // fp32: the tolerances of the CPU float model against float64 (mamba_test's FloatMatchesDouble);
  // bf16: the GEMM operands are rounded to 8 bits of mantissa.
  const double ty = k.bf16 ? 2e-2 : 2e-5, tg = k.bf16 ? 5e-2 : 2e-4;
  EXPECT_LT(kernels::test::rel_diff(y_ref, y), ty) << "y";
  EXPECT_LT(kernels::test::rel_diff(dx_ref, dx), tg) << "dx";
  for (const auto& slot : lay.params.slots()) {
    const std::vector<double> r(g_ref.begin() + long(slot.offset),
                                g_ref.begin() + long(slot.offset + slot.numel));
    const std::vector<float> d(g.begin() + long(slot.offset),
                               g.begin() + long(slot.offset + slot.numel));
    EXPECT_LT(kernels::test::rel_diff(r, d), tg) << "gradient of " << slot.name;
  }
}

}  // namespace slipstream::nn::test
