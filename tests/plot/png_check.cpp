#include "png_check.h"

#include <cstdlib>

#ifdef PLOT_HAVE_ZLIB
#include <zlib.h>
#endif

namespace slipstream::plot::test {

namespace {

uint32_t be32(const std::string& s, size_t at) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])); };
  return b(0) << 24 | b(1) << 16 | b(2) << 8 | b(3);
}

int paeth(int a, int b, int c) {
  int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

}  // namespace

uint32_t reference_crc32(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
  }
  return ~crc;
}

bool reference_inflate(const std::string& stream, std::string& out) {
#ifdef PLOT_HAVE_ZLIB
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return false;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(stream.data()));
  z.avail_in = static_cast<uInt>(stream.size());
  out.clear();
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
  }
  bool ok = rc == Z_STREAM_END && z.avail_in == 0;
  inflateEnd(&z);
  return ok;
#else
  (void)stream;
  (void)out;
  return false;
#endif
}

DecodedPng read_png(const std::string& bytes) {
  DecodedPng png;
  if (bytes.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) != 0) {
    png.error = "bad signature";
    return png;
  }
  std::string idat;
  size_t at = 8;
  while (at < bytes.size()) {
    if (at + 12 > bytes.size()) {
      png.error = "truncated chunk header";
      return png;
    }
    uint32_t len = be32(bytes, at);
    if (at + 12 + len > bytes.size()) {
      png.error = "truncated chunk";
      return png;
    }
    std::string type = bytes.substr(at + 4, 4);
    std::string data = bytes.substr(at + 8, len);
    if (reference_crc32(type + data) != be32(bytes, at + 8 + len)) {
      png.error = "CRC mismatch in " + type;
      return png;
    }
    png.chunks.push_back(type);
    if (type == "IHDR" && len == 13) {
      png.width = static_cast<int>(be32(data, 0));
      png.height = static_cast<int>(be32(data, 4));
      png.bit_depth = static_cast<unsigned char>(data[8]);
      png.color_type = static_cast<unsigned char>(data[9]);
    } else if (type == "IDAT") {
      idat += data;
    }
    at += 12 + len;
  }
  if (png.chunks.empty() || png.chunks.front() != "IHDR" || png.chunks.back() != "IEND") {
    png.error = "chunks must start with IHDR and end with IEND";
    return png;
  }
  std::string raw;
  if (!reference_inflate(idat, raw)) {
#ifdef PLOT_HAVE_ZLIB
    png.error = "IDAT does not inflate";
#endif
    return png;
  }
  png.inflated = true;
  png.raw_size = raw.size();
  if (png.bit_depth != 8 || png.color_type != 2) return png;
  const size_t stride = static_cast<size_t>(png.width) * 3;
  if (raw.size() != (stride + 1) * png.height) return png;
  png.rgb.assign(stride * png.height, 0);
  for (int y = 0; y < png.height; ++y) {
    int filter = static_cast<unsigned char>(raw[y * (stride + 1)]);
    const auto* in = reinterpret_cast<const uint8_t*>(raw.data()) + y * (stride + 1) + 1;
    uint8_t* row = png.rgb.data() + y * stride;
    const uint8_t* up = y > 0 ? row - stride : nullptr;
    for (size_t x = 0; x < stride; ++x) {
      int a = x >= 3 ? row[x - 3] : 0, b = up ? up[x] : 0, c = up && x >= 3 ? up[x - 3] : 0;
      int pred = filter == 1   ? a
                 : filter == 2 ? b
                 : filter == 3 ? (a + b) / 2
                 : filter == 4 ? paeth(a, b, c)
                               : 0;
      row[x] = static_cast<uint8_t>(in[x] + pred);
    }
  }
  return png;
}

}  // namespace slipstream::plot::test
