#include "engine/dtype.h"

#include <array>

namespace slipstream {

namespace {
struct DTypeNames {
  DType type;
  std::string_view name;
  std::string_view safetensors;
};
constexpr std::array<DTypeNames, 8> kNames{{{DType::f32, "f32", "F32"},
                                            {DType::f64, "f64", "F64"},
                                            {DType::bf16, "bf16", "BF16"},
                                            {DType::f16, "f16", "F16"},
                                            {DType::i32, "i32", "I32"},
                                            {DType::i64, "i64", "I64"},
                                            {DType::u8, "u8", "U8"},
                                            {DType::u16, "u16", "U16"}}};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& n : kNames)
    if (n.type == t) return n.name;
  return "?";
}
std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& n : kNames)
    if (n.name == name) return n.type;
  return std::nullopt;
}
std::string_view dtype_safetensors_name(DType t) {
  for (const auto& n : kNames)
    if (n.type == t) return n.safetensors;
  return "?";
}
std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (const auto& n : kNames)
    if (n.safetensors == name) return n.type;
  return std::nullopt;
}

}  // namespace slipstream
