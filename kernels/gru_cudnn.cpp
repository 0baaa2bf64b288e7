// kernels/gru_cudnn.h. cuDNN is opened at run time: the functions below come from
// libcudnn.so.9 (the shim that exports the whole API and loads its sub-libraries), typed by the
// headers' own declarations.
#include "kernels/gru_cudnn.h"

#if SLIPSTREAM_KERNELS_CUDA

#include <cuda_runtime.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda_kernels.h"
#include "kernels/step_recorder.h"

namespace slipstream::kernels::cuda {

namespace {

constexpr const char* kOp = "gru (cuDNN)";

#define SLIPSTREAM_CUDNN_FUNCTIONS(X) \
  X(cudnnGetVersion)                  \
  X(cudnnCreate)                      \
  X(cudnnDestroy)                     \
  X(cudnnSetStream)                   \
  X(cudnnGetErrorString)              \
  X(cudnnCreateTensorDescriptor)      \
  X(cudnnSetTensorNdDescriptor)       \
  X(cudnnGetTensorNdDescriptor)       \
  X(cudnnDestroyTensorDescriptor)     \
  X(cudnnCreateDropoutDescriptor)     \
  X(cudnnSetDropoutDescriptor)        \
  X(cudnnDestroyDropoutDescriptor)    \
  X(cudnnCreateRNNDescriptor)         \
  X(cudnnSetRNNDescriptor_v8)         \
  X(cudnnDestroyRNNDescriptor)        \
  X(cudnnCreateRNNDataDescriptor)     \
  X(cudnnSetRNNDataDescriptor)        \
  X(cudnnDestroyRNNDataDescriptor)    \
  X(cudnnGetRNNWeightSpaceSize)       \
  X(cudnnGetRNNTempSpaceSizes)        \
  X(cudnnGetRNNWeightParams)          \
  X(cudnnRNNForward)                  \
  X(cudnnRNNBackwardData_v8)          \
  X(cudnnRNNBackwardWeights_v8)

struct CudnnApi {
#define SLIPSTREAM_CUDNN_POINTER(f) decltype(&::f) f = nullptr;
  SLIPSTREAM_CUDNN_FUNCTIONS(SLIPSTREAM_CUDNN_POINTER)
#undef SLIPSTREAM_CUDNN_POINTER
};

const CudnnApi& api() {
  static const CudnnApi a = [] {
    const std::string soname = "libcudnn.so." + std::to_string(CUDNN_MAJOR);
    void* lib = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw std::runtime_error(std::string(kOp) + ": " + soname +
                               " not found (install cuDNN 9: the CUDA toolkit's, or the "
                               "nvidia-cudnn wheel with its lib folder on LD_LIBRARY_PATH), or "
                               "use the gru stage's backend: kernels");
    CudnnApi r;
#define SLIPSTREAM_CUDNN_LOAD(f)                                \
  r.f = reinterpret_cast<decltype(&::f)>(::dlsym(lib, #f));     \
  if (!r.f)                                                     \
    throw std::runtime_error(std::string(kOp) + ": " + soname + \
                             " has no " #f                      \
                             ", which "                         \
                             "cuDNN 9 has");
    SLIPSTREAM_CUDNN_FUNCTIONS(SLIPSTREAM_CUDNN_LOAD)
#undef SLIPSTREAM_CUDNN_LOAD
    return r;
  }();
  return a;
}

void check(cudnnStatus_t s, const char* call) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(kOp) + ": " + call +
                           " failed: " + api().cudnnGetErrorString(s));
}

cudnnDataType_t data_type(bool bf16) {
  return bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

// Staging areas start on 256-byte boundaries.
size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

void check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(std::string(kOp) + ": " + call + " failed: " + cudaGetErrorString(e) +
                           (e == cudaErrorMemoryAllocation ? " (lower replays.batch_size)" : ""));
}

}  // namespace

struct CudnnGru::Descriptors {
  cudnnHandle_t handle = nullptr;
  cudnnDropoutDescriptor_t dropout = nullptr;
  cudnnRNNDescriptor_t rnn = nullptr;
  cudnnRNNDataDescriptor_t x = nullptr, y = nullptr;
  cudnnTensorDescriptor_t h = nullptr;       // (layers, B, H): no initial state is passed
  cudnnTensorDescriptor_t matrix = nullptr;  // filled by cudnnGetRNNWeightParams
  cudnnTensorDescriptor_t bias = nullptr;
  size_t work = 0, reserve = 0;
  // Also after a constructor that threw half way. Teardown: nothing to report to.
  ~Descriptors() {
    if (!handle) return;  // nothing was created (cuDNN may not even have loaded)
    const CudnnApi& f = api();
    if (bias) f.cudnnDestroyTensorDescriptor(bias);
    if (matrix) f.cudnnDestroyTensorDescriptor(matrix);
    if (h) f.cudnnDestroyTensorDescriptor(h);
    if (y) f.cudnnDestroyRNNDataDescriptor(y);
    if (x) f.cudnnDestroyRNNDataDescriptor(x);
    if (rnn) f.cudnnDestroyRNNDescriptor(rnn);
    if (dropout) f.cudnnDestroyDropoutDescriptor(dropout);
    if (handle) f.cudnnDestroy(handle);
  }
};

std::string CudnnGru::bf16_unsupported() {
  return bf16_unsupported(api().cudnnGetVersion());
}

std::string CudnnGru::bf16_unsupported(size_t v) {
  if (v >= 91300) return "";
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " has no bf16 RNN (cuDNN 9.13 and later have)";
}

CudnnGru::CudnnGru(cudaStream_t stream, int in, int hidden, std::vector<LayerOffsets> layers,
                   bool bf16)
    : d_(std::make_unique<Descriptors>()),
      stream_(stream),
      in_(in),
      hidden_(hidden),
      bf16_(bf16),
      layers_(std::move(layers)) {
  if (in < 1 || hidden < 1 || layers_.empty())
    throw std::invalid_argument(std::string(kOp) + ": dimensions must be positive");
  if (bf16) {
    const std::string why = bf16_unsupported();
    if (!why.empty()) throw std::runtime_error(std::string(kOp) + ": " + why);
  }
  const CudnnApi& f = api();
  Descriptors& d = *d_;
  check(f.cudnnCreate(&d.handle), "cudnnCreate");
  check(f.cudnnSetStream(d.handle, stream_), "cudnnSetStream");
  check(f.cudnnCreateDropoutDescriptor(&d.dropout), "cudnnCreateDropoutDescriptor");
  // No dropout between layers: no random states are needed.
  check(f.cudnnSetDropoutDescriptor(d.dropout, d.handle, 0.0f, nullptr, 0, 0),
        "cudnnSetDropoutDescriptor");
  check(f.cudnnCreateRNNDescriptor(&d.rnn), "cudnnCreateRNNDescriptor");
  // fp32: FMA math, so no TF32 rounding; bf16: data, weights and states in bf16, sums in fp32,
  // on tensor cores where cuDNN takes that (else its default math).
  auto describe = [&](cudnnMathType_t math) {
    return f.cudnnSetRNNDescriptor_v8(
        d.rnn, CUDNN_RNN_ALGO_STANDARD, CUDNN_GRU, CUDNN_RNN_DOUBLE_BIAS, CUDNN_UNIDIRECTIONAL,
        CUDNN_LINEAR_INPUT, data_type(bf16_), CUDNN_DATA_FLOAT, math, in, hidden, hidden,
        static_cast<int32_t>(layers_.size()), d.dropout, CUDNN_RNN_PADDED_IO_ENABLED);
  };
  cudnnStatus_t set = describe(bf16_ ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH);
  if (bf16_ && set != CUDNN_STATUS_SUCCESS && describe(CUDNN_DEFAULT_MATH) == CUDNN_STATUS_SUCCESS)
    set = CUDNN_STATUS_SUCCESS;
  check(set, "cudnnSetRNNDescriptor_v8");
  check(f.cudnnGetRNNWeightSpaceSize(d.handle, d.rnn, &weight_bytes_),
        "cudnnGetRNNWeightSpaceSize");
  check(f.cudnnCreateRNNDataDescriptor(&d.x), "cudnnCreateRNNDataDescriptor");
  check(f.cudnnCreateRNNDataDescriptor(&d.y), "cudnnCreateRNNDataDescriptor");
  check(f.cudnnCreateTensorDescriptor(&d.h), "cudnnCreateTensorDescriptor");
  check(f.cudnnCreateTensorDescriptor(&d.matrix), "cudnnCreateTensorDescriptor");
  check(f.cudnnCreateTensorDescriptor(&d.bias), "cudnnCreateTensorDescriptor");
}

CudnnGru::~CudnnGru() = default;

CudnnGru::Needs CudnnGru::describe_batch(int B, int L) {
  if (B < 1 || L < 1) throw std::invalid_argument(std::string(kOp) + ": empty batch");
  const CudnnApi& f = api();
  Descriptors& d = *d_;
  B_ = B, L_ = L;
  const std::vector<int> lengths(static_cast<size_t>(B), L);
  const cudnnDataType_t type = data_type(bf16_);
  check(f.cudnnSetRNNDataDescriptor(d.x, type, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, L, B,
                                    in_, lengths.data(), nullptr),
        "cudnnSetRNNDataDescriptor (x)");
  check(f.cudnnSetRNNDataDescriptor(d.y, type, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, L, B,
                                    hidden_, lengths.data(), nullptr),
        "cudnnSetRNNDataDescriptor (y)");
  const int dims[3] = {layers(), B, hidden_}, strides[3] = {B * hidden_, hidden_, 1};
  check(f.cudnnSetTensorNdDescriptor(d.h, type, 3, dims, strides),
        "cudnnSetTensorNdDescriptor (h)");
  check(f.cudnnGetRNNTempSpaceSizes(d.handle, d.rnn, CUDNN_FWD_MODE_TRAINING, d.x, &d.work,
                                    &d.reserve),
        "cudnnGetRNNTempSpaceSizes");
  const size_t M = size_t(B) * L;
  const size_t staging =
      bf16_ ? 2 * aligned(M * in_ * sizeof(bfloat16)) + 2 * aligned(M * hidden_ * sizeof(bfloat16))
            : 0;
  return {d.work, d.reserve, staging};
}

CudnnGru::Staged CudnnGru::staged(const Buffers& b) const {
  if (!b.staging) throw std::logic_error(std::string(kOp) + ": the bf16 form needs staging");
  const size_t M = size_t(B_) * L_;
  const size_t xs = aligned(M * in_ * sizeof(bfloat16)),
               ys = aligned(M * hidden_ * sizeof(bfloat16));
  auto* base = static_cast<char*>(b.staging);
  return {reinterpret_cast<bfloat16*>(base), reinterpret_cast<bfloat16*>(base + xs),
          reinterpret_cast<bfloat16*>(base + xs + ys),
          reinterpret_cast<bfloat16*>(base + xs + 2 * ys)};
}

void CudnnGru::set_batch(int* seq_lengths) {
  capture::sync_point("gru (cuDNN): the sequence lengths of a new batch shape");
  const std::vector<int> lengths(static_cast<size_t>(B_), L_);
  check(cudaMemcpyAsync(seq_lengths, lengths.data(), lengths.size() * sizeof(int),
                        cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (sequence lengths)");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (sequence lengths)");
}

// Where cuDNN keeps each gate's matrix and bias of each layer in its weight space, against
// nn.GRU's layout: linear layers 0-2 are the input matrices of r, z, n (weight_ih's row blocks),
// 3-5 the recurrent ones (weight_hh's), each with its bias (bias_ih's, bias_hh's blocks).
void CudnnGru::map_weights(const void* weight_space) {
  const CudnnApi& f = api();
  Descriptors& d = *d_;
  const size_t H = static_cast<size_t>(hidden_);
  std::vector<Piece> pieces;
  auto numel = [&](cudnnTensorDescriptor_t t, const char* what) {
    cudnnDataType_t type;
    int nd = 0, dims[8], strides[8];
    check(f.cudnnGetTensorNdDescriptor(t, 8, &type, &nd, dims, strides),
          "cudnnGetTensorNdDescriptor");
    size_t n = 1;
    for (int i = 0; i < nd; ++i) n *= static_cast<size_t>(dims[i]);
    if (type != data_type(bf16_))
      throw std::runtime_error(std::string(kOp) + ": cuDNN keeps " + what +
                               " in another type than its data's");
    return n;
  };
  const auto* base = static_cast<const char*>(weight_space);
  for (size_t k = 0; k < layers_.size(); ++k) {
    const size_t in = k == 0 ? static_cast<size_t>(in_) : H;
    for (int id = 0; id < 6; ++id) {
      void *m = nullptr, *b = nullptr;
      check(f.cudnnGetRNNWeightParams(d.handle, d.rnn, static_cast<int32_t>(k), weight_bytes_,
                                      weight_space, id, d.matrix, &m, d.bias, &b),
            "cudnnGetRNNWeightParams");
      const bool input = id < 3;
      const size_t gate = static_cast<size_t>(id % 3), cols = input ? in : H;
      const LayerOffsets& o = layers_[k];
      if (!m || !b || numel(d.matrix, "a matrix") != H * cols || numel(d.bias, "a bias") != H)
        throw std::runtime_error(std::string(kOp) + ": cuDNN's weight space for layer " +
                                 std::to_string(k) + ", linear layer " + std::to_string(id) +
                                 " is not the H x " + std::to_string(cols) + " matrix expected");
      auto offset = [&](const void* p) {
        return static_cast<size_t>(static_cast<const char*>(p) - base) / elem_bytes();
      };
      pieces.push_back({(input ? o.w_ih : o.w_hh) + gate * H * cols, offset(m), H * cols});
      pieces.push_back({(input ? o.b_ih : o.b_hh) + gate * H, offset(b), H});
    }
  }
  // Neighbours on both sides become one copy.
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.ours < b.ours; });
  pieces_.clear();
  for (const Piece& p : pieces) {
    if (!pieces_.empty() && pieces_.back().ours + pieces_.back().n == p.ours &&
        pieces_.back().theirs + pieces_.back().n == p.theirs)
      pieces_.back().n += p.n;
    else
      pieces_.push_back(p);
  }
  mapped_for_ = weight_space;
}

// Each cuDNN call is one recorded operation (kernels/step_recorder.h): issued at once, or kept
// for the step's CUDA graph, its key the call and every pointer and size it passes.
void CudnnGru::forward(const float* x, const float* w, const bfloat16* w_bf, float* y,
                       const Buffers& b, bool training) {
  if (B_ == 0) throw std::logic_error(std::string(kOp) + ": describe_batch() before forward");
  const void* weights = bf16_ ? static_cast<const void*>(w_bf) : static_cast<const void*>(w);
  if (!weights)
    throw std::invalid_argument(std::string(kOp) + ": no " + (bf16_ ? "bf16 " : "fp32 ") +
                                "weights given");
  if (mapped_for_ != b.weight_space) map_weights(b.weight_space);
  const size_t es = elem_bytes();
  for (const Piece& p : pieces_)
    Kernels::copy_bytes(static_cast<char*>(b.weight_space) + p.theirs * es,
                        static_cast<const char*>(weights) + p.ours * es, p.n * es, stream_);
  const size_t M = size_t(B_) * L_;
  const void* xin = x;
  void* yout = y;
  Staged st{};
  if (bf16_) {
    st = staged(b);
    Kernels::fp32_to_bf16(x, st.x, M * in_, stream_);
    xin = st.x, yout = st.y;
  }
  Descriptors* d = d_.get();
  const size_t wbytes = weight_bytes_;
  capture::enqueue(
      "cudnnRNNForward", stream_,
      [&] {
        return capture::key_of(reinterpret_cast<uintptr_t>(d), xin, yout, b.weight_space, b.work,
                               b.reserve, b.seq_lengths, B_, L_, training);
      },
      [d, xin, yout, b, training, wbytes] {
        check(api().cudnnRNNForward(d->handle, d->rnn,
                                    training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                                    b.seq_lengths, d->x, xin, d->y, yout, d->h, nullptr, nullptr,
                                    d->h, nullptr, nullptr, wbytes, b.weight_space, d->work, b.work,
                                    training ? d->reserve : 0, training ? b.reserve : nullptr),
              "cudnnRNNForward");
      });
  if (bf16_) Kernels::bf16_to_fp32(st.y, y, M * hidden_, stream_);
}

void CudnnGru::backward(const float* x, const float* y, const float* dy, float* dx, float* dw,
                        const Buffers& b) {
  if (B_ == 0) throw std::logic_error(std::string(kOp) + ": describe_batch() before backward");
  if (mapped_for_ != b.weight_space)
    throw std::logic_error(std::string(kOp) + ": backward without its forward");
  const size_t M = size_t(B_) * L_;
  const void *xin = x, *yin = y, *dyin = dy;
  void* dxout = dx;
  Staged st{};
  if (bf16_) {
    st = staged(b);  // x and y: the forward's staged copies
    Kernels::fp32_to_bf16(dy, st.dy, M * hidden_, stream_);
    xin = st.x, yin = st.y, dyin = st.dy, dxout = st.dx;
  }
  Descriptors* d = d_.get();
  const size_t wbytes = weight_bytes_;
  capture::enqueue(
      "cudnnRNNBackwardData_v8", stream_,
      [&] {
        return capture::key_of(reinterpret_cast<uintptr_t>(d), yin, dyin, dxout, b.weight_space,
                               b.work, b.reserve, b.seq_lengths, B_, L_);
      },
      [d, yin, dyin, dxout, b, wbytes] {
        check(api().cudnnRNNBackwardData_v8(d->handle, d->rnn, b.seq_lengths, d->y, yin, dyin, d->x,
                                            dxout, d->h, nullptr, nullptr, nullptr, d->h, nullptr,
                                            nullptr, nullptr, wbytes, b.weight_space, d->work,
                                            b.work, d->reserve, b.reserve),
              "cudnnRNNBackwardData_v8");
      });
  if (bf16_) Kernels::bf16_to_fp32(st.dx, dx, M * in_, stream_);
  // cuDNN adds into its weight gradients (the only mode it has): start them at zero, then add
  // them into the caller's.
  capture::enqueue(
      "cudaMemsetAsync", stream_, [&] { return capture::key_of(b.dweight_space, wbytes); },
      [dws = b.dweight_space, wbytes, s = stream_] {
        check(cudaMemsetAsync(dws, 0, wbytes, s), "cudaMemsetAsync (cuDNN's weight gradients)");
      });
  capture::enqueue(
      "cudnnRNNBackwardWeights_v8", stream_,
      [&] {
        return capture::key_of(reinterpret_cast<uintptr_t>(d), xin, yin, b.dweight_space, b.work,
                               b.reserve, b.seq_lengths, B_, L_);
      },
      [d, xin, yin, b, wbytes] {
        check(api().cudnnRNNBackwardWeights_v8(
                  d->handle, d->rnn, CUDNN_WGRAD_MODE_ADD, b.seq_lengths, d->x, xin, d->h, nullptr,
                  d->y, yin, wbytes, b.dweight_space, d->work, b.work, d->reserve, b.reserve),
              "cudnnRNNBackwardWeights_v8");
      });
  for (const Piece& p : pieces_) {
    if (bf16_)
      Kernels::accumulate_bf16(
          dw + p.ours, static_cast<const bfloat16*>(b.dweight_space) + p.theirs, p.n, stream_);
    else
      Kernels::add_inplace<float>(
          dw + p.ours, static_cast<const float*>(b.dweight_space) + p.theirs, p.n, stream_);
  }
}

}  // namespace slipstream::kernels::cuda

#endif  // SLIPSTREAM_KERNELS_CUDA
