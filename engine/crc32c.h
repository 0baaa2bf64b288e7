// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of TFRecord framing and of
// each tensor of a checkpoint. The SSE4.2 `crc32` instruction computes it where the CPU has one;
// a table does elsewhere.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slipstream {

// The CRC of `n` bytes at `data`, continuing from `crc` (the CRC of what came before; 0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The same through the table alone (tests compare the two paths).
uint32_t crc32c_table(const void* data, size_t n, uint32_t crc = 0);
// Whether crc32c() uses the CPU's instruction.
bool crc32c_hardware();

// TFRecord stores CRCs masked: a CRC of data that holds CRCs is then no trivial function of them.
inline uint32_t crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
inline uint32_t crc32c_unmask(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace slipstream
