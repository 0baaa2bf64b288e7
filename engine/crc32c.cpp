#include "engine/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define SLIPSTREAM_CRC32C_X86 1
#endif

namespace slipstream {

namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

// `c` is the running (inverted) register, as are the SSE4.2 helper's.
uint32_t table_update(uint32_t c, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

#ifdef SLIPSTREAM_CRC32C_X86
// Compiled for SSE4.2 alone, so the rest of the build runs on any x86-64; only called where
// __builtin_cpu_supports says the instruction exists.
__attribute__((target("sse4.2"))) uint32_t sse42_update(uint32_t c, const uint8_t* p, size_t n) {
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) c = _mm_crc32_u8(c, *p++);
#if defined(__x86_64__)
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<uint32_t>(c64);
#endif
  for (; n > 0; --n) c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

bool detect_hardware() {
#ifdef SLIPSTREAM_CRC32C_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

bool crc32c_hardware() {
  static const bool has = detect_hardware();
  return has;
}

uint32_t crc32c_table(const void* data, size_t n, uint32_t crc) {
  return ~table_update(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#ifdef SLIPSTREAM_CRC32C_X86
  if (crc32c_hardware()) return ~sse42_update(~crc, static_cast<const uint8_t*>(data), n);
#endif
  return crc32c_table(data, n, crc);
}

}  // namespace slipstream
