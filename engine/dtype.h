// Element types of tensors, with their sizes and the names used in YAML schemas and safetensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace slipstream {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64, u8, u16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::bf16:
    case DType::f16:
    case DType::u16:
      return 2;
    case DType::u8:
      return 1;
  }
  return 0;
}

// "f32", "bf16", ... as written in schemas and shown to users.
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
// safetensors spells them "F32", "BF16", "I32", ...
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::u16;
}  // also the storage of bf16/f16

}  // namespace slipstream
