#include "engine/memory_pool.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstring>
#include <random>

namespace slipstream {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

TEST(PoolSizeClass, Classes) {
  EXPECT_EQ(pool_size_class(0), 512u);
  EXPECT_EQ(pool_size_class(1), 512u);
  EXPECT_EQ(pool_size_class(512), 512u);
  EXPECT_EQ(pool_size_class(513), 1024u);
  EXPECT_EQ(pool_size_class(1 * MiB), 1 * MiB);
  EXPECT_EQ(pool_size_class(1 * MiB + 1), 2 * MiB);
  EXPECT_EQ(pool_size_class(3 * MiB), 4 * MiB);
  EXPECT_EQ(pool_size_class(17 * MiB), 18 * MiB);
  EXPECT_EQ(pool_size_class(33 * MiB), 36 * MiB);  // 1/8 of 32 MiB steps
  EXPECT_EQ(pool_size_class(GiB + GiB / 2), GiB + GiB / 2);
}

TEST(PoolSizeClass, MonotoneAndBoundedWaste) {
  std::mt19937_64 rng(1);
  size_t prev_bytes = 0, prev_cls = 0;
  while (prev_bytes < (size_t{1} << 50)) {
    size_t bytes = prev_bytes + 1 + rng() % (prev_bytes / 50 + 1000);
    size_t cls = pool_size_class(bytes);
    ASSERT_GE(cls, bytes);
    ASSERT_GE(cls, prev_cls);
    if (bytes > 16 * MiB) {
      ASSERT_LE(cls - bytes, bytes / 8) << bytes;
    }
    if (bytes <= MiB) {
      ASSERT_LT(cls - bytes, 512u);
    }
    prev_bytes = bytes;
    prev_cls = cls;
  }
}

TEST(FormatBytes, Units) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(80 * GiB), "80 GiB");
  EXPECT_EQ(format_bytes(GiB + GiB / 2), "1.5 GiB");
}

class HostPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { pool.release_cached(); }
  MemoryPool& pool = Pools::host();
};

TEST_F(HostPoolTest, StatsAndReuse) {
  const PoolStats s0 = pool.stats();
  EXPECT_EQ(pool.device(), Device::cpu());
  void* a = pool.allocate(1000, "stats test a");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  std::memset(a, 0xab, 1000);
  PoolStats s1 = pool.stats();
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes + 1024);
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes + 1024);
  EXPECT_EQ(s1.allocations, s0.allocations + 1);
  EXPECT_GE(s1.peak_bytes, s1.in_use_bytes);

  pool.deallocate(a, 1000);
  PoolStats s2 = pool.stats();
  EXPECT_EQ(s2.in_use_bytes, s0.in_use_bytes);
  EXPECT_EQ(s2.reserved_bytes, s1.reserved_bytes);  // cached, not returned

  void* b = pool.allocate(900, "stats test b");  // same 1 KiB class: the cached block
  EXPECT_EQ(b, a);
  PoolStats s3 = pool.stats();
  EXPECT_EQ(s3.reserved_bytes, s1.reserved_bytes);
  EXPECT_EQ(s3.allocations, s0.allocations + 2);

  void* c = pool.allocate(3000, "stats test c");  // another class: grows
  EXPECT_EQ(pool.stats().reserved_bytes, s1.reserved_bytes + 3072);
  const uint64_t peak = pool.stats().peak_bytes;
  EXPECT_GE(peak, s0.in_use_bytes + 1024 + 3072);
  pool.deallocate(b, 900);
  pool.deallocate(c, 3000);
  EXPECT_EQ(pool.stats().peak_bytes, peak);  // peak survives frees
  EXPECT_EQ(pool.stats().in_use_bytes, s0.in_use_bytes);

  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved_bytes, s0.reserved_bytes);
  EXPECT_EQ(pool.stats().failures, s0.failures);
}

// reserve() counts the blocks of the class in use and cached: afterwards that many can be in
// use at once without the pool growing.
TEST_F(HostPoolTest, ReserveCountsWhatItHas) {
  const PoolStats s0 = pool.stats();
  void* held = pool.allocate(1500, "reserve test held");  // one 1.5 KiB block in use
  pool.reserve(1400, 3, "reserve test");                  // the same class: two more
  EXPECT_EQ(pool.stats().reserved_bytes, s0.reserved_bytes + 3 * 1536);
  EXPECT_EQ(pool.stats().in_use_bytes, s0.in_use_bytes + 1536);
  pool.reserve(1536, 2, "reserve test");  // already there: nothing
  EXPECT_EQ(pool.stats().reserved_bytes, s0.reserved_bytes + 3 * 1536);
  void* more[2] = {pool.allocate(1536, "a"), pool.allocate(1025, "b")};
  EXPECT_EQ(pool.stats().reserved_bytes, s0.reserved_bytes + 3 * 1536);  // no growth
  for (void* p : more) pool.deallocate(p, 1536);
  pool.deallocate(held, 1500);
  pool.release_cached();
  EXPECT_EQ(pool.stats().reserved_bytes, s0.reserved_bytes);
}

TEST_F(HostPoolTest, HugeRequestFailsWithMessage) {
  Pools::set_oom_hint("lower batches.batch_size (now 256)");
  const PoolStats s0 = pool.stats();
  try {
    (void)pool.allocate(size_t{1} << 60, "batch tensor replays.state");
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of host memory allocating 1 EiB for batch tensor replays.state"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("pool in use"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower batches.batch_size (now 256)"), std::string::npos) << msg;
  }
  const PoolStats s1 = pool.stats();
  EXPECT_EQ(s1.failures, s0.failures + 1);
  EXPECT_EQ(s1.allocations, s0.allocations + 1);
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes);
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes);
  // Absurd sizes whose class would overflow fail the same way.
  EXPECT_THROW((void)pool.allocate(SIZE_MAX - 10, "overflow"), OutOfMemoryError);
  EXPECT_EQ(pool.stats().failures, s0.failures + 2);
  Pools::set_oom_hint("");
  EXPECT_FALSE(Pools::oom_hint().empty());  // falls back to a generic hint
}

TEST_F(HostPoolTest, DoubleFreeIsCaught) {
  void* a = pool.allocate(64, "double free test");
  pool.deallocate(a, 64);
  EXPECT_THROW(pool.deallocate(a, 64), std::logic_error);
  int on_stack = 0;
  EXPECT_THROW(pool.deallocate(&on_stack, 4), std::logic_error);
}

TEST_F(HostPoolTest, ConcurrentAllocateFree) {
  const PoolStats s0 = pool.stats();
  // A run's tensors come in a few fixed sizes; the cache then holds a few blocks per size.
  constexpr size_t kSizes[] = {100, 4000, 4096, 60000, 1 * MiB, 3 * MiB + 7};
  uint64_t class_sum = 0;
  for (size_t b : kSizes) class_sum += pool_size_class(b);
  constexpr int kIters = 20000;
  tbb::parallel_for(0, kIters, [&](int i) {
    const size_t bytes = kSizes[static_cast<size_t>(i) % std::size(kSizes)];
    auto* p = static_cast<unsigned char*>(pool.allocate(bytes, "concurrency test"));
    const auto tag = static_cast<unsigned char>(i);
    p[0] = tag;
    p[bytes - 1] = tag;
    std::memset(p + bytes / 2, tag, std::min<size_t>(bytes / 2, 64));
    if (p[0] != tag || p[bytes - 1] != tag) ADD_FAILURE() << "block shared between threads";
    pool.deallocate(p, bytes);
  });
  const PoolStats s1 = pool.stats();
  EXPECT_EQ(s1.allocations, s0.allocations + kIters);
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes);
  EXPECT_EQ(s1.failures, s0.failures);
  EXPECT_GE(s1.peak_bytes, s1.in_use_bytes);
  // Each thread holds at most one block at a time: freed blocks are reused, not re-reserved.
  const auto threads = static_cast<uint64_t>(tbb::this_task_arena::max_concurrency());
  EXPECT_LE(s1.reserved_bytes - s0.reserved_bytes, threads * class_sum);
}

TEST(Pools, AllListsHostAndPinningNeedsADriver) {
  auto all = Pools::all();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all[0], &Pools::host());
  EXPECT_EQ(Pools::for_device(Device::cpu()).device(), Device::cpu());
  if (!probe_cuda().available) {
    Pools::enable_pinned_host(true);  // no driver: stays pageable, allocations still work
    EXPECT_EQ(Pools::host().name(), "host");
    void* p = Pools::host().allocate(100, "pinned fallback");
    Pools::host().deallocate(p, 100);
    Pools::enable_pinned_host(false);
  }
}

}  // namespace
}  // namespace slipstream
