#include "tools/slipstream/plot_deflate.h"

#include <algorithm>
#include <array>
#include <vector>

namespace slipstream::plot {

uint32_t crc32(std::string_view bytes, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (unsigned char b : bytes) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(std::string_view bytes) {
  uint32_t a = 1, b = 0;
  for (unsigned char c : bytes) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

namespace {

// Deflate's bit order: values LSB-first, Huffman codes MSB-first.
class BitWriter {
 public:
  explicit BitWriter(std::string& out) : out_(out) {}
  void bits(uint32_t value, int count) {
    acc_ |= static_cast<uint64_t>(value) << n_;
    n_ += count;
    while (n_ >= 8) {
      out_ += static_cast<char>(acc_ & 0xFF);
      acc_ >>= 8;
      n_ -= 8;
    }
  }
  void code(uint32_t code, int len) {
    uint32_t rev = 0;
    for (int i = 0; i < len; ++i) rev |= ((code >> i) & 1) << (len - 1 - i);
    bits(rev, len);
  }
  void flush() {
    if (n_ > 0) bits(0, 8 - n_);
  }

 private:
  std::string& out_;
  uint64_t acc_ = 0;
  int n_ = 0;
};

// RFC 1951 3.2.6: the fixed literal/length code.
void literal(BitWriter& w, int sym) {
  if (sym < 144)
    w.code(0x30 + sym, 8);
  else if (sym < 256)
    w.code(0x190 + sym - 144, 9);
  else if (sym < 280)
    w.code(sym - 256, 7);
  else
    w.code(0xC0 + sym - 280, 8);
}

constexpr int kLenBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                              31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr int kLenExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                               2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr int kDistBase[30] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                               33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                               1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr int kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void match(BitWriter& w, int len, int dist) {
  int li = 28;
  while (kLenBase[li] > len) --li;
  literal(w, 257 + li);
  w.bits(len - kLenBase[li], kLenExtra[li]);
  int di = 29;
  while (kDistBase[di] > dist) --di;
  w.code(di, 5);
  w.bits(dist - kDistBase[di], kDistExtra[di]);
}

}  // namespace

std::string zlib_compress(std::string_view data) {
  constexpr int kWindow = 32768, kMaxLen = 258, kHashBits = 15, kChain = 32;
  std::string out = "\x78\x01";  // deflate, 32K window, fastest-level flag; 0x7801 % 31 == 0
  BitWriter w(out);
  w.bits(1, 1);  // BFINAL: one block
  w.bits(1, 2);  // BTYPE 01: fixed Huffman codes
  const size_t n = data.size();
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  std::vector<int32_t> head(size_t{1} << kHashBits, -1), prev(n, -1);
  auto hash = [&](size_t i) {
    uint32_t v = p[i] | (p[i + 1] << 8) | (p[i + 2] << 16);
    return (v * 2654435761u) >> (32 - kHashBits);
  };
  auto insert = [&](size_t i) {
    if (i + 2 >= n) return;
    uint32_t h = hash(i);
    prev[i] = head[h];
    head[h] = static_cast<int32_t>(i);
  };
  size_t i = 0;
  while (i < n) {
    int best = 0, best_dist = 0;
    if (i + 2 < n) {
      int64_t cand = head[hash(i)];  // positions fit int32: images stay far below 2 GiB
      int limit = static_cast<int>(std::min<size_t>(kMaxLen, n - i));
      for (int chain = 0; cand >= 0 && chain < kChain; ++chain, cand = prev[cand]) {
        int64_t dist = static_cast<int64_t>(i) - cand;
        if (dist > kWindow) break;
        int len = 0;
        while (len < limit && p[cand + len] == p[i + len]) ++len;
        if (len > best) best = len, best_dist = static_cast<int>(dist);
        if (len == limit) break;
      }
    }
    if (best >= 3) {
      match(w, best, best_dist);
      for (int k = 0; k < best; ++k) insert(i + k);
      i += best;
    } else {
      literal(w, p[i]);
      insert(i);
      ++i;
    }
  }
  literal(w, 256);  // end of block
  w.flush();
  uint32_t a = adler32(data);
  for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((a >> s) & 0xFF);
  return out;
}

}  // namespace slipstream::plot
