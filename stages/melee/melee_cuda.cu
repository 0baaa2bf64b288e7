// The Melee model stages' ops on CUDA: the embedding's gather, noise and deterministic table
// gradients, and the BC loss's fused per-position statistics and logit gradients. Math of the
// CPU references in model_math.h (embed_forward/backward, bc_loss_forward/backward), against
// which tests/melee_model compares them; constants come in by value (EmbedDims), so device code
// calls no host constexpr function.
#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda_common.cuh"
#include "stages/melee/melee_kernels.h"

namespace slipstream::melee::SLIPSTREAM_KERNEL_NS {

using EmbedDims = Kernels::EmbedDims;
using HeadPointers = Kernels::HeadPointers;
using HeadGradPointers = Kernels::HeadGradPointers;
using HeadWeights = Kernels::HeadWeights;
using MirrorDraw = Kernels::MirrorDraw;

namespace {

namespace k = ::slipstream::kernels::SLIPSTREAM_KERNEL_NS;
using k::ceil_div;
using k::check_launch;
using k::grid_for;
using k::kGridThreads;

constexpr int kThreads = 256;
constexpr unsigned kFullWarp = 0xffffffffu;
// embed_backward: items summed per partial. Each block's thread per column runs through its
// chunk in order, so the chunk's length is the kernel's critical path; shorter chunks mean more
// blocks and more partials to write and sum (gpu_standard's action table: 180 chunks of 256).
constexpr size_t kItemsPerChunk = 256;

// ---------------------------------------------------------------- embedding

struct Cols {  // EmbedLayout's offsets from the dims
  int A, C, S, slot_width, stage_offset, controller_offset, prev_class_offset, raw_width, width;
  __device__ __host__ explicit Cols(const EmbedDims& d)
      : A(d.action_dim),
        C(d.character_dim),
        S(d.stage_dim),
        slot_width(kNumericFeatures + d.action_dim + d.character_dim),
        stage_offset(kSlots * slot_width),
        controller_offset(stage_offset + d.stage_dim),
        prev_class_offset(controller_offset + kControllerFeatures),
        raw_width(prev_class_offset + (d.prev_classes ? kPrevClassFeatures : 0)),
        width((raw_width + 7) / 8 * 8) {}
};

// model_math.h's prev_head_class: the class of head h of the previous input (x axes mirrored as
// the targets are). rintf rounds half to even, as the CPU's nearbyint.
__device__ __forceinline__ int prev_class_of(const float* pc, int h, bool m) {
  const float v = pc[kButtons + h];
  if (h == kShoulder) return int(rintf(fminf(fmaxf(v, 0.0f), 1.0f) * (kShoulderClasses - 1)));
  const int c = int(rintf((fminf(fmaxf(v, -1.0f), 1.0f) + 1.0f) * 0.5f * (kStickClasses - 1)));
  return m && (h == kMainX || h == kCX) ? kStickClasses - 1 - c : c;
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64, as the CPU stage
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ double uniform01(uint64_t key, uint64_t i) {
  return static_cast<double>(mix64(key + i) >> 11) * 0x1p-53;
}

__device__ __forceinline__ bool exists(const float* numeric, size_t rs) {
  return numeric[rs * kNumericFeatures + kExists] > 0.5f;
}

// Whether window w keeps its mirror flag (it continues its game: the flag is read, never
// written); otherwise the flag is drawn from the batch's key (and written by the window's first
// element alone).
__device__ __forceinline__ bool keeps_flag(const MirrorDraw& md, size_t w) {
  return md.enabled && md.continues && md.continues[w] > 0.5f;
}
__device__ __forceinline__ bool drawn_flag(const MirrorDraw& md, size_t w) {
  return md.enabled && (mix64(*md.key + w) >> 63) != 0;
}

__global__ void embed_forward_kernel(EmbedDims d, size_t rows, size_t window, const float* numeric,
                                     const int32_t* action, const int32_t* character,
                                     const int32_t* stage, const float* prev, MirrorDraw md,
                                     const float* action_table, const float* character_table,
                                     const float* stage_table, float* out, float* prev_out,
                                     __nv_bfloat16* out_bf, __nv_bfloat16* prev_bf) {
  const Cols L(d);
  const size_t n = rows * size_t(L.width);
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += size_t(gridDim.x) * blockDim.x) {
    // Row, column and window in 32-bit divisions (k::quotient): three 64-bit ones an element
    // were much of this kernel's 95 µs a launch on an H200.
    const size_t r = k::quotient(e, size_t(L.width));
    const int col = int(e - r * size_t(L.width));
    const size_t w = k::quotient(r, window);
    const bool kept = keeps_flag(md, w);
    const bool m = kept ? md.mirrored[w] != 0 : drawn_flag(md, w);
    if (e == w * window * size_t(L.width) && !kept) md.mirrored[w] = m ? 1 : 0;
    float v = 0.0f;
    if (col < L.stage_offset) {
      const int s = col / L.slot_width, f = col % L.slot_width;
      const size_t rs = r * kSlots + size_t(s);
      if (f < kNumericFeatures) {
        v = numeric[rs * kNumericFeatures + size_t(f)] * d.numeric_scale[f];
        if (m && ((d.mirror_numeric >> f) & 1u)) v = -v;
      } else if (exists(numeric, rs)) {
        if (f < kNumericFeatures + L.A) {
          const int id = action[rs];
          if (id >= 0 && id < kActionStates)
            v = action_table[size_t(id) * size_t(L.A) + size_t(f - kNumericFeatures)];
        } else {
          const int id = character[rs];
          if (id >= 0 && id < kCharacters)
            v = character_table[size_t(id) * size_t(L.C) + size_t(f - kNumericFeatures - L.A)];
        }
      }
    } else if (col < L.controller_offset) {
      const int id = stage[r];
      if (id >= 0 && id < kStages)
        v = stage_table[size_t(id) * size_t(L.S) + size_t(col - L.stage_offset)];
    } else if (col < L.prev_class_offset) {
      const int c = col - L.controller_offset;
      v = prev[r * kControllerFeatures + size_t(c)];
      if (m && ((d.mirror_controller >> c) & 1u)) v = -v;
    } else if (col < L.raw_width) {
      const int k = col - L.prev_class_offset;
      const int h = k / kStickClasses < kShoulder ? k / kStickClasses : kShoulder;
      v = prev_class_of(prev + r * kControllerFeatures, h, m) == k - h * kStickClasses ? 1.0f
                                                                                       : 0.0f;
    }
    out[e] = v;
    const __nv_bfloat16 vb = k::from_f32<__nv_bfloat16>(v);  // as fp32_to_bf16 of v
    if (out_bf) out_bf[e] = vb;
    if (col >= L.controller_offset && col < L.raw_width) {
      const size_t p =
          r * size_t(L.raw_width - L.controller_offset) + size_t(col - L.controller_offset);
      if (prev_out) prev_out[p] = v;
      if (prev_bf) prev_bf[p] = vb;
    }
  }
}

__global__ void embed_noise_kernel(EmbedDims d, size_t rows, const float* numeric,
                                   const uint64_t* batch_key, float sd, float* out,
                                   __nv_bfloat16* out_bf) {
  const uint64_t key = mix64(*batch_key ^ kEmbedNoiseSalt);
  const Cols L(d);
  const size_t n = rows * kSlots * kNumericFeatures;
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += size_t(gridDim.x) * blockDim.x) {
    const size_t rs = e / kNumericFeatures;
    if (!exists(numeric, rs)) continue;
    const size_t r = rs / kSlots, s = rs % kSlots, f = e % kNumericFeatures;
    const double u1 = 1.0 - uniform01(key, 2 * e), u2 = uniform01(key, 2 * e + 1);
    const double g = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
    const size_t o = r * size_t(L.width) + s * size_t(L.slot_width) + f;
    out[o] += sd * static_cast<float>(g);
    if (out_bf) out_bf[o] = k::from_f32<__nv_bfloat16>(out[o]);
  }
}

// One table's gradient, partial per chunk of items. A block takes one chunk and a slice of the
// table's columns, held in shared memory; thread c owns column c of the slice and adds, in item
// order, dout at the item's column into the row of the item's id (ids outside the table are
// ignored). Each cell is summed by one thread in item order, so partials repeat bit for bit.
struct TableGrad {
  const int32_t* ids;
  int id_limit;   // rows of the table
  int dim;        // columns of the table
  int per_row;    // items per position: kSlots (slot tables) or 1 (stage)
  int col_base;   // column of the item's first table column, for slot 0
  int slot_step;  // column step between slots (the slot width)
  bool needs_slot;
};

// A TableGrad with its padding zeroed: a launch's key hashes its bytes (kernels/cuda_common.cuh).
TableGrad table_grad(const int32_t* ids, int id_limit, int dim, int per_row, int col_base,
                     int slot_step, bool needs_slot) {
  auto t = k::zero_filled<TableGrad>();
  t.ids = ids;
  t.id_limit = id_limit;
  t.dim = dim;
  t.per_row = per_row;
  t.col_base = col_base;
  t.slot_step = slot_step;
  t.needs_slot = needs_slot;
  return t;
}

constexpr int kTableSlice = 8192;   // floats of a block's table slice (32 KB of shared memory)
constexpr int kTableThreads = 32;   // columns of a slice at most
constexpr int kTablePrefetch = 16;  // items whose loads are issued together

// The three tables of one backward in one launch (blockIdx.z picks the table), each with its
// items, its launch shape (chunks × column slices) and its own partials.
struct TablePartials {
  TableGrad t[3];
  size_t items[3];
  int slice[3];
  unsigned chunks[3], slices[3];
  float* part[3];
};

__global__ void __launch_bounds__(kTableThreads)
    table_partials_kernel(TablePartials tables, const float* numeric, const float* dout,
                          int width) {
  __shared__ float acc[kTableSlice];
  const int table = int(blockIdx.z);
  if (blockIdx.x >= tables.chunks[table] || blockIdx.y >= tables.slices[table]) return;
  const TableGrad& t = tables.t[table];
  const size_t items = tables.items[table];
  const int slice = tables.slice[table];
  const int col0 = int(blockIdx.y) * slice;
  const int cols = t.dim - col0 < slice ? t.dim - col0 : slice;
  const int tid = int(threadIdx.x);
  const size_t i0 = size_t(blockIdx.x) * kItemsPerChunk;
  const size_t i1 = i0 + kItemsPerChunk < items ? i0 + kItemsPerChunk : items;
  const int n = t.id_limit * cols;
  for (int k = tid; k < n; k += kTableThreads) acc[k] = 0.0f;
  __syncthreads();
  if (tid < cols) {
    const size_t col = size_t(t.col_base) + size_t(col0) + size_t(tid);
    // Items in groups of kTablePrefetch: the group's loads (id, gradient, slot flag: none
    // depends on another) are all issued before its additions.
    for (size_t g = i0; g < i1; g += kTablePrefetch) {
      int id[kTablePrefetch];
      float v[kTablePrefetch];
      bool there[kTablePrefetch];
#pragma unroll
      for (int j = 0; j < kTablePrefetch; ++j) {
        const size_t i = g + size_t(j) < i1 ? g + size_t(j) : i1 - 1;  // past the end: unused
        const size_t r = i / size_t(t.per_row), s = i % size_t(t.per_row);
        id[j] = t.ids[i];
        v[j] = dout[r * size_t(width) + s * size_t(t.slot_step) + col];
        there[j] = !t.needs_slot || exists(numeric, i);
      }
#pragma unroll
      for (int j = 0; j < kTablePrefetch; ++j)
        if (g + size_t(j) < i1 && id[j] >= 0 && id[j] < t.id_limit && there[j])
          acc[id[j] * cols + tid] += v[j];
    }
  }
  __syncthreads();
  float* out = tables.part[table] + size_t(blockIdx.x) * size_t(t.id_limit) * size_t(t.dim) + col0;
  for (int k = tid; k < n; k += kTableThreads) {
    const int row = k / cols, c = k - row * cols;
    out[size_t(row) * size_t(t.dim) + size_t(c)] = acc[k];
  }
}

size_t table_cells(const TableGrad& t) {
  return size_t(t.id_limit) * size_t(t.dim);
}
unsigned table_chunks(size_t items) {
  return ceil_div(items, kItemsPerChunk);
}

// The three tables' partials (one launch), then their sums (one launch), each table's partials
// at its own place in the workspace.
void tables_backward(const TableGrad (&g)[3], const size_t (&items)[3], const float* numeric,
                     const float* dout, int width, float* const (&dtable)[3], float* part,
                     cudaStream_t stream) {
  auto tables = k::zero_filled<TablePartials>();
  unsigned chunks = 0, slices = 0;
  size_t offset = 0;
  for (int k = 0; k < 3; ++k) {
    const TableGrad& t = g[k];
    const int fit = kTableSlice / t.id_limit;
    if (fit < 1)
      throw std::invalid_argument("embed_backward: a table of " + std::to_string(t.id_limit) +
                                  " rows does not fit the kernel's shared memory");
    tables.t[k] = t;
    tables.items[k] = items[k];
    tables.slice[k] = std::min({t.dim, kTableThreads, fit});
    tables.chunks[k] = table_chunks(items[k]);
    tables.slices[k] = ceil_div(size_t(t.dim), size_t(tables.slice[k]));
    tables.part[k] = part + offset;
    offset += size_t(tables.chunks[k]) * table_cells(t);
    chunks = std::max(chunks, tables.chunks[k]);
    slices = std::max(slices, tables.slices[k]);
  }
  if (chunks == 0) return;
  SLIPSTREAM_LAUNCH(table_partials_kernel, dim3(chunks, slices, 3), dim3(kTableThreads), stream,
                    tables, numeric, dout, width);
  check_launch("embed_backward");
  k::sum_partials_group<float>(
      {{tables.part[0], table_cells(g[0]), dtable[0], 0, 0, nullptr, int(tables.chunks[0])},
       {tables.part[1], table_cells(g[1]), dtable[1], 0, 0, nullptr, int(tables.chunks[1])},
       {tables.part[2], table_cells(g[2]), dtable[2], 0, 0, nullptr, int(tables.chunks[2])}},
      int(chunks), true, stream, "embed_backward");
}

// The sorted form (EmbedBackwardVariant::sorted): the three tables at once, no dense partials.
// A stable counting sort groups each table's items by id (a block ranks a chunk of items among
// themselves, no atomics; one block a table turns the chunks' counts into offsets), then a warp
// sums each piece of at most kPieceItems items of one id in item order and a warp per table row
// adds the row's pieces in order. Every sum has a fixed order: the result repeats bit for bit.
constexpr int kSortChunk = 256;      // items a block ranks; its threads
constexpr int kPieceItems = 128;     // items a warp adds in order before the pieces are added
constexpr int kMaxSortedIds = 1024;  // rows of a table the offsets block handles (a thread each)

struct SortedTable {
  TableGrad g;
  size_t items;
  unsigned chunks;
  int32_t* counts;      // (chunks, id_limit): each chunk's items per id, then those before it
  int32_t* perm;        // (items): the valid items, grouped by id, in item order within an id
  int32_t* seg_start;   // (id_limit): the id's first place in perm
  int32_t* seg_len;     // (id_limit)
  int32_t* piece_base;  // (id_limit + 1): the id's first piece; [id_limit] all pieces
  float* pieces;        // (pieces at most, dim)
  float* dtable;
};
struct SortedTables {
  SortedTable t[3];
};

// Item i's table row, or -1 when it adds nothing (an id out of range, an absent character).
__device__ __forceinline__ int item_key(const TableGrad& g, const float* numeric, size_t i) {
  const int id = g.ids[i];
  return id >= 0 && id < g.id_limit && (!g.needs_slot || exists(numeric, i)) ? id : -1;
}

// The chunk's keys in shared memory; returns this thread's key and sets how many earlier items
// of the chunk share it, and whether a later one does.
__device__ __forceinline__ int chunk_rank(const SortedTable& T, const float* numeric, int* keys,
                                          int& before, bool& last) {
  const int tid = int(threadIdx.x);
  const size_t i = size_t(blockIdx.x) * kSortChunk + size_t(tid);
  keys[tid] = i < T.items ? item_key(T.g, numeric, i) : -1;
  __syncthreads();
  const int k = keys[tid];
  before = 0;
  last = true;
  for (int j = 0; j < kSortChunk; ++j) {
    const bool same = keys[j] == k;
    before += same && j < tid;
    last = last && !(same && j > tid);
  }
  return k;
}

__global__ void __launch_bounds__(kSortChunk)
    table_count_kernel(SortedTables s, const float* numeric) {
  const SortedTable& T = s.t[blockIdx.y];
  if (blockIdx.x >= T.chunks) return;  // the whole block: tables have their own chunk counts
  __shared__ int keys[kSortChunk];
  int32_t* counts = T.counts + size_t(blockIdx.x) * size_t(T.g.id_limit);
  for (int r = int(threadIdx.x); r < T.g.id_limit; r += kSortChunk) counts[r] = 0;
  int before;
  bool last;
  const int k = chunk_rank(T, numeric, keys, before, last);  // its barrier orders the zeroing
  if (k >= 0 && last) counts[k] = before + 1;
}

// A thread an id: its count in each chunk becomes the count of the chunks before (loads issued
// kOffsetBatch at a time: the chunks' counts do not depend on each other), then scans over the
// ids give each id its place in perm and its first piece.
constexpr int kOffsetBatch = 16;
__global__ void __launch_bounds__(kMaxSortedIds) table_offsets_kernel(SortedTables s) {
  const SortedTable& T = s.t[blockIdx.y];
  const int id = int(threadIdx.x), L = T.g.id_limit;
  __shared__ int total[kMaxSortedIds], pieces[kMaxSortedIds];
  int run = 0;  // this id's items in the chunks before
  if (id < L)
    for (unsigned c0 = 0; c0 < T.chunks; c0 += kOffsetBatch) {
      int n[kOffsetBatch];
#pragma unroll
      for (int j = 0; j < kOffsetBatch; ++j)
        n[j] = c0 + j < T.chunks ? T.counts[size_t(c0 + j) * size_t(L) + size_t(id)] : 0;
#pragma unroll
      for (int j = 0; j < kOffsetBatch; ++j)
        if (c0 + j < T.chunks) {
          T.counts[size_t(c0 + j) * size_t(L) + size_t(id)] = run;
          run += n[j];
        }
    }
  const int mine = (run + kPieceItems - 1) / kPieceItems;
  total[id] = run;
  pieces[id] = mine;
  __syncthreads();
  for (int off = 1; off < kMaxSortedIds; off *= 2) {  // inclusive scans over the ids
    const int a = id >= off ? total[id - off] : 0, b = id >= off ? pieces[id - off] : 0;
    __syncthreads();
    total[id] += a;
    pieces[id] += b;
    __syncthreads();
  }
  if (id >= L) return;
  T.seg_start[id] = total[id] - run;
  T.seg_len[id] = run;
  T.piece_base[id] = pieces[id] - mine;
  if (id == L - 1) T.piece_base[L] = pieces[id];
}

__global__ void __launch_bounds__(kSortChunk)
    table_scatter_kernel(SortedTables s, const float* numeric) {
  const SortedTable& T = s.t[blockIdx.y];
  if (blockIdx.x >= T.chunks) return;
  __shared__ int keys[kSortChunk];
  int before;
  bool last;
  const int k = chunk_rank(T, numeric, keys, before, last);
  if (k < 0) return;
  const int at =
      T.seg_start[k] + T.counts[size_t(blockIdx.x) * size_t(T.g.id_limit) + size_t(k)] + before;
  T.perm[at] = int32_t(size_t(blockIdx.x) * kSortChunk + threadIdx.x);
}

// A warp a piece: its id's items from seg_start + kPieceItems · (its rank among the id's pieces),
// added in order; lanes over the table's columns. The items come 32 at a time, their indices
// one per lane, so the 32 rows' loads are all in flight before the additions.
__global__ void table_piece_sums_kernel(SortedTables s, const float* dout, int width) {
  const SortedTable& T = s.t[blockIdx.y];
  const int lane = int(threadIdx.x % 32), L = T.g.id_limit;
  const int p = int((size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  if (p >= T.piece_base[L]) return;  // a whole warp
  int lo = 0, hi = L - 1;            // the last id whose first piece is at or before p
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (T.piece_base[mid] <= p)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int first = T.seg_start[lo] + (p - T.piece_base[lo]) * kPieceItems;
  const int seg_end = T.seg_start[lo] + T.seg_len[lo];
  const int end = first + kPieceItems < seg_end ? first + kPieceItems : seg_end;
  const size_t per = size_t(T.g.per_row), base = size_t(T.g.col_base);
  for (int c0 = 0; c0 < T.g.dim; c0 += 32) {
    const int c = c0 + lane;
    float acc = 0.0f;
    for (int b = first; b < end; b += 32) {
      const int n = end - b < 32 ? end - b : 32;
      const int mine = lane < n ? T.perm[b + lane] : 0;
      float v[32];
#pragma unroll
      for (int q = 0; q < 32; ++q) {
        const size_t i = size_t(__shfl_sync(kFullWarp, mine, q));
        v[q] =
            q < n && c < T.g.dim
                ? dout[i / per * size_t(width) + i % per * size_t(T.g.slot_step) + base + size_t(c)]
                : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < 32; ++q)
        if (q < n) acc += v[q];
    }
    if (c < T.g.dim) T.pieces[size_t(p) * size_t(T.g.dim) + size_t(c)] = acc;
  }
}

// A warp a table row: its pieces added in order, then onto the gradient.
__global__ void table_rows_kernel(SortedTables s) {
  const SortedTable& T = s.t[blockIdx.y];
  const int lane = int(threadIdx.x % 32);
  const int id = int((size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  if (id >= T.g.id_limit) return;
  const int p0 = T.piece_base[id], p1 = T.piece_base[id + 1];
  for (int c = lane; c < T.g.dim; c += 32) {
    float acc = 0.0f;
    for (int p = p0; p < p1; ++p) acc += T.pieces[size_t(p) * size_t(T.g.dim) + size_t(c)];
    T.dtable[size_t(id) * size_t(T.g.dim) + size_t(c)] += acc;
  }
}

// The sorted form's workspace for one table, laid out from `at` (null: only counted).
size_t sorted_table_layout(SortedTable& T, char* at) {
  const size_t L = size_t(T.g.id_limit);
  const size_t piece_count = ceil_div(T.items, kPieceItems) + L;
  size_t used = 0;
  auto take = [&](size_t bytes) {
    char* p = at ? at + used : nullptr;
    used += (bytes + 255) / 256 * 256;
    return p;
  };
  T.counts = reinterpret_cast<int32_t*>(take(size_t(T.chunks) * L * sizeof(int32_t)));
  T.perm = reinterpret_cast<int32_t*>(take(T.items * sizeof(int32_t)));
  T.seg_start = reinterpret_cast<int32_t*>(take(L * sizeof(int32_t)));
  T.seg_len = reinterpret_cast<int32_t*>(take(L * sizeof(int32_t)));
  T.piece_base = reinterpret_cast<int32_t*>(take((L + 1) * sizeof(int32_t)));
  T.pieces = reinterpret_cast<float*>(take(piece_count * size_t(T.g.dim) * sizeof(float)));
  return used;
}

// The three tables' sorted forms over `workspace` (null: sizes only); the bytes they take.
size_t sorted_tables(SortedTables& s, const TableGrad (&g)[3], const size_t (&items)[3],
                     float* const (&dtable)[3], void* workspace) {
  size_t used = 0;
  for (int k = 0; k < 3; ++k) {
    SortedTable& T = s.t[k];
    T.g = g[k];
    T.items = items[k];
    T.chunks = ceil_div(items[k], kSortChunk);
    T.dtable = dtable[k];
    used += sorted_table_layout(T, workspace ? static_cast<char*>(workspace) + used : nullptr);
  }
  return used;
}

void sorted_backward(const TableGrad (&g)[3], const size_t (&items)[3], const float* numeric,
                     const float* dout, int width, float* const (&dtable)[3], void* workspace,
                     cudaStream_t stream) {
  auto s = k::zero_filled<SortedTables>();
  sorted_tables(s, g, items, dtable, workspace);
  unsigned chunks = 0, pieces = 0;
  int ids = 0;
  for (const SortedTable& T : s.t) {
    if (T.g.id_limit > kMaxSortedIds)
      throw std::invalid_argument("embed_backward: a table of " + std::to_string(T.g.id_limit) +
                                  " rows is more than the sorted form's " +
                                  std::to_string(kMaxSortedIds));
    chunks = std::max(chunks, T.chunks);
    pieces = std::max(pieces, ceil_div(T.items, kPieceItems) + unsigned(T.g.id_limit));
    ids = std::max(ids, T.g.id_limit);
  }
  if (chunks == 0) return;
  SLIPSTREAM_LAUNCH(table_count_kernel, dim3(chunks, 3), dim3(kSortChunk), stream, s, numeric);
  check_launch("embed_backward (count)");
  SLIPSTREAM_LAUNCH(table_offsets_kernel, dim3(1, 3), dim3(kMaxSortedIds), stream, s);
  check_launch("embed_backward (offsets)");
  SLIPSTREAM_LAUNCH(table_scatter_kernel, dim3(chunks, 3), dim3(kSortChunk), stream, s, numeric);
  check_launch("embed_backward (scatter)");
  SLIPSTREAM_LAUNCH(table_piece_sums_kernel, dim3(ceil_div(size_t(pieces) * 32, kThreads), 3),
                    dim3(kThreads), stream, s, dout, width);
  check_launch("embed_backward (piece sums)");
  SLIPSTREAM_LAUNCH(table_rows_kernel, dim3(ceil_div(size_t(ids) * 32, kThreads), 3),
                    dim3(kThreads), stream, s);
  check_launch("embed_backward (rows)");
}

// ---------------------------------------------------------------- BC loss

__device__ __forceinline__ int classes_of(int stick_head) {
  return stick_head == kShoulder ? kShoulderClasses : kStickClasses;
}
__device__ __forceinline__ bool mirrors_stick(int stick_head) {
  return stick_head == kMainX || stick_head == kCX;
}

// The stick head's target at position i after mirroring; -1 when the position is not valid.
__device__ __forceinline__ int stick_target(const int32_t* ts, size_t i, int h, bool valid,
                                            bool m) {
  if (!valid) return -1;
  int c = ts[i * kStickHeads + size_t(h)];
  if (m && mirrors_stick(h)) c = kStickClasses - 1 - c;
  return c;
}

__device__ __forceinline__ bool labels_ok(const int32_t* ts, size_t i) {
  for (int h = 0; h < kStickHeads; ++h) {
    const int c = ts[i * kStickHeads + size_t(h)];
    if (c < 0 || c >= classes_of(h)) return false;
  }
  return true;
}

// Position i's statistics into st (kBcStats).
__device__ void bc_row_stats(const HeadPointers& lg, const float* tb, const int32_t* ts,
                             const float* mask, const uint8_t* mirrored, const float* prev,
                             size_t i, size_t window, float eps, float* st) {
  for (int c = 0; c < kBcStats; ++c) st[c] = 0.0f;
  const bool valid = mask[i] > 0.0f;
  if (!valid) return;
  if (!labels_ok(ts, i)) {
    st[kBcBadLabel] = 1.0f;
    return;
  }
  const float w = mask[i];
  const bool m = mirrored && mirrored[i / window];
  st[kBcWeight] = w;
  {  // does the label repeat the previous input? (raw tensors: a mirror flips both alike)
    const float* pc = prev + i * kControllerFeatures;
    for (int b = 0; b < kButtons; ++b)
      st[kBcSame + b] = (tb[i * kButtons + size_t(b)] > 0.5f) == (pc[b] > 0.5f) ? w : 0.0f;
    for (int h = 0; h < kStickHeads; ++h)
      st[kBcSame + kButtons + h] =
          ts[i * kStickHeads + size_t(h)] == prev_class_of(pc, h, false) ? w : 0.0f;
  }
  // Where an item's label differs from the previous input (kBcSame left 0), its rightness and
  // NLL count toward the changed items' figures.
  bool every = true, unchanged = true, recorded_acts = false, likely_acts = false;
  float log_still = 0;  // log P(the controller drawn at temperature 1 does nothing)
  {                     // buttons: BCE per button, summed; accuracy the fraction of the 8
    float loss = 0, nll = 0, correct = 0, changed_right = 0, changed_nll = 0;
    for (int b = 0; b < kButtons; ++b) {
      const float x = lg.logits[0][i * kButtons + size_t(b)], y = tb[i * kButtons + size_t(b)];
      const float ys = y * (1.0f - eps) + eps / 2.0f;
      const float soft = log1pf(expf(-fabsf(x)));
      const float item_nll = fmaxf(x, 0.0f) - x * y + soft;
      const bool ok = (x > 0.0f) == (y > 0.5f);
      loss += fmaxf(x, 0.0f) - x * ys + soft;
      nll += item_nll;
      correct += ok ? 1.0f : 0.0f;
      every = every && ok;
      recorded_acts = recorded_acts || y > 0.5f;
      likely_acts = likely_acts || x > 0.0f;
      log_still -= fmaxf(x, 0.0f) + soft;
      if (st[kBcSame + b] == 0.0f) {
        unchanged = false;
        changed_right += ok ? 1.0f : 0.0f;
        changed_nll += item_nll;
      }
    }
    st[kBcLoss] = w * loss;
    st[kBcNll] = w * nll;
    st[kBcCorrect] = w * (correct / kButtons);
    st[kBcChangedRight] = w * changed_right;
    st[kBcChangedNll] = w * changed_nll;
  }
  for (int h = 0; h < kStickHeads; ++h) {
    const int K = classes_of(h);
    const float* x = lg.logits[h + 1] + i * size_t(K);
    const int c = stick_target(ts, i, h, true, m);
    int am = 0;
    for (int q = 1; q < K; ++q)
      if (x[q] > x[am]) am = q;
    const float mx = x[am];
    float se = 0, sx = 0;
    for (int q = 0; q < K; ++q) {
      se += expf(x[q] - mx);
      sx += x[q];
    }
    const float lse = mx + logf(se);
    const float off = eps / float(K), on = 1.0f - eps + eps / float(K);
    float* sh = st + kBcPerHead * (h + 1);
    sh[kBcLoss] = w * (lse - (off * sx + (on - off) * x[c]));
    sh[kBcNll] = w * (lse - x[c]);
    sh[kBcCorrect] = am == c ? w : 0.0f;
    every = every && am == c;
    const int rest = h == kShoulder ? 0 : kStickClasses / 2;  // mirrors to itself
    recorded_acts = recorded_acts || c != rest;
    likely_acts = likely_acts || am != rest;
    log_still += x[rest] - lse;
    if (st[kBcSame + kButtons + h] == 0.0f) {
      unchanged = false;
      st[kBcChangedRight + h + 1] = am == c ? w : 0.0f;
      st[kBcChangedNll + h + 1] = w * (lse - x[c]);
    }
  }
  st[kBcAllRight] = every ? w : 0.0f;
  st[kBcUnchanged] = unchanged ? w : 0.0f;
  st[kBcActsRecorded] = recorded_acts ? w : 0.0f;
  st[kBcActsSampled] = w * -expm1f(log_still);
  st[kBcActsLikely] = likely_acts ? w : 0.0f;
}

SLIPSTREAM_BLOCK_COUNTER(bc_rows_blocks);

// A thread a position: its statistics; with `sums`, the block's column sums of its rows into a
// partial (kGroups lanes a column over every kGroups-th row, then the lanes in order), and the
// last block to finish stores the partials' sums (k::sum_partials_in_block's order).
constexpr int kStatCols = 64, kStatGroups = kThreads / kStatCols;
static_assert(kBcStats <= kStatCols, "a block sums the statistics 64 columns wide");
__global__ void __launch_bounds__(kThreads)
    bc_loss_rows_kernel(HeadPointers lg, const float* tb, const int32_t* ts, const float* mask,
                        const uint8_t* mirrored, const float* prev, size_t M, size_t window,
                        float eps, float* stats, float* part, float* sums) {
  __shared__ float lanes[kThreads];
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < M) bc_row_stats(lg, tb, ts, mask, mirrored, prev, i, window, eps, stats + i * kBcStats);
  if (!sums) return;
  __syncthreads();  // the block's rows written (visible to the block after the barrier)
  const int c = int(threadIdx.x) % kStatCols, g = int(threadIdx.x) / kStatCols;
  const size_t r0 = size_t(blockIdx.x) * kThreads;
  const size_t r1 = M < r0 + kThreads ? M : r0 + kThreads;
  float s = 0.0f;
  if (c < kBcStats)
    for (size_t r = r0 + size_t(g); r < r1; r += kStatGroups) s += stats[r * kBcStats + size_t(c)];
  lanes[g * kStatCols + c] = s;
  __syncthreads();
  if (g == 0 && c < kBcStats) {
    float t = 0.0f;
    for (int l = 0; l < kStatGroups; ++l) t += lanes[l * kStatCols + c];
    part[size_t(blockIdx.x) * kBcStats + size_t(c)] = t;
  }
  if (k::last_block(&bc_rows_blocks))
    k::sum_partials_in_block(part, int(gridDim.x), size_t(kBcStats), sums, false, lanes);
}

__global__ void bc_loss_backward_kernel(HeadPointers lg, const float* tb, const int32_t* ts,
                                        const float* mask, const uint8_t* mirrored, size_t M,
                                        size_t window, float eps, HeadWeights hw, const float* sums,
                                        HeadGradPointers dl) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M) return;
  const float ws = sums[kBcWeight];
  const bool valid = mask[i] > 0.0f && labels_ok(ts, i) && ws > 0.0f;
  const float w = valid ? mask[i] : 0.0f;
  const bool m = mirrored && mirrored[i / window];
  for (int b = 0; b < kButtons; ++b) {
    const size_t e = i * kButtons + size_t(b);
    const float x = lg.logits[0][e], ys = tb[e] * (1.0f - eps) + eps / 2.0f;
    const float ex = expf(-fabsf(x));
    const float s = x >= 0.0f ? 1.0f / (1.0f + ex) : ex / (1.0f + ex);
    dl.dlogits[0][e] = valid ? (s - ys) * (w * (hw.w[0] / ws)) : 0.0f;
  }
  for (int h = 0; h < kStickHeads; ++h) {
    const int K = classes_of(h);
    const float* x = lg.logits[h + 1] + i * size_t(K);
    float* g = dl.dlogits[h + 1] + i * size_t(K);
    if (!valid) {
      for (int q = 0; q < K; ++q) g[q] = 0.0f;
      continue;
    }
    const int c = stick_target(ts, i, h, true, m);
    const float scale = w * (hw.w[h + 1] / ws);
    float mx = x[0];
    for (int q = 1; q < K; ++q) mx = fmaxf(mx, x[q]);
    float se = 0;
    for (int q = 0; q < K; ++q) se += expf(x[q] - mx);
    const float inv = 1.0f / se;
    const float off = eps / float(K), on = 1.0f - eps + eps / float(K);
    for (int q = 0; q < K; ++q) g[q] = (expf(x[q] - mx) * inv - (q == c ? on : off)) * scale;
  }
}

// ---------------------------------------------------------------- autoregressive heads

// model_math.h's item order: the 8 buttons, then main x, main y, c x, c y (17 columns each) and
// the shoulder (5).
__device__ __forceinline__ int ar_first_column(int item) {
  return item < kButtons ? item : kButtons + kStickClasses * (item - kButtons);
}
__device__ __forceinline__ int ar_width(int item) {
  return item < kButtons ? 1 : item == kButtons + kShoulder ? kShoulderClasses : kStickClasses;
}
__device__ __forceinline__ int ar_item(int column) {
  if (column < kButtons) return column;
  const int h = (column - kButtons) / kStickClasses;  // the shoulder's 5 columns: h = 4
  return kButtons + (h < kShoulder ? h : kShoulder);
}

__global__ void ar_teacher_kernel(size_t M, size_t window, const float* tb, const int32_t* ts,
                                  const uint8_t* mirrored, float* teacher) {
  const size_t n = M * kHeadsWidth;
  for (size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += size_t(gridDim.x) * blockDim.x) {
    const size_t i = e / kHeadsWidth;
    const int col = int(e % kHeadsWidth);
    float v = 0;
    if (col < kButtons) {
      v = tb[i * kButtons + col] > 0.5f ? 1.0f : 0.0f;
    } else {
      const int h = ar_item(col) - kButtons;
      int c = ts[i * kStickHeads + h];
      const int classes = h == kShoulder ? kShoulderClasses : kStickClasses;
      if (c >= 0 && c < classes) {
        if (mirrored && mirrored[i / window] && (h == kMainX || h == kCX))
          c = kStickClasses - 1 - c;
        v = col - ar_first_column(kButtons + h) == c ? 1.0f : 0.0f;
      }
    }
    teacher[e] = v;
  }
}

__global__ void ar_mask_kernel(float* Wa) {
  const int e = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= kHeadsWidth * kHeadsWidth) return;
  if (ar_item(e % kHeadsWidth) >= ar_item(e / kHeadsWidth)) Wa[e] = 0;
}

// One thread a position: the items depend on each other in order, the positions do not.
__global__ void ar_decode_kernel(size_t M, const float* Wa, float* logits) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M) return;
  float* z = logits + i * kHeadsWidth;
  int chosen[kButtons + kStickHeads];
  for (int k = 0; k < kButtons + kStickHeads; ++k) {
    const int c0 = ar_first_column(k), n = ar_width(k);
    int best = 0;
    float best_z = 0;
    for (int q = 0; q < n; ++q) {
      const int r = c0 + q;
      float v = z[r];
      for (int j = 0; j < k; ++j)
        if (chosen[j] >= 0) v += Wa[r * kHeadsWidth + chosen[j]];
      z[r] = v;
      if (q == 0 || v > best_z) best = q, best_z = v;
    }
    chosen[k] = k < kButtons ? (best_z > 0.0f ? c0 : -1) : c0 + best;
  }
}

// ---------------------------------------------------------------- the heads' columns

// Column c of the fused (M, 81) logits: its head and the column within the head.
__device__ __forceinline__ int head_of_column(int c) {
  return c < kButtons ? 0 : 1 + ar_item(c) - kButtons;
}
__device__ __forceinline__ int head_width_of(int h) {
  return h == 0 ? kButtons : classes_of(h - 1);
}

__global__ void heads_split_kernel(const float* logits, const float* bias, size_t M,
                                   HeadGradPointers out) {
  for (size_t i = k::grid_start(); i < M * kHeadsWidth; i += k::grid_stride()) {
    const size_t row = i / kHeadsWidth;
    const int c = int(i % kHeadsWidth), h = head_of_column(c), w = head_width_of(h);
    out.dlogits[h][row * size_t(w) + size_t(c - ar_first_column(h == 0 ? 0 : kButtons + h - 1))] =
        bias ? logits[i] + bias[c] : logits[i];
  }
}

constexpr int kSmallHeadsWarps = 8;  // columns of the 81 a block

// Warp w of block x: column c = 8x + w of the fused logits for each of the M ≤ kRows rows, x's
// product then prev's (lanes striding over K, coalesced reads of the weights' rows), a butterfly,
// the bias; lane m stores row m's into its head's output.
template <class DT, int kRows>
__global__ void __launch_bounds__(kSmallHeadsWarps * 32)
    heads_small_rows_kernel(int M, const DT* x, int H, const DT* Wo, const DT* prev, int P,
                            const DT* Wp, const float* bias, HeadGradPointers out) {
  const int lane = int(threadIdx.x) & 31;
  const int c = int(blockIdx.x) * kSmallHeadsWarps + (int(threadIdx.x) >> 5);
  if (c >= kHeadsWidth) return;  // a whole warp: no shuffle follows for it
  float acc[kRows];
#pragma unroll
  for (int m = 0; m < kRows; ++m) acc[m] = 0.f;
  k::lanes_dot_rows(M, x, size_t(H), Wo + size_t(c) * size_t(H), H, acc);
  if (P > 0) k::lanes_dot_rows(M, prev, size_t(P), Wp + size_t(c) * size_t(P), P, acc);
  const int h = head_of_column(c), w = head_width_of(h);
  const int col = c - ar_first_column(h == 0 ? 0 : kButtons + h - 1);
  // Head h's output by selects (out.dlogits[h] with h varying would copy the six pointers into
  // local memory).
  float* dst = out.dlogits[0];
#pragma unroll
  for (int j = 1; j < kHeads; ++j) dst = h == j ? out.dlogits[j] : dst;
#pragma unroll
  for (int m = 0; m < kRows; ++m) {
    const float v = k::group_sum<32>(acc[m]);
    if (m < M && lane == m) dst[size_t(m) * size_t(w) + size_t(col)] = v + bias[c];
  }
}

constexpr int kJoinThreads = 96;  // a thread a column of the 81 (three warps)
constexpr size_t kJoinRows = 64;  // rows a block: one partial of the bias gradient
constexpr int kJoinLoads = 16;    // rows whose loads a thread has in flight at once
static_assert(kHeadsWidth <= kJoinThreads, "a block is as wide as the fused logits");

SLIPSTREAM_BLOCK_COUNTER(heads_join_blocks);

// Rows [blockIdx.x * kJoinRows, +kJoinRows), thread c column c: the gradient gathered from its
// head and its bf16 copy, and (with dbias) the column's sum over the rows in order as a partial,
// which the launch's last block adds onto dbias (k::sum_partials_in_block's order).
__global__ void __launch_bounds__(kJoinThreads)
    heads_join_kernel(HeadPointers dout, size_t M, float* dlogits, __nv_bfloat16* dlogits_bf,
                      float* part, float* dbias) {
  __shared__ float lanes[kJoinThreads];
  const int c = int(threadIdx.x);
  const size_t r0 = size_t(blockIdx.x) * kJoinRows;
  const size_t r1 = M < r0 + kJoinRows ? M : r0 + kJoinRows;
  float acc = 0.0f;
  if (c < kHeadsWidth) {
    const int h = head_of_column(c), w = head_width_of(h);
    const size_t cc = size_t(c - ar_first_column(h == 0 ? 0 : kButtons + h - 1));
    const float* d = dout.logits[h];
    // kJoinLoads rows' loads issued before their stores and sums (in row order, as one at a
    // time would): three warps a block wait on memory once a group, not once a row (on an H200
    // at production, 54 µs a launch against 78 µs one row at a time).
    for (size_t g = r0; g < r1; g += kJoinLoads) {
      float v[kJoinLoads];
#pragma unroll
      for (int j = 0; j < kJoinLoads; ++j)
        v[j] = d && g + j < r1 ? d[(g + j) * size_t(w) + cc] : 0.0f;
#pragma unroll
      for (int j = 0; j < kJoinLoads; ++j) {
        if (g + j >= r1) break;
        const size_t i = (g + j) * kHeadsWidth + size_t(c);
        dlogits[i] = v[j];
        if (dlogits_bf) dlogits_bf[i] = k::from_f32<__nv_bfloat16>(v[j]);  // as fp32_to_bf16
        acc += v[j];
      }
    }
  }
  if (!dbias) return;
  if (c < kHeadsWidth) part[size_t(blockIdx.x) * kHeadsWidth + size_t(c)] = acc;
  if (k::last_block(&heads_join_blocks))
    k::sum_partials_in_block(part, int(gridDim.x), size_t(kHeadsWidth), dbias, true, lanes);
}

// ---------------------------------------------------------------- the policy's draws

constexpr int kChooseThreads = 128;  // a warp a game: 4 games a block

// controller_choice.h's item_uniform.
__device__ __forceinline__ float item_uniform(uint64_t frame_key, int item) {
  return float(mix64(frame_key + uint64_t(item)) >> 40) * 0x1p-24f;
}
__device__ __forceinline__ float warp_max(float v) {  // exact in any order
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, off));
  return v;
}
// The lane holding the largest v, the lowest such lane on ties (std::max_element's choice).
__device__ __forceinline__ int warp_argmax(float v, int lane) {
  int at = lane;
  for (int off = 16; off > 0; off /= 2) {
    const float ov = __shfl_xor_sync(kFullWarp, v, off);
    const int oat = __shfl_xor_sync(kFullWarp, at, off);
    if (ov > v || (ov == v && oat < at)) v = ov, at = oat;
  }
  return at;
}
// Σ lanes 0..n-1 of v, added in lane order as the CPU's loop adds: every lane gets it.
__device__ __forceinline__ float lane_order_sum(float v, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += __shfl_sync(kFullWarp, v, i);
  return s;
}

// One warp a game; lane q holds class q of the head or item at hand. The float operations are
// controller_choice.h's and the policy's softmax in their order (the sums in class order by
// lane_order_sum, the draw's product unfused by __fmul_rn), so the emulator reproduces the CPU
// bit for bit and a GPU differs only by its expf's last bits.
__global__ void policy_choose_kernel(HeadPointers L, const float* ar, float temperature,
                                     const uint64_t* game_keys, uint64_t* frames, size_t games,
                                     float* dist, int32_t* chosen) {
  const int lane = int(threadIdx.x % 32);
  const size_t g = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (g >= games) return;  // a whole warp: games are whole warps
  float* d = dist + g * kHeadsWidth;
  // The distribution: sigmoid of the button logits, softmax of each stick head's.
  if (lane < kButtons) d[lane] = 1.0f / (1.0f + expf(-L.logits[0][g * kButtons + lane]));
  for (int h = 1; h < kHeads; ++h) {
    const int n = classes_of(h - 1);
    const float v = lane < n ? L.logits[h][g * size_t(n) + lane] : -INFINITY;
    const float m = warp_max(v);
    const float e = lane < n ? expf(v - m) : 0.0f;
    const float sum = lane_order_sum(e, n);
    if (lane < n) d[ar_first_column(kButtons + h - 1) + lane] = e / sum;
  }
  // The most likely item of each kind, which the autoregressive heads' logits are conditioned
  // on (controller_choice.h's `likely`), then the items drawn in order.
  int likely[kArItems], drawn[kArItems];
  auto logit = [&](int k, int q) {  // item k's raw logit of class q (q < its width)
    return k < kButtons ? L.logits[0][g * kButtons + k]
                        : L.logits[k - kButtons + 1][g * size_t(ar_width(k)) + q];
  };
  if (ar)
    for (int k = 0; k < kArItems; ++k) {
      const int n = ar_width(k);
      const float v = lane < n ? logit(k, lane) : -INFINITY;
      likely[k] = k < kButtons ? (__shfl_sync(kFullWarp, v, 0) > 0.0f ? k : -1)
                               : ar_first_column(k) + warp_argmax(v, lane);
    }
  const uint64_t frame = frames[g];
  const uint64_t key = mix64(game_keys[g] ^ mix64(frame));  // controller_choice.h's frame_draws_key
  uint32_t buttons = 0;
  int classes[kStickHeads] = {};
  for (int k = 0; k < kArItems; ++k) {
    const int c0 = ar_first_column(k), n = ar_width(k);
    float z = lane < n ? logit(k, lane) : -INFINITY;
    if (ar && lane < n) {
      const float* row = ar + size_t(c0 + lane) * kHeadsWidth;
      for (int j = 0; j < k; ++j) {
        if (drawn[j] == likely[j]) continue;
        if (drawn[j] >= 0) z += row[drawn[j]];
        if (likely[j] >= 0) z -= row[likely[j]];
      }
    }
    const float u = item_uniform(key, k);
    if (k < kButtons) {
      const float z0 = __shfl_sync(kFullWarp, z, 0);
      const bool pressed =
          temperature <= 0.0f ? z0 > 0.0f : u < 1.0f / (1.0f + expf(-z0 / temperature));
      drawn[k] = pressed ? c0 : -1;
      if (pressed) buttons |= 1u << k;
      continue;
    }
    int cls;
    if (temperature <= 0.0f) {
      cls = warp_argmax(z, lane);
    } else {
      const float m = warp_max(z);
      const float w = lane < n ? expf((z - m) / temperature) : 0.0f;
      float target = __fmul_rn(u, lane_order_sum(w, n));
      int last = 0;
      cls = -1;
      for (int i = 0; i < n; ++i) {  // every lane walks the same weights in class order
        const float wi = __shfl_sync(kFullWarp, w, i);
        if (cls >= 0) continue;
        if (wi > 0.0f) last = i;
        if ((target -= wi) < 0.0f) cls = i;
      }
      if (cls < 0) cls = last;
    }
    classes[k - kButtons] = cls;
    drawn[k] = c0 + cls;
  }
  if (lane == 0) {
    frames[g] = frame + 1;  // the game's next frame draws with the next key
    int32_t* c = chosen + g * (1 + kStickHeads);
    c[0] = int32_t(buttons);
    for (int h = 0; h < kStickHeads; ++h) c[1 + h] = classes[h];
  }
}

}  // namespace

void Kernels::embed_forward(const EmbedDims& d, size_t rows, size_t window, const float* numeric,
                            const int32_t* action, const int32_t* character, const int32_t* stage,
                            const float* prev_controller, const MirrorDraw& mirror,
                            const float* action_table, const float* character_table,
                            const float* stage_table, float* out, float* prev_out,
                            kernels::bfloat16* out_bf, kernels::bfloat16* prev_bf,
                            cudaStream_t stream) {
  const size_t n = rows * size_t(Cols(d).width);
  if (n == 0) return;
  const unsigned blocks = ceil_div(n, kThreads);
  SLIPSTREAM_LAUNCH(embed_forward_kernel, dim3(blocks < 65535 ? blocks : 65535), dim3(kThreads),
                    stream, d, rows, window, numeric, action, character, stage, prev_controller,
                    mirror, action_table, character_table, stage_table, out, prev_out,
                    reinterpret_cast<__nv_bfloat16*>(out_bf),
                    reinterpret_cast<__nv_bfloat16*>(prev_bf));
  check_launch("embed_forward");
}

void Kernels::embed_add_noise(const EmbedDims& d, size_t rows, const float* numeric,
                              const uint64_t* key, float sd, float* out, kernels::bfloat16* out_bf,
                              cudaStream_t stream) {
  const size_t n = rows * kSlots * kNumericFeatures;
  if (n == 0) return;
  const unsigned blocks = ceil_div(n, kThreads);
  SLIPSTREAM_LAUNCH(embed_noise_kernel, dim3(blocks < 65535 ? blocks : 65535), dim3(kThreads),
                    stream, d, rows, numeric, key, sd, out,
                    reinterpret_cast<__nv_bfloat16*>(out_bf));
  check_launch("embed_add_noise");
}

namespace {
Kernels::EmbedBackwardVariant variant_from_environment() {
  // sorted since an H100 timed it (2026-11-28: the kernels 0.61-0.63x the partials' time, the
  // whole step 1.03x at gpu_standard); SLIPSTREAM_EMBED_BACKWARD=partials for the other form.
  const char* e = std::getenv("SLIPSTREAM_EMBED_BACKWARD");
  using V = Kernels::EmbedBackwardVariant;
  return e && std::string(e) == "partials" ? V::partials : V::sorted;
}
Kernels::EmbedBackwardVariant g_embed_backward = variant_from_environment();

// The three tables' gradients as the kernels see them.
struct Tables {
  TableGrad g[3];
  size_t items[3];
  Tables(const EmbedDims& d, size_t rows, const int32_t* action, const int32_t* character,
         const int32_t* stage) {
    const Cols L(d);
    g[0] = table_grad(action, kActionStates, L.A, kSlots, kNumericFeatures, L.slot_width, true);
    g[1] =
        table_grad(character, kCharacters, L.C, kSlots, kNumericFeatures + L.A, L.slot_width, true);
    g[2] = table_grad(stage, kStages, L.S, 1, L.stage_offset, 0, false);
    items[0] = items[1] = rows * kSlots;
    items[2] = rows;
  }
};
}  // namespace

void Kernels::set_embed_backward_variant(EmbedBackwardVariant v) {
  g_embed_backward = v;
}
Kernels::EmbedBackwardVariant Kernels::embed_backward_variant() {
  return g_embed_backward;
}

size_t Kernels::embed_backward_workspace_bytes(const EmbedDims& d, size_t rows) {
  // Either form's: the variant may change between the allocation and a launch.
  Tables t(d, rows, nullptr, nullptr, nullptr);
  size_t cells = 0;  // the three tables' partials side by side
  for (int k = 0; k < 3; ++k) cells += size_t(table_chunks(t.items[k])) * table_cells(t.g[k]);
  auto s = k::zero_filled<SortedTables>();
  float* const none[3] = {nullptr, nullptr, nullptr};
  return std::max(cells * sizeof(float), sorted_tables(s, t.g, t.items, none, nullptr));
}

void Kernels::embed_backward(const EmbedDims& d, size_t rows, const float* numeric,
                             const int32_t* action, const int32_t* character, const int32_t* stage,
                             const float* dout, float* daction_table, float* dcharacter_table,
                             float* dstage_table, void* workspace, cudaStream_t stream) {
  const Cols L(d);
  const Tables t(d, rows, action, character, stage);
  float* const dtable[3] = {daction_table, dcharacter_table, dstage_table};
  if (g_embed_backward == EmbedBackwardVariant::sorted) {
    sorted_backward(t.g, t.items, numeric, dout, L.width, dtable, workspace, stream);
    return;
  }
  tables_backward(t.g, t.items, numeric, dout, L.width, dtable, static_cast<float*>(workspace),
                  stream);
}

void Kernels::bc_loss_rows(const HeadPointers& logits, const float* target_buttons,
                           const int32_t* target_sticks, const float* mask, const uint8_t* mirrored,
                           const float* prev_controller, size_t M, size_t window, float eps,
                           float* stats, float* sums, void* workspace, cudaStream_t stream) {
  if (M == 0) return;
  SLIPSTREAM_LAUNCH(bc_loss_rows_kernel, dim3(ceil_div(M, kThreads)), dim3(kThreads), stream,
                    logits, target_buttons, target_sticks, mask, mirrored, prev_controller, M,
                    window, eps, stats, static_cast<float*>(workspace), sums);
  check_launch("bc_loss_rows");
}

size_t Kernels::bc_loss_rows_workspace_bytes(size_t M) {
  return size_t(ceil_div(M, kThreads)) * kBcStats * sizeof(float);
}

void Kernels::bc_loss_backward(const HeadPointers& logits, const float* target_buttons,
                               const int32_t* target_sticks, const float* mask,
                               const uint8_t* mirrored, size_t M, size_t window, float eps,
                               const HeadWeights& head_weights, const float* sums,
                               const HeadGradPointers& dlogits, cudaStream_t stream) {
  if (M == 0) return;
  SLIPSTREAM_LAUNCH(bc_loss_backward_kernel, dim3(ceil_div(M, kThreads)), dim3(kThreads), stream,
                    logits, target_buttons, target_sticks, mask, mirrored, M, window, eps,
                    head_weights, sums, dlogits);
  check_launch("bc_loss_backward");
}

void Kernels::heads_ar_teacher(size_t M, size_t window, const float* target_buttons,
                               const int32_t* target_sticks, const uint8_t* mirrored,
                               float* teacher, cudaStream_t stream) {
  const size_t n = M * kHeadsWidth;
  if (n == 0) return;
  const unsigned blocks = ceil_div(n, kThreads);
  SLIPSTREAM_LAUNCH(ar_teacher_kernel, dim3(blocks < 65535 ? blocks : 65535), dim3(kThreads),
                    stream, M, window, target_buttons, target_sticks, mirrored, teacher);
  check_launch("heads_ar_teacher");
}

void Kernels::heads_ar_mask(float* Wa, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH(ar_mask_kernel, dim3(ceil_div(size_t(kHeadsWidth) * kHeadsWidth, kThreads)),
                    dim3(kThreads), stream, Wa);
  check_launch("heads_ar_mask");
}

void Kernels::heads_ar_decode(size_t M, const float* Wa, float* logits, cudaStream_t stream) {
  if (M == 0) return;
  SLIPSTREAM_LAUNCH(ar_decode_kernel, dim3(ceil_div(M, kThreads)), dim3(kThreads), stream, M, Wa,
                    logits);
  check_launch("heads_ar_decode");
}

void Kernels::policy_choose(const HeadPointers& logits, const float* ar, float temperature,
                            const uint64_t* game_keys, uint64_t* frames, size_t games,
                            float* distribution, int32_t* chosen, cudaStream_t stream) {
  if (games == 0) return;
  SLIPSTREAM_LAUNCH(policy_choose_kernel, dim3(ceil_div(games * 32, kChooseThreads)),
                    dim3(kChooseThreads), stream, logits, ar, temperature, game_keys, frames, games,
                    distribution, chosen);
  check_launch("policy_choose");
}

void Kernels::heads_split(const float* logits, const float* bias, size_t M,
                          const HeadGradPointers& out, cudaStream_t stream) {
  SLIPSTREAM_LAUNCH_ELEMENTWISE("heads_split", heads_split_kernel, M * kHeadsWidth, stream, logits,
                                bias, M, out);
}

template <class T>
void Kernels::heads_small_rows(size_t M, const T* x, int H, const T* Wo, const T* prev, int P,
                               const T* Wp, const float* bias, const HeadGradPointers& out,
                               cudaStream_t stream) {
  const char* name = "heads_small_rows";
  if (M < 1 || M > size_t(kSmallGemmRows) || H < 1 || P < 0 || (P > 0 && (!prev || !Wp)))
    throw std::invalid_argument(std::string(name) +
                                ": needs 1 <= M <= " + std::to_string(kSmallGemmRows) +
                                ", H >= 1 and prev with P > 0 (M=" + std::to_string(M) +
                                " H=" + std::to_string(H) + " P=" + std::to_string(P) + ")");
  using DT = k::dev_t<T>;
  const int rows = int(M);
  const auto kernel = rows == 1   ? &heads_small_rows_kernel<DT, 1>
                      : rows == 2 ? &heads_small_rows_kernel<DT, 2>
                      : rows <= 4 ? &heads_small_rows_kernel<DT, 4>
                                  : &heads_small_rows_kernel<DT, 8>;
  SLIPSTREAM_LAUNCH_AS(name, kernel, dim3(ceil_div(kHeadsWidth, kSmallHeadsWarps)),
                       dim3(kSmallHeadsWarps * 32), stream, rows, k::dev(x), H, k::dev(Wo),
                       k::dev(prev), P, k::dev(Wp), bias, out);
  check_launch(name);
}
template void Kernels::heads_small_rows<float>(size_t, const float*, int, const float*,
                                               const float*, int, const float*, const float*,
                                               const HeadGradPointers&, cudaStream_t);
template void Kernels::heads_small_rows<kernels::bfloat16>(size_t, const kernels::bfloat16*, int,
                                                           const kernels::bfloat16*,
                                                           const kernels::bfloat16*, int,
                                                           const kernels::bfloat16*, const float*,
                                                           const HeadGradPointers&, cudaStream_t);

void Kernels::heads_join(const HeadPointers& dout, size_t M, float* dlogits,
                         kernels::bfloat16* dlogits_bf, float* dbias, void* workspace,
                         cudaStream_t stream) {
  if (M == 0) return;
  SLIPSTREAM_LAUNCH(heads_join_kernel, dim3(ceil_div(M, kJoinRows)), dim3(kJoinThreads), stream,
                    dout, M, dlogits, reinterpret_cast<__nv_bfloat16*>(dlogits_bf),
                    static_cast<float*>(workspace), dbias);
  check_launch("heads_join");
}

size_t Kernels::heads_join_workspace_bytes(size_t M) {
  return size_t(ceil_div(M, kJoinRows)) * kHeadsWidth * sizeof(float);
}

}  // namespace slipstream::melee::SLIPSTREAM_KERNEL_NS
