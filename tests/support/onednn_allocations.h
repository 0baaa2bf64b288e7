// The zero-allocation tests and oneDNN: on its GEMM paths (fp32 at AVX2 and above, native bf16),
// oneDNN's execute allocates a few small objects per product (its argument map and bookkeeping;
// the count varies with the kernel it picked). The tests hold our code to zero by running the
// counted steps with the paths off (gemm<float> then calls sgemm, gemm_bf16 widens into its
// workspace), and oneDNN's own to a small bound per product.
#pragma once

#include <cstdint>

#include "kernels/gemm_onednn.h"

namespace slipstream::testing {

// Allocations oneDNN may make per product (measured: 6.55 on average at the tests' bf16 shapes).
inline constexpr uint64_t kOnednnAllocationsPerGemm = 12;

// Turns the oneDNN path off while alive.
class WithoutOnednn {
 public:
  WithoutOnednn() : was_(kernels::set_onednn_enabled(false)) {}
  ~WithoutOnednn() { kernels::set_onednn_enabled(was_); }

 private:
  bool was_;
};

}  // namespace slipstream::testing
