#include "tools/slipstream/plot_png.h"

#include <stdexcept>

#include "tools/slipstream/plot_deflate.h"

namespace slipstream::plot {

namespace {

void be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xFF);
}

void chunk(std::string& out, const char* type, const std::string& data) {
  be32(out, static_cast<uint32_t>(data.size()));
  std::string body = std::string(type, 4) + data;  // the CRC covers type and data
  out += body;
  be32(out, crc32(body));
}

}  // namespace

std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0 || rgb.size() != static_cast<size_t>(width) * height * 3)
    throw std::invalid_argument("encode_png: pixel buffer does not match the size");
  std::string out = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  be32(ihdr, static_cast<uint32_t>(width));
  be32(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, truecolour, deflate, no interlace
  chunk(out, "IHDR", ihdr);
  // Each scanline starts with its filter type; 2 (Up) turns the repeated rows of a chart
  // into runs of zeros.
  const size_t stride = static_cast<size_t>(width) * 3;
  std::string raw;
  raw.reserve((stride + 1) * height);
  for (int y = 0; y < height; ++y) {
    raw += '\x02';
    const uint8_t* row = rgb.data() + stride * y;
    for (size_t x = 0; x < stride; ++x)
      raw += static_cast<char>(y == 0 ? row[x] : static_cast<uint8_t>(row[x] - row[x - stride]));
  }
  chunk(out, "IDAT", zlib_compress(raw));
  chunk(out, "IEND", "");
  return out;
}

}  // namespace slipstream::plot
