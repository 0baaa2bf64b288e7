// The prefetch stage's ring of device slots (stages/data/batch_ring.h): contents and layout of
// the copies, which slot a batch gets while others are held, growth, and that a slot's host
// memory and device memory are reused only when nothing can still read them. Built twice: on the
// emulated backend (host buffers, synchronous copies) and on a CUDA device (copy stream, events;
// label gpu, SKIPPED without one). On the device the copies are read back through the compute
// stream after the fence's wait, so a missing event order shows as wrong data.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "engine/device.h"
#include "engine/memory_pool.h"
#include "stages/data/batch_ring.h"

namespace slipstream {
namespace {

const std::string kDevice = SLIPSTREAM_TEST_DEVICE;

// The run's execution context for the backend under test, or null (then the test skips).
std::shared_ptr<ExecContext> make_exec(std::string* why) {
  if (kDevice == "emulated") return std::make_shared<ExecContext>(Device::cpu(), true);
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) {
    *why = "no CUDA device: " + probe.reason;
    return nullptr;
  }
  return std::make_shared<ExecContext>(Device::cuda(0));
}

#define RING_EXEC(var)                \
  std::string why_skipped;            \
  auto var = make_exec(&why_skipped); \
  if (!var) GTEST_SKIP() << why_skipped;

// A host batch: a float (rows, 3) tensor and an int (rows) one, filled from `seed`.
struct HostBatch {
  Tensor f, i;
  std::vector<Tensor*> list() { return {&f, &i}; }
};

HostBatch host_batch(int64_t rows, int seed) {
  HostBatch b{Tensor::empty({rows, 3}, DType::f32), Tensor::empty({rows}, DType::i32)};
  for (int64_t k = 0; k < rows * 3; ++k) b.f.data<float>()[k] = float(seed * 1000 + k) * 0.5f;
  for (int64_t k = 0; k < rows; ++k) b.i.data<int32_t>()[k] = seed * 100 + int32_t(k);
  return b;
}

// What a view holds, read through the compute stream after the fence's wait.
template <class T>
std::vector<T> read(const ExecContext& exec, BatchFence& fence, const Tensor& view) {
  fence.wait(exec);
  std::vector<T> out(static_cast<size_t>(view.numel()));
  exec.read_back(out.data(), view.raw(), view.nbytes());
  return out;
}

void expect_batch(const ExecContext& exec, BatchFence& fence, HostBatch& b, int64_t rows,
                  int seed) {
  ASSERT_EQ(b.f.device(), exec.device());
  ASSERT_EQ(b.f.shape(), Shape({rows, 3}));
  ASSERT_EQ(b.i.dtype(), DType::i32);
  const auto f = read<float>(exec, fence, b.f);
  const auto i = read<int32_t>(exec, fence, b.i);
  for (int64_t k = 0; k < rows * 3; ++k)
    ASSERT_EQ(f[size_t(k)], float(seed * 1000 + k) * 0.5f) << "float element " << k;
  for (int64_t k = 0; k < rows; ++k) ASSERT_EQ(i[size_t(k)], seed * 100 + k) << "int element " << k;
}

TEST(BatchRing, CopiesIntoAlignedViewsOfOneSlot) {
  RING_EXEC(exec);
  BatchRing ring(exec, 2);
  HostBatch b = host_batch(5, 1);
  const void* host_f = b.f.raw();
  auto fence = ring.load(b.list());
  ASSERT_NE(fence, nullptr);
  EXPECT_NE(b.f.raw(), host_f);  // a copy, not the loader's memory
  EXPECT_TRUE(b.f.same_block(b.i));
  // 256-byte steps from the slot's start (which cudaMalloc aligns to 256, the host pool to 64).
  const auto f = reinterpret_cast<uintptr_t>(b.f.raw()), i = reinterpret_cast<uintptr_t>(b.i.raw());
  EXPECT_EQ(i - f, 256u);  // 60 bytes of floats, rounded up
  if (exec->device().is_cuda()) {
    EXPECT_EQ(f % 256, 0u);
  }
  expect_batch(*exec, *fence, b, 5, 1);
  EXPECT_EQ(ring.reallocs(), 1u);
}

TEST(BatchRing, LeavesDeviceAndUndefinedTensorsAlone) {
  RING_EXEC(exec);
  BatchRing ring(exec, 1);
  Tensor undefined;
  Tensor* none[] = {&undefined};
  EXPECT_EQ(ring.load(none), nullptr);
  EXPECT_FALSE(undefined.defined());
  if (exec->device().is_cuda()) {
    Tensor on_device = Tensor::zeros({4}, DType::f32, exec->device());
    const void* p = on_device.raw();
    Tensor* dev[] = {&on_device};
    EXPECT_EQ(ring.load(dev), nullptr);
    EXPECT_EQ(on_device.raw(), p);
  }
}

TEST(BatchRing, HeldSlotsAreNeverReusedAndTheRingGrows) {
  RING_EXEC(exec);
  BatchRing ring(exec, 2);
  std::vector<HostBatch> batches;
  std::vector<std::shared_ptr<BatchFence>> fences;
  for (int k = 0; k < 5; ++k) batches.push_back(host_batch(7, k));
  for (int k = 0; k < 5; ++k) fences.push_back(ring.load(batches[size_t(k)].list()));
  EXPECT_EQ(ring.slots(), 5u);  // five batches held at once: five slots
  for (int k = 0; k < 5; ++k) {
    for (int j = 0; j < k; ++j) EXPECT_FALSE(batches[size_t(k)].f.same_block(batches[size_t(j)].f));
    expect_batch(*exec, *fences[size_t(k)], batches[size_t(k)], 7, k);
  }
}

TEST(BatchRing, ReleasedSlotsComeRoundAgain) {
  RING_EXEC(exec);
  BatchRing ring(exec, 3);
  std::vector<const void*> seen;
  for (int k = 0; k < 9; ++k) {
    HostBatch b = host_batch(4, k);
    auto fence = ring.load(b.list());
    expect_batch(*exec, *fence, b, 4, k);
    seen.push_back(b.f.raw());
  }  // each batch (fence and views) goes before the next is loaded
  EXPECT_EQ(ring.slots(), 3u);
  EXPECT_EQ(ring.reallocs(), 3u);
  for (int k = 3; k < 9; ++k) EXPECT_EQ(seen[size_t(k)], seen[size_t(k - 3)]) << "batch " << k;
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_NE(seen[1], seen[2]);
}

TEST(BatchRing, AViewKeptPastItsBatchKeepsTheSlot) {
  RING_EXEC(exec);
  BatchRing ring(exec, 1);
  HostBatch first = host_batch(3, 1);
  auto fence = ring.load(first.list());
  Tensor kept = first.f;  // a stage that held on to a batch tensor
  fence.reset();
  first = HostBatch{};
  HostBatch second = host_batch(3, 2);
  auto fence2 = ring.load(second.list());
  EXPECT_EQ(ring.slots(), 2u);
  EXPECT_FALSE(second.f.same_block(kept));
  expect_batch(*exec, *fence2, second, 3, 2);
}

TEST(BatchRing, ALargerBatchGrowsItsSlot) {
  RING_EXEC(exec);
  BatchRing ring(exec, 1);
  for (int64_t rows : {2, 2, 300, 300, 2}) {
    HostBatch b = host_batch(rows, int(rows));
    auto fence = ring.load(b.list());
    expect_batch(*exec, *fence, b, rows, int(rows));
  }
  EXPECT_EQ(ring.slots(), 1u);
  EXPECT_EQ(ring.reallocs(), 2u);  // the first fill, then the growth to 300 rows
}

TEST(BatchRing, TheHostMemoryGoesBackOnceCopied) {
  RING_EXEC(exec);
  BatchRing ring(exec, 2);
  HostBatch b = host_batch(6, 3);
  Tensor loader_side = b.f;  // the loader's reference to its page-locked block
  auto fence = ring.load(b.list());
  fence->wait(*exec);
  exec->synchronize();
  // The next load notices the copy is done and lets go of the host tensors.
  HostBatch c = host_batch(6, 4);
  auto fence2 = ring.load(c.list());
  EXPECT_EQ(loader_side.storage_users(), 1);
  expect_batch(*exec, *fence, b, 6, 3);
  expect_batch(*exec, *fence2, c, 6, 4);
}

// The host pool holds, from the first load, every batch that can be alive at once: max_in_flight,
// two more before the ring and one per slot (batch_ring.h); a slot more reserves one batch more.
// So however late the copies finish, taking another host batch grows no pool.
TEST(BatchRing, ReservesTheHostBatchesThatCanBeAliveAtOnce) {
  RING_EXEC(exec);
  BatchRing ring(exec, 2, 4);
  EXPECT_EQ(ring.host_batches_reserved(), 0u);
  std::vector<HostBatch> batches;
  std::vector<std::shared_ptr<BatchFence>> fences;
  batches.push_back(host_batch(40, 0));
  fences.push_back(ring.load(batches.back().list()));
  EXPECT_EQ(ring.host_batches_reserved(), 8u);  // 4 in flight + 2 + 2 slots
  const uint64_t reserved = Pools::host().stats().reserved_bytes;
  {
    std::vector<HostBatch> alive;  // the loader's batches, all alive at once
    for (int k = 0; k < 7; ++k) alive.push_back(host_batch(40, k));
    EXPECT_EQ(Pools::host().stats().reserved_bytes, reserved);
  }
  for (int k = 1; k < 3; ++k) {  // all held: the ring gains a slot
    batches.push_back(host_batch(40, k));
    fences.push_back(ring.load(batches.back().list()));
  }
  EXPECT_EQ(ring.slots(), 3u);
  EXPECT_EQ(ring.host_batches_reserved(), 9u);
  for (size_t k = 0; k < fences.size(); ++k)
    expect_batch(*exec, *fences[k], batches[k], 40, int(k));

  BatchRing unknown(exec, 2);  // a ring outside a run reserves nothing
  HostBatch b = host_batch(40, 9);
  auto fence = unknown.load(b.list());
  EXPECT_EQ(unknown.host_batches_reserved(), 0u);
  expect_batch(*exec, *fence, b, 40, 9);
}

}  // namespace
}  // namespace slipstream
