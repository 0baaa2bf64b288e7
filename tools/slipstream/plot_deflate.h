// A small zlib-format (RFC 1950/1951) compressor for the PNG writer: LZ77 with fixed Huffman
// codes. Charts are mostly flat background, so this gets within a few x of zlib without a
// dependency.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace slipstream::plot {

uint32_t crc32(std::string_view bytes, uint32_t crc = 0);
uint32_t adler32(std::string_view bytes);
// A complete zlib stream (header, deflate blocks, adler32) of `data`.
std::string zlib_compress(std::string_view data);

}  // namespace slipstream::plot
