// See gemm_onednn.h. One matmul primitive per (element type, shape, transposes, leading
// dimensions, alpha, beta), made on first use and kept: oneDNN picks its kernel at creation, so the
// steady state only executes. A primitive runs on any thread, with that thread's stream and
// scratchpad. Products that differ only in their rows (M) and the strides of A and C form a
// family: its first kPlansPerFamily row counts get primitives of their own, later ones share one
// whose M and those strides are given at each call (a policy stepping any number of games, an
// evaluation's last, shorter batch), so the primitives, each a JIT-compiled kernel, stay few.
#include "kernels/gemm_onednn.h"

#if SLIPSTREAM_HAS_ONEDNN

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/vector_math.h"

namespace slipstream::kernels {

namespace {

using dnnl::memory;

struct Key {
  bool bf16;  // the operands' type: bf16, or fp32
  int M, N, K, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  auto tie() const { return std::tie(bf16, M, N, K, lda, ldb, ldc, ta, tb, alpha, beta); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// Row counts of one family with a primitive of their own. A training step's products have one
// or two (its blocks of rows); at 960 rows the shared form ran 1.01-1.13x their time (its jit
// gemm for brgemm).
constexpr int kPlansPerFamily = 8;

// What a family shares: all of a Key but M, lda and ldc.
Key family_of(Key k) {
  k.M = k.lda = k.ldc = -1;
  return k;
}

// The tensors' descriptions of a product (dims and strides; DNNL_RUNTIME_DIM_VAL where given at
// each call).
struct Descs {
  memory::desc a, b, c;
};
Descs descs_of(const Key& k) {
  using dt = memory::data_type;
  const dt in = k.bf16 ? dt::bf16 : dt::f32;
  const auto dim = [](int v) { return v < 0 ? DNNL_RUNTIME_DIM_VAL : memory::dim(v); };
  // op(A) is (M, K): stored (M, K) with row stride lda, or (K, M) (transposed) with lda.
  return {memory::desc({dim(k.M), k.K}, in,
                       k.ta ? memory::dims{1, dim(k.lda)} : memory::dims{dim(k.lda), 1}),
          memory::desc({k.K, k.N}, in, k.tb ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1}),
          memory::desc({dim(k.M), k.N}, dt::f32, memory::dims{dim(k.ldc), 1})};
}

struct Plan {
  dnnl::matmul matmul;
  memory::desc scratch;
  bool native = false;  // bf16: a bf16 kernel; fp32: not oneDNN's reference loops
  std::string kernel;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine = [] {
    // SLIPSTREAM_CPU_ISA's cap holds for oneDNN's kernels too (before its first JIT; where the
    // user capped oneDNN itself, ONEDNN_MAX_CPU_ISA, the lower cap wins).
    if (cpu_isa() == CpuIsa::avx2 && cpu_isa_supported() == CpuIsa::avx512)
      (void)dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx2);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

Plan make_plan(const Key& k) {
  Plan p;
  const Descs d = descs_of(k);
  dnnl::primitive_attr attr;
  // The caller's scratchpad: oneDNN's own is shared by all primitives unless the library was
  // built for concurrent execution, and blocks of rows run on several threads at once.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
  if (k.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(k.beta);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(d.a, d.b, d.c), attr, cpu_engine());
  p.kernel = pd.impl_info_str();
  p.scratch = pd.scratchpad_desc();
  // fp32: any kernel but oneDNN's reference loops: its brgemm ("brg:avx512_core", dense strides)
  // and its jit gemm ("gemm:jit", any strides) run the level's vector code.
  p.native = k.bf16 ? p.kernel.find("bf16") != std::string::npos ||
                          p.kernel.find("amx") != std::string::npos
                    : p.kernel.rfind("ref", 0) != 0;
  p.matmul = dnnl::matmul(pd);
  return p;
}

struct Plans {
  std::mutex mu;
  std::map<Key, Plan> made;            // by exact key, or by family (the shared form)
  std::map<Key, const Plan*> taken;    // each key asked for: the plan it runs
  std::map<Key, int> rows_per_family;  // row counts of a family with a plan of their own
};
Plans& plans() {
  static Plans p;
  return p;
}

const Plan& plan_for(const Key& k) {
  Plans& all = plans();
  std::lock_guard<std::mutex> lock(all.mu);
  if (auto it = all.taken.find(k); it != all.taken.end()) return *it->second;
  int& own = all.rows_per_family[family_of(k)];
  const Key key = own < kPlansPerFamily ? k : family_of(k);
  auto it = all.made.find(key);
  if (it == all.made.end()) {
    it = all.made.emplace(key, make_plan(key)).first;
    if (key.M >= 0) ++own;
  }
  all.taken.emplace(k, &it->second);
  return it->second;
}

struct Probe {
  bool native = false;
  std::string what;  // the kernel's name, or why there is none
};

std::atomic<uint64_t> calls{0};
std::atomic<bool> enabled{[] {
  const char* e = std::getenv("SLIPSTREAM_ONEDNN");
  return !(e && std::string(e) == "0");
}()};

// bf16 needs AVX-512 BF16 and the AVX-512 level; fp32 the AVX2 level or above (below it oneDNN's
// SSE kernels took 1.03x sgemm's time in the whole cpu_quick step).
Probe probe(bool bf16) {
  if (bf16 && !cpu_has_avx512bf16()) return {false, "the CPU has no AVX-512 BF16"};
  const CpuIsa need = bf16 ? CpuIsa::avx512 : CpuIsa::avx2;
  if (cpu_isa_supported() < need)
    return {false, std::string("the CPU has no ") + (bf16 ? "AVX-512" : "AVX2")};
  if (cpu_isa() < need)
    return {false, std::string("the level is capped at ") + cpu_isa_name(cpu_isa()) +
                       " (SLIPSTREAM_CPU_ISA)"};
  try {
    const Plan& p = plan_for({bf16, 64, 64, 64, 64, 64, 64, false, false, 1.0f, 0.0f});
    return {p.native, p.native ? p.kernel : "oneDNN offers only '" + p.kernel + "'"};
  } catch (const dnnl::error& e) {
    return {false, std::string("oneDNN failed: ") + e.what()};
  }
}

const Probe& probed(bool bf16) {
  static const Probe b = probe(true), f = probe(false);
  return bf16 ? b : f;
}

bool native_for(const Key& k) {
  try {
    return plan_for(k).native;
  } catch (const dnnl::error&) {
    return false;  // a product oneDNN will not plan: the caller's other path runs it
  }
}

// One product on the calling thread, with this thread's stream, plan and memory objects; false,
// running nothing, where oneDNN will not plan it or (`native_only`) has no native kernel for it.
template <class T>
bool execute(const Key& key, const T* A, const T* B, float* C, bool native_only) {
  // OpenMP's thread count is per calling thread: hold each TBB worker's to one, once.
  thread_local const bool one_thread = (omp_set_num_threads(1), true);
  (void)one_thread;
  thread_local dnnl::stream stream(cpu_engine());
  // This thread's plan and memory objects per product, found without the shared cache's lock,
  // made once and re-pointed each call, and a plain argument array (the C API): nothing of ours
  // allocates in the steady state.
  struct Bound {
    const Plan* plan = nullptr;
    memory a, b, c, scratch;
    std::vector<unsigned char> scratch_bytes;
  };
  thread_local std::map<Key, Bound> bound;
  auto it = bound.find(key);
  if (it == bound.end()) {
    Bound m;
    try {
      m.plan = &plan_for(key);
    } catch (const dnnl::error&) {
      m.plan = nullptr;  // a product oneDNN will not plan: the caller's other path runs it
    }
    if (m.plan) {
      m.scratch_bytes.resize(std::max<size_t>(m.plan->scratch.get_size(), 1));
      const Descs d = descs_of(key);  // the concrete shape, whichever plan runs it
      m.a = memory(d.a, cpu_engine(), nullptr);
      m.b = memory(d.b, cpu_engine(), nullptr);
      m.c = memory(d.c, cpu_engine(), nullptr);
      m.scratch = memory(m.plan->scratch, cpu_engine(), m.scratch_bytes.data());
    }
    it = bound.emplace(key, std::move(m)).first;
  }
  Bound& m = it->second;
  if (!m.plan || (native_only && !m.plan->native)) return false;
  m.a.set_data_handle(const_cast<T*>(A));
  m.b.set_data_handle(const_cast<T*>(B));
  m.c.set_data_handle(C);
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, m.a.get()},
                                  {DNNL_ARG_WEIGHTS, m.b.get()},
                                  {DNNL_ARG_DST, m.c.get()},
                                  {DNNL_ARG_SCRATCHPAD, m.scratch.get()}};
  dnnl::error::wrap_c_api(
      dnnl_primitive_execute(m.plan->matmul.get(), stream.get(), 4, args),
      key.bf16 ? "dnnl_primitive_execute (bf16 GEMM)" : "dnnl_primitive_execute (fp32 GEMM)");
  stream.wait();
  calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool onednn_bf16_gemm_native() {
  return enabled.load(std::memory_order_relaxed) && probed(true).native;
}

std::string onednn_bf16_gemm_kernel() {
  if (!enabled.load(std::memory_order_relaxed)) return "oneDNN is turned off (SLIPSTREAM_ONEDNN=0)";
  return probed(true).what;
}

bool onednn_f32_gemm_native() {
  return enabled.load(std::memory_order_relaxed) && probed(false).native;
}

std::string onednn_f32_gemm_kernel() {
  if (!enabled.load(std::memory_order_relaxed)) return "oneDNN is turned off (SLIPSTREAM_ONEDNN=0)";
  return probed(false).what;
}

bool set_onednn_enabled(bool on) {
  return enabled.exchange(on, std::memory_order_relaxed);
}

bool onednn_gemm_bf16_native_for(bool trans_a, bool trans_b, int M, int N, int K, int lda, int ldb,
                                 int ldc, float alpha, float beta) {
  return native_for({true, M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta});
}

void onednn_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                      const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C,
                      int ldc) {
  // gemm_bf16 asked onednn_gemm_bf16_native_for first: run what oneDNN planned.
  if (!execute<uint16_t>({true, M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta}, A, B, C,
                         false))
    throw std::runtime_error("oneDNN could not plan a bf16 GEMM of " + std::to_string(M) + " x " +
                             std::to_string(N) + " x " + std::to_string(K));
}

bool onednn_gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                     int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  return execute<float>({false, M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta}, A, B, C,
                        true);
}

uint64_t onednn_gemm_calls() {
  return calls.load(std::memory_order_relaxed);
}

size_t onednn_gemm_primitives() {
  Plans& all = plans();
  std::lock_guard<std::mutex> lock(all.mu);
  return all.made.size();
}

}  // namespace slipstream::kernels

#else  // no oneDNN in this build

namespace slipstream::kernels {

bool onednn_bf16_gemm_native() {
  return false;
}
std::string onednn_bf16_gemm_kernel() {
  return "this build has no oneDNN (libdnnl-dev)";
}
bool onednn_f32_gemm_native() {
  return false;
}
std::string onednn_f32_gemm_kernel() {
  return "this build has no oneDNN (libdnnl-dev)";
}
bool onednn_gemm_bf16_native_for(bool, bool, int, int, int, int, int, int, float, float) {
  return false;
}
void onednn_gemm_bf16(bool, bool, int, int, int, float, const uint16_t*, int, const uint16_t*, int,
                      float, float*, int) {}
bool onednn_gemm_f32(bool, bool, int, int, int, float, const float*, int, const float*, int, float,
                     float*, int) {
  return false;
}
bool set_onednn_enabled(bool) {
  return false;
}
uint64_t onednn_gemm_calls() {
  return 0;
}
size_t onednn_gemm_primitives() {
  return 0;
}

}  // namespace slipstream::kernels

#endif
