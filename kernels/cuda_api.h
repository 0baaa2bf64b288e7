// What an op header needs to declare its CUDA entry points without including CUDA: the stream
// type (the runtime's own declaration, repeated) and the bf16 element type of their signatures.
// The entry points live in namespace slipstream::kernels::cuda, take device pointers and a
// stream, enqueue their kernels on it and return without synchronising; a failed launch throws
// std::runtime_error naming the op.
#pragma once

#include <cstdint>

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace slipstream::kernels {

// A bfloat16 element in a CUDA entry point's signature: bit-compatible with __nv_bfloat16 and
// with the uint16_t bf16 arrays of the CPU kernels.
struct bfloat16 {
  uint16_t bits;
};

}  // namespace slipstream::kernels
