// Fiber scheduler of the CUDA emulator (see cuda_emulator.h). One ucontext per thread of the
// block being run; the scheduler resumes, round-robin, every fiber not waiting at a barrier
// whose generation is still current.
#include "kernels/emulation/cuda_emulator.h"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

namespace slipstream::cuda_emu {

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;

enum class Wait { none, block, warp };

struct Fiber {
  ucontext_t ctx;
  dim3 idx;
  int warp = 0, lane = 0;
  bool done = false;
  Wait wait = Wait::none;
  uint64_t wait_gen = 0;
  uint64_t slot = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  size_t live = 0;
  uint64_t gen = 0;
  size_t arrived = 0;
  std::vector<uint64_t> warp_gen;
  std::vector<int> warp_arrived, warp_live;
  ucontext_t sched;
  Fiber* cur = nullptr;
  dim3 bidx, bdim, gdim;
  const std::function<void()>* body = nullptr;
};

thread_local Block* g_block = nullptr;
thread_local uint64_t g_launches = 0;
thread_local std::vector<std::unique_ptr<char[]>> g_stacks;

Block& block() {
  if (!g_block) {
    std::fprintf(stderr, "cuda emulator: a device function ran outside a kernel launch\n");
    std::abort();
  }
  return *g_block;
}

// Releases a barrier once every live thread (of the block, or of the warp) has arrived.
void maybe_release_block(Block& b) {
  if (b.arrived > 0 && b.arrived == b.live) {
    b.arrived = 0;
    ++b.gen;
  }
}
void maybe_release_warp(Block& b, int w) {
  if (b.warp_arrived[w] > 0 && b.warp_arrived[w] == b.warp_live[w]) {
    b.warp_arrived[w] = 0;
    ++b.warp_gen[w];
  }
}

void fiber_main() {
  Block& b = *g_block;
  Fiber& f = *b.cur;
  (*b.body)();
  f.done = true;
  --b.live;
  --b.warp_live[f.warp];
  maybe_release_block(b);
  maybe_release_warp(b, f.warp);
  swapcontext(&f.ctx, &b.sched);
}

void run_block(Block& b) {
  const size_t n = size_t(b.bdim.x) * b.bdim.y * b.bdim.z;
  while (g_stacks.size() < n) g_stacks.push_back(std::make_unique<char[]>(kStackBytes));
  const int warps = int((n + kWarp - 1) / kWarp);
  b.fibers.assign(n, Fiber{});
  b.live = n;
  b.gen = 0;
  b.arrived = 0;
  b.warp_gen.assign(warps, 0);
  b.warp_arrived.assign(warps, 0);
  b.warp_live.assign(warps, 0);
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.idx = dim3(unsigned(i % b.bdim.x), unsigned(i / b.bdim.x % b.bdim.y),
                 unsigned(i / (size_t(b.bdim.x) * b.bdim.y)));
    f.warp = int(i / kWarp);
    f.lane = int(i % kWarp);
    ++b.warp_live[f.warp];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = g_stacks[i].get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  for (;;) {
    bool progressed = false, all_done = true;
    for (Fiber& f : b.fibers) {
      if (f.done) continue;
      all_done = false;
      if (f.wait == Wait::block && f.wait_gen == b.gen) continue;
      if (f.wait == Wait::warp && f.wait_gen == b.warp_gen[f.warp]) continue;
      b.cur = &f;
      swapcontext(&b.sched, &f.ctx);
      progressed = true;
    }
    if (all_done) break;
    if (!progressed) {
      std::fprintf(stderr,
                   "cuda emulator: deadlock in block (%u,%u,%u): a barrier that not every live "
                   "thread reaches\n",
                   b.bidx.x, b.bidx.y, b.bidx.z);
      std::abort();
    }
  }
}

void wait_here(Block& b, Fiber& f, Wait kind, uint64_t gen) {
  f.wait = kind;
  f.wait_gen = gen;
  swapcontext(&f.ctx, &b.sched);
  f.wait = Wait::none;
}

}  // namespace

const dim3& thread_idx() {
  return block().cur->idx;
}
const dim3& block_idx() {
  return block().bidx;
}
const dim3& block_dim() {
  return block().bdim;
}
const dim3& grid_dim() {
  return block().gdim;
}
int lane_id() {
  return block().cur->lane;
}

void sync_threads() {
  Block& b = block();
  Fiber& f = *b.cur;
  const uint64_t gen = b.gen;
  ++b.arrived;
  maybe_release_block(b);
  if (b.gen == gen) wait_here(b, f, Wait::block, gen);
}

void sync_warp() {
  Block& b = block();
  Fiber& f = *b.cur;
  const uint64_t gen = b.warp_gen[f.warp];
  ++b.warp_arrived[f.warp];
  maybe_release_warp(b, f.warp);
  if (b.warp_gen[f.warp] == gen) wait_here(b, f, Wait::warp, gen);
}

uint64_t exchange(uint64_t bits, int src_lane) {
  Block& b = block();
  Fiber& f = *b.cur;
  f.slot = bits;
  sync_warp();
  const size_t src = size_t(f.warp) * kWarp + size_t(src_lane);
  const uint64_t out =
      (src_lane >= 0 && src_lane < kWarp && src < b.fibers.size()) ? b.fibers[src].slot : bits;
  sync_warp();
  return out;
}

void launch(dim3 grid, dim3 blk, const std::function<void()>& body) {
  if (g_block) {
    std::fprintf(stderr, "cuda emulator: kernel launched from inside a kernel\n");
    std::abort();
  }
  ++g_launches;
  if (size_t(blk.x) * blk.y * blk.z == 0 || size_t(grid.x) * grid.y * grid.z == 0) return;
  Block b;
  b.gdim = grid;
  b.bdim = blk;
  b.body = &body;
  g_block = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        b.bidx = dim3(x, y, z);
        run_block(b);
      }
  g_block = nullptr;
}

uint64_t launches() {
  return g_launches;
}

}  // namespace slipstream::cuda_emu
