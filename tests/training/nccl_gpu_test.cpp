// allreduce's NCCL backend on a GPU (label gpu; SKIPPED without a device or a CUDA build). One
// GPU gives one rank: the reducer on device buffers (buckets in place and staged, each ordered
// after the compute stream's writes through an event) leaves the average of one rank, the
// values themselves; and a training run through `sync.backend=nccl` equals the same run with
// `backend=none` bit for bit, overlap on (ncclAvg over one rank is exact), its steps replayed
// from CUDA graphs that hold the reductions. Several ranks need several GPUs:
// docs/distributed.md.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "engine/device.h"
#include "tests/support/temp_dir.h"
#include "tests/training/training_fixture.h"

#if SLIPSTREAM_HAS_CUDA
#include <cuda_runtime.h>

#include "stages/dist/nccl_reduce.h"
#endif

using namespace slipstream;
using namespace slipstream::testing;

namespace {

#if SLIPSTREAM_HAS_CUDA

TEST(NcclGpu, OneRankBucketsOrderedAfterTheComputeStream) {
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  const Device dev = Device::cuda(0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // Three parameters in one device store, listed last first (in-place buckets), and two on
  // their own (a staged bucket).
  Tensor store = Tensor::empty({3000}, DType::f32, dev);
  std::vector<Parameter> ps(5);
  const int64_t at[4] = {0, 1000, 1700, 3000};
  for (int k = 0; k < 3; ++k) ps[size_t(k)].grad = store.slice_rows(at[k], at[k + 1]);
  ps[3].grad = Tensor::empty({300}, DType::f32, dev);
  ps[4].grad = Tensor::empty({5}, DType::f32, dev);
  std::vector<Parameter*> order = {&ps[2], &ps[1], &ps[0], &ps[3], &ps[4]};
  dist::GradBuckets buckets(order, 1024, 256);
  bool staged = false, in_place = false;
  for (size_t i = 0; i < buckets.count(); ++i) (buckets.contiguous(i) ? in_place : staged) = true;
  ASSERT_TRUE(staged && in_place);
  dist::NcclBucketReducer reducer(buckets, stream, 0, 1, 60.0);
  for (uint64_t step = 1; step <= 2; ++step) {
    // The gradients are written on the compute stream; the reductions must come after.
    std::vector<std::vector<float>> want(order.size());
    for (size_t k = 0; k < order.size(); ++k) {
      want[k].resize(size_t(order[k]->grad.numel()));
      for (size_t i = 0; i < want[k].size(); ++i) want[k][i] = float(step * 1000 + k * 10 + i);
      ASSERT_EQ(cudaMemcpyAsync(order[k]->grad.raw(), want[k].data(), want[k].size() * 4,
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // `want` is reused by the host
      reducer.param_ready(k, step);
    }
    reducer.finish(step);
    for (size_t k = 0; k < order.size(); ++k) {
      std::vector<float> got(want[k].size());
      ASSERT_EQ(cudaMemcpyAsync(got.data(), order[k]->grad.raw(), got.size() * 4,
                                cudaMemcpyDeviceToHost, stream),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(got, want[k]) << "parameter " << k << " at step " << step;
    }
  }
  cudaStreamDestroy(stream);
}

TEST(NcclGpu, TrainingThroughNcclEqualsNone) {
  const CudaProbe& probe = probe_cuda();
  if (!probe.available) GTEST_SKIP() << "no CUDA device: " << probe.reason;
  TempDir d;
  std::ostringstream log;
  auto sets = tiny_overrides(d.path());
  sets.back() = "run.device=cuda";
  for (const char* s : {"run.steps=16", "core.layers=2", "sync.bucket_mb=0.01",
                        "sync.first_bucket_mb=0.002", "run.cuda_graph=on"})
    sets.push_back(s);
  const std::string graph = source_path("configs/train_bc.yaml");
  auto none = sets, nccl = sets;
  none.push_back("sync.backend=none");
  nccl.push_back("sync.backend=nccl");
  Runner a(plan_graph(load_config(graph, none)), quiet_run_options(log));
  a.run();
  Runner b(plan_graph(load_config(graph, nccl)), quiet_run_options(log));
  const RunResult rb = b.run();
  // The reductions are captured with the step: graph mode stays on and steps replay.
  EXPECT_EQ(rb.graph_off_reason, "") << log.str();
  EXPECT_GE(rb.graph_steps.replayed, 4u) << graph_steps_summary(rb);
  for (size_t k = 0; k < a.graph().size(); ++k) {
    auto pa = a.graph().stage(k).parameters(), pb = b.graph().stage(k).parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      const Tensor x = pa[i]->value.to(Device::cpu()), y = pb[i]->value.to(Device::cpu());
      EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << pa[i]->name;
    }
  }
}

#else

TEST(NcclGpu, NeedsACudaBuild) {
  GTEST_SKIP() << "built without CUDA";
}

#endif

}  // namespace
