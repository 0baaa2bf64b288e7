// An independent PNG reader for the tests: chunk structure and CRCs always, pixels when zlib
// is available to inflate IDAT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::plot::test {

struct DecodedPng {
  std::string error;  // empty when the file is well-formed
  int width = 0, height = 0, bit_depth = 0, color_type = 0;
  std::vector<std::string> chunks;  // chunk types in order
  bool inflated = false;            // false without zlib: pixels below are not filled
  size_t raw_size = 0;              // inflated IDAT bytes (scanlines with filter bytes)
  std::vector<uint8_t> rgb;         // unfiltered pixels, 8-bit RGB only
};

DecodedPng read_png(const std::string& bytes);
// Bitwise CRC-32 (no table), deliberately not the encoder's implementation.
uint32_t reference_crc32(const std::string& bytes);
// zlib's inflate of a zlib stream; empty optional-like: ok=false without zlib or on error.
bool reference_inflate(const std::string& stream, std::string& out);

}  // namespace slipstream::plot::test
