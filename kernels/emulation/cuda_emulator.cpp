// Fiber scheduler of the CUDA emulator (see cuda_emulator.h). Each thread of the block being
// run is a fiber; the scheduler resumes, round-robin, every fiber not waiting at a barrier whose
// generation is still current.
//
// A fiber's stack is made once per OS thread and thread slot, and kept: the fiber loops, running
// the body of whichever block comes next. ucontext only starts a stack; every switch after that
// is _setjmp/_longjmp, which save the callee-saved registers and nothing else. swapcontext saves
// the signal mask with a system call and the x87 environment at every switch: that was about
// four fifths of an emulated test's time.
//
// _FORTIFY_SOURCE turns _longjmp into __longjmp_chk, which refuses a jump to a frame below the
// current stack pointer unless on a signal stack: a jump to another fiber's stack is such a jump.
#undef _FORTIFY_SOURCE

#include "kernels/emulation/cuda_emulator.h"

#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SLIPSTREAM_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLIPSTREAM_EMULATOR_ASAN 1
#endif
#endif
#ifdef SLIPSTREAM_EMULATOR_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace slipstream::cuda_emu {

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;

enum class Wait { none, block, warp };

struct Fiber {
  dim3 idx;
  int warp = 0, lane = 0;
  bool done = false;
  Wait wait = Wait::none;
  uint64_t wait_gen = 0;
  uint64_t slot = 0;
};

// A thread slot's stack and where its fiber stopped; lives as long as the OS thread.
struct Stack {
  std::unique_ptr<char[]> memory = std::make_unique_for_overwrite<char[]>(kStackBytes);
  jmp_buf at;
#ifdef SLIPSTREAM_EMULATOR_ASAN
  void* fake_stack = nullptr;
#endif
};

struct Block {
  std::vector<Fiber> fibers;
  size_t live = 0;
  uint64_t gen = 0;
  size_t arrived = 0;
  std::vector<uint64_t> warp_gen;
  std::vector<int> warp_arrived, warp_live;
  Fiber* cur = nullptr;
  dim3 bidx, bdim, gdim;
  const std::function<void()>* body = nullptr;
};

thread_local Block* g_block = nullptr;
thread_local uint64_t g_launches = 0;
thread_local std::vector<std::unique_ptr<Stack>> g_stacks;
thread_local jmp_buf g_scheduler;    // where the scheduler waits while a fiber runs
thread_local size_t g_starting = 0;  // the slot whose stack is being started
#ifdef SLIPSTREAM_EMULATOR_ASAN
thread_local void* g_scheduler_fake_stack = nullptr;
thread_local const void* g_scheduler_stack = nullptr;
thread_local size_t g_scheduler_stack_bytes = 0;
#endif

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

// The two switches. AddressSanitizer is told of each change of stack (its fiber interface), so
// that its view of the running stack stays right. `start` is null but for a new stack's first
// entry, which begins at fiber_main instead of where the fiber last stopped.
[[gnu::noinline]] void to_fiber(Stack& s, const ucontext_t* start = nullptr) {
#ifdef SLIPSTREAM_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(&g_scheduler_fake_stack, s.memory.get(), kStackBytes);
#endif
  if (_setjmp(g_scheduler) == 0) {
    if (start) setcontext(start);
    _longjmp(s.at, 1);
  }
#ifdef SLIPSTREAM_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(g_scheduler_fake_stack, nullptr, nullptr);
#endif
}
[[gnu::noinline]] void to_scheduler(Stack& s) {
#ifdef SLIPSTREAM_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(&s.fake_stack, g_scheduler_stack, g_scheduler_stack_bytes);
#endif
  if (_setjmp(s.at) == 0) _longjmp(g_scheduler, 1);
#ifdef SLIPSTREAM_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(s.fake_stack, &g_scheduler_stack, &g_scheduler_stack_bytes);
#endif
}

// A fiber's whole life: wait for a block, run its thread of it, report done, wait again.
void fiber_main() {
  Stack& s = *g_stacks[g_starting];
#ifdef SLIPSTREAM_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_scheduler_stack, &g_scheduler_stack_bytes);
#endif
  for (;;) {
    to_scheduler(s);
    Block& b = *g_block;
    Fiber& f = *b.cur;
    (*b.body)();
    f.done = true;
    --b.live;
    --b.warp_live[f.warp];
    maybe_release_block(b);
    maybe_release_warp(b, f.warp);
  }
}

// Makes slot i's stack and runs its fiber up to its first wait for a block.
[[gnu::noinline]] void start_fiber(size_t i) {
  g_stacks.push_back(std::make_unique<Stack>());
  Stack& s = *g_stacks.back();
  ucontext_t start;
  getcontext(&start);
  start.uc_stack.ss_sp = s.memory.get();
  start.uc_stack.ss_size = kStackBytes;
  start.uc_link = nullptr;
  makecontext(&start, fiber_main, 0);
  g_starting = i;
  to_fiber(s, &start);
}

void run_block(Block& b) {
  const size_t n = size_t(b.bdim.x) * b.bdim.y * b.bdim.z;
  while (g_stacks.size() < n) start_fiber(g_stacks.size());
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
  }
  for (;;) {
    bool progressed = false, all_done = true;
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = b.fibers[i];
      if (f.done) continue;
      all_done = false;
      if (f.wait == Wait::block && f.wait_gen == b.gen) continue;
      if (f.wait == Wait::warp && f.wait_gen == b.warp_gen[f.warp]) continue;
      b.cur = &f;
      to_fiber(*g_stacks[i]);
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
  to_scheduler(*g_stacks[size_t(&f - b.fibers.data())]);
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
