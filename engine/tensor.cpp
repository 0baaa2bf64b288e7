#include "engine/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/memory_pool.h"
#include "kernels/step_recorder.h"

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

namespace {
void check_dims(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(Shape::kMaxRank))
    throw std::invalid_argument("Shape: rank " + std::to_string(dims.size()) +
                                " exceeds the maximum of " + std::to_string(Shape::kMaxRank));
  for (int64_t d : dims)
    if (d < 0) throw std::invalid_argument("Shape: negative dimension " + std::to_string(d));
}
}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  check_dims(dims);
  rank_ = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) dims_[i] = dims[i];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

Storage::~Storage() {
  if (!pool || !data) return;
  try {
    pool->deallocate(data, bytes, stream);
  } catch (const std::exception& e) {
    // A pool refusing a block is a bookkeeping bug; continuing would corrupt memory.
    std::fprintf(stderr, "slipstream: fatal: freeing tensor storage: %s\n", e.what());
    std::abort();
  }
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const Device& device, const char* what,
                     void* stream) {
  MemoryPool& pool = Pools::for_device(device);
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>();
  storage->data = pool.allocate(bytes, what, stream);
  storage->bytes = bytes;
  storage->device = device;
  storage->pool = &pool;
  storage->stream = stream;
  return over(std::move(storage), shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Device& device, const char* what) {
  Tensor t = empty(shape, dtype, device, what);
  t.zero_();
  return t;
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, const Device& device) {
  auto storage = std::make_shared<Storage>();
  storage->data = data;
  storage->bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  storage->device = device;
  return over(std::move(storage), shape, dtype);
}

Tensor Tensor::over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  Tensor t;
  t.device_ = storage->device;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

namespace {
void require_defined(const Tensor& t, const char* op) {
  if (!t.defined())
    throw std::logic_error(std::string("Tensor::") + op +
                           ": tensor is undefined (default-constructed)");
}
}  // namespace

Tensor Tensor::reshape(const Shape& shape) const {
  require_defined(*this, "reshape");
  if (shape.numel() != numel())
    throw std::invalid_argument("Tensor::reshape: cannot view " + describe() + " as " +
                                shape.str() + " (" + std::to_string(numel()) + " vs " +
                                std::to_string(shape.numel()) + " elements)");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  require_defined(*this, "slice_rows");
  if (rank() < 1) throw std::invalid_argument("Tensor::slice_rows: " + describe() + " is a scalar");
  if (begin < 0 || begin > end || end > shape_[0])
    throw std::out_of_range("Tensor::slice_rows: rows [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") out of range for " + describe());
  const size_t row_bytes = shape_[0] ? nbytes() / static_cast<size_t>(shape_[0]) : 0;
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(begin) * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::view_bytes(size_t byte_offset, const Shape& shape, DType dtype) const {
  require_defined(*this, "view_bytes");
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  if (byte_offset > nbytes() || bytes > nbytes() - byte_offset)
    throw std::out_of_range("Tensor::view_bytes: " + std::string(dtype_name(dtype)) + shape.str() +
                            " at byte " + std::to_string(byte_offset) + " does not fit in " +
                            describe());
  Tensor t = *this;
  t.offset_ += byte_offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::clone() const {
  require_defined(*this, "clone");
  Tensor t = empty(shape_, dtype_, device_, "clone", storage_->stream);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(const Device& device, const char* what) const {
  require_defined(*this, "to");
  Tensor t = empty(shape_, dtype_, device, what);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  require_defined(*this, "zero_");
  if (nbytes() == 0) return;
  if (device_.is_cpu()) {
    // Under the emulator host memory is the device's: a recorded step's work comes first.
    capture::sync_point("Tensor::zero_ (a synchronous fill)");
    std::memset(raw(), 0, nbytes());
    return;
  }
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::zero(raw(), device_, nbytes());
#else
  throw std::logic_error("Tensor::zero_: " + describe() + " needs a CUDA build");
#endif
}

void Tensor::copy_from(const Tensor& src) {
  require_defined(*this, "copy_from");
  require_defined(src, "copy_from");
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw std::invalid_argument("Tensor::copy_from: shape/dtype mismatch: " + describe() + " <- " +
                                src.describe());
  if (nbytes() == 0 || (raw() == src.raw() && device_ == src.device_)) return;
  if (device_.is_cpu() && src.device_.is_cpu()) {
    capture::sync_point("Tensor::copy_from (a synchronous copy)");
    std::memmove(raw(), src.raw(), nbytes());  // views of one storage may overlap
    return;
  }
#if SLIPSTREAM_HAS_CUDA
  cuda_rt::copy(raw(), device_, src.raw(), src.device_, nbytes());
#else
  throw std::logic_error("Tensor::copy_from: " + describe() + " <- " + src.describe() +
                         " needs a CUDA build");
#endif
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device_.str();
}

void add_f32(const Tensor& a, const Tensor& b, const Tensor& out, void* stream) {
  for (const Tensor* t : {&a, &b, &out})
    if (!t->defined() || t->dtype() != DType::f32 || !(t->shape() == out.shape()) ||
        t->device() != out.device())
      throw std::invalid_argument("add_f32: " + a.describe() + " + " + b.describe() + " -> " +
                                  out.describe() + ": f32 tensors of one shape on one device");
  const size_t n = static_cast<size_t>(out.numel());
  if (out.device().is_cuda()) {
#if SLIPSTREAM_HAS_CUDA
    cuda_rt::add_f32(out.device().index, stream, a.data<float>(), b.data<float>(),
                     out.data<float>(), n);
    return;
#endif
  }
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* z = out.data<float>();
  // On the host in stream order: under the emulator a recorded step keeps it with its work.
  capture::enqueue(
      "add_f32", stream, [&] { return capture::key_of(x, y, z, n); },
      [=] {
        for (size_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
      });
}

}  // namespace slipstream
