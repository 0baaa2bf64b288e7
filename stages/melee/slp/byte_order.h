// Big-endian loads and stores for the Slippi byte stream (all its numbers are big-endian).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace slipstream::slp {

static_assert(std::endian::native == std::endian::little,
              "the slp library assumes a little-endian host");

namespace detail {
template <size_t N>
struct UintOfSize;
template <>
struct UintOfSize<1> {
  using type = uint8_t;
};
template <>
struct UintOfSize<2> {
  using type = uint16_t;
};
template <>
struct UintOfSize<4> {
  using type = uint32_t;
};
template <>
struct UintOfSize<8> {
  using type = uint64_t;
};

template <class U>
inline U bswap(U v) {
  if constexpr (sizeof(U) == 1) return v;
  if constexpr (sizeof(U) == 2) return __builtin_bswap16(v);
  if constexpr (sizeof(U) == 4) return __builtin_bswap32(v);
  if constexpr (sizeof(U) == 8) return __builtin_bswap64(v);
}
}  // namespace detail

template <class T>
inline T load_be(const uint8_t* p) {
  static_assert(std::is_trivially_copyable_v<T>);
  using U = typename detail::UintOfSize<sizeof(T)>::type;
  U u;
  std::memcpy(&u, p, sizeof(U));
  return std::bit_cast<T>(detail::bswap(u));
}

template <class T>
inline void store_be(uint8_t* p, T value) {
  using U = typename detail::UintOfSize<sizeof(T)>::type;
  const U u = detail::bswap(std::bit_cast<U>(value));
  std::memcpy(p, &u, sizeof(U));
}

}  // namespace slipstream::slp
