// Tensor: shape, dtype, device and pooled storage. Contiguous row-major; views share storage.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "engine/device.h"
#include "engine/dtype.h"

namespace slipstream {

class MemoryPool;

// Up to 8 dimensions stored inline: copying a shape never allocates.
class Shape {
 public:
  static constexpr int kMaxRank = 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(rank_)}; }
  std::string str() const;  // "[256, 60, 128]"
  bool operator==(const Shape& o) const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// A block of memory owned by a pool (or borrowed: pool == nullptr, never freed by us).
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  MemoryPool* pool = nullptr;
  void* stream = nullptr;  // CUDA stream the block was allocated for
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates from the device's pool; `what` names it in out-of-memory errors.
  static Tensor empty(const Shape& shape, DType dtype, const Device& device = Device::cpu(),
                      const char* what = "tensor", void* stream = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device = Device::cpu(),
                      const char* what = "tensor");
  // Wraps memory the caller keeps alive (e.g. a memory-mapped file).
  static Tensor borrow(void* data, const Shape& shape, DType dtype,
                       const Device& device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data) + offset_; }
  // Typed access; checks the dtype's size matches T (bf16/f16 read as uint16_t).
  template <class T>
  T* data() const {
    if (sizeof(T) != dtype_size(dtype_))
      throw std::logic_error("Tensor::data<T>: element size does not match dtype " +
                             std::string(dtype_name(dtype_)));
    return static_cast<T*>(raw());
  }
  template <class T>
  std::span<T> span() const {
    return {data<T>(), static_cast<size_t>(numel())};
  }

  // Same storage, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // A tensor of `shape` and `dtype` inside this one's bytes, from `byte_offset` (a packed
  // buffer's pieces: the prefetch ring's slots), sharing storage.
  Tensor view_bytes(size_t byte_offset, const Shape& shape, DType dtype) const;
  // How many tensors (views included) share this one's storage: 1 when it is the only one.
  long storage_users() const { return storage_.use_count(); }
  // Deep copy on the same device. Device tensors need a CUDA build; copies are synchronous
  // (after everything already queued on the device, on any stream).
  Tensor clone() const;
  // A copy on `device` (synchronous, as clone), e.g. a device tensor's host copy for writing.
  Tensor to(const Device& device, const char* what = "copy") const;
  void zero_();  // host or device
  // Same shape/dtype; any direction between host and CUDA devices (synchronous).
  void copy_from(const Tensor& src);
  // True when both share storage and offset.
  bool same_storage(const Tensor& o) const {
    return storage_ == o.storage_ && offset_ == o.offset_;
  }
  // True when both are views of one allocation (their relative placement is then the same in
  // every process that built them the same way).
  bool same_block(const Tensor& o) const { return storage_ == o.storage_; }
  std::string describe() const;  // "f32[256, 60] on cpu"

 private:
  // A whole-storage tensor over `storage`, which holds its bytes and device.
  static Tensor over(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_;
};

// out = a + b, element by element: f32 tensors of one shape on one device (out may be a or b).
// On a CUDA device enqueued on `stream` (a cudaStream_t; asynchronous: order the readers of
// `out` after it); on the host done at once, except inside a step being recorded for a graph
// under the emulator (then in the step's order).
void add_f32(const Tensor& a, const Tensor& b, const Tensor& out, void* stream = nullptr);

}  // namespace slipstream
