// GEMMs on CUDA through cuBLASLt, with the row-major contract of kernels/gemm.h. A row-major
// C (M, N) is a column-major C^T (N, M), so C^T = op(B)^T op(A)^T is issued as a column-major
// product with the operands swapped; no transposition is materialised. Each distinct shape gets
// a plan (descriptors + the heuristic's first algorithm) built once and cached; cuBLASLt calls
// are checked and name themselves in errors.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/cuda_kernels.h"
#include "kernels/gemm.h"
#include "kernels/step_recorder.h"

namespace slipstream::kernels::cuda {

using GemmContext = Kernels::GemmContext;

namespace {

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("gemm: ") + call +
                             " failed: " + cublasLtGetStatusString(status));
}

// Largest power of two (up to 256) dividing the address: what the algorithm may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

struct PlanKey {
  int device;
  cudaDataType_t operand_type;
  bool ta, tb;
  int M, N, K, lda, ldb, ldc;
  uint32_t align_a, align_b, align_c;
  size_t workspace_bytes;
  auto tie() const {
    return std::tie(device, operand_type, ta, tb, M, N, K, lda, ldb, ldc, align_a, align_b, align_c,
                    workspace_bytes);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // column-major operands
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  std::string name;  // gemm_operation_name: the recorded operation's
};

class PlanCache {
 public:
  ~PlanCache() {
    for (auto& [key, p] : plans_) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
    }
  }

  const Plan& get(cublasLtHandle_t handle, const PlanKey& k) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(k);
    if (it != plans_.end()) return it->second;
    return plans_.emplace(k, build(handle, k)).first->second;
  }

 private:
  static Plan build(cublasLtHandle_t handle, const PlanKey& k) {
    Plan p;
    p.name = gemm_operation_name(k.operand_type == CUDA_R_16BF ? "bf16" : "fp32", k.ta, k.tb, k.M,
                                 k.N, k.K);
    check(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    // Column-major product: first operand is B (op tb), second is A (op ta).
    const cublasOperation_t op_first = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                         sizeof(op_first)),
          "cublasLtMatmulDescSetAttribute(TRANSA)");
    check(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                         sizeof(op_second)),
          "cublasLtMatmulDescSetAttribute(TRANSB)");
    const auto u = [](int v) { return static_cast<uint64_t>(v); };
    check(cublasLtMatrixLayoutCreate(&p.a, k.operand_type, k.tb ? u(k.K) : u(k.N),
                                     k.tb ? u(k.N) : u(k.K), k.ldb),
          "cublasLtMatrixLayoutCreate(B)");
    check(cublasLtMatrixLayoutCreate(&p.b, k.operand_type, k.ta ? u(k.M) : u(k.K),
                                     k.ta ? u(k.K) : u(k.M), k.lda),
          "cublasLtMatrixLayoutCreate(A)");
    check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, u(k.N), u(k.M), k.ldc),
          "cublasLtMatrixLayoutCreate(C)");

    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = k.workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    // The first operand of the column-major product is our B, the second our A.
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                         &k.align_b, sizeof(k.align_b));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                         &k.align_a, sizeof(k.align_a));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                         &k.align_c, sizeof(k.align_c));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                         &k.align_c, sizeof(k.align_c));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c,
                                                             pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw std::runtime_error(
          "gemm: cublasLtMatmulAlgoGetHeuristic found no algorithm for M=" + std::to_string(k.M) +
          " N=" + std::to_string(k.N) + " K=" + std::to_string(k.K));
    p.algo = result.algo;
    p.workspace_bytes = result.workspaceSize;
    return p;
  }

  std::mutex mu_;
  std::map<PlanKey, Plan> plans_;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

void run_gemm(const GemmContext& ctx, cudaDataType_t type, bool ta, bool tb, int M, int N, int K,
              float alpha, const void* A, int lda, const void* B, int ldb, float beta, float* C,
              int ldc, cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("gemm: negative dimension");
  if (M == 0 || N == 0) return;
  if (K == 0) throw std::invalid_argument("gemm: K must be positive on CUDA");
  if (ctx.lt_handle == nullptr) throw std::logic_error("gemm: no cuBLASLt handle");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("gemm: cudaGetDevice failed");
  const PlanKey key{device,
                    type,
                    ta,
                    tb,
                    M,
                    N,
                    K,
                    lda,
                    ldb,
                    ldc,
                    alignment_of(A),
                    alignment_of(B),
                    alignment_of(C),
                    ctx.workspace_bytes};
  auto handle = static_cast<cublasLtHandle_t>(ctx.lt_handle);
  const Plan* p = &plan_cache().get(handle, key);  // plans live as long as the process
  void* workspace = p->workspace_bytes ? ctx.workspace : nullptr;
  capture::enqueue(
      p->name.c_str(), stream,
      [&] { return capture::key_of(handle, p, alpha, A, B, beta, C, workspace, stream); },
      [=] {
        check(cublasLtMatmul(handle, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c,
                             &p->algo, workspace, p->workspace_bytes, stream),
              "cublasLtMatmul");
      });
}

}  // namespace

void Kernels::gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                   float alpha, const float* A, int lda, const float* B, int ldb, float beta,
                   float* C, int ldc, cudaStream_t stream) {
  if (takes_small_gemm(trans_a, trans_b, M, K))
    return gemm_small_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
  run_gemm(ctx, CUDA_R_32F, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
}

void Kernels::gemm(const GemmContext& ctx, bool trans_a, bool trans_b, int M, int N, int K,
                   float alpha, const bfloat16* A, int lda, const bfloat16* B, int ldb, float beta,
                   float* C, int ldc, cudaStream_t stream) {
  if (takes_small_gemm(trans_a, trans_b, M, K))
    return gemm_small_rows(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, stream);
  run_gemm(ctx, CUDA_R_16BF, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
           stream);
}

}  // namespace slipstream::kernels::cuda
