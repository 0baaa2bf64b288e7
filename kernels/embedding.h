// Embedding table lookup: out[i] = table[ids[i]] for i < N; table (V, D), out (N, D).
#pragma once

#include <cstddef>
#include <cstdint>

namespace slipstream::kernels {

// ids must lie in [0, V); they are not checked.
template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* out, size_t N, size_t D);

// dtable (V, D) += scatter of dout (N, D) by ids (repeated ids sum). Thread-safe without
// atomics or scratch: tasks own disjoint column blocks of the table, each walks all ids.
template <class T>
void embedding_backward(const int32_t* ids, const T* dout, T* dtable, size_t N, size_t D);

}  // namespace slipstream::kernels
