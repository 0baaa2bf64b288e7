#include "stages/melee/slp/shift_jis.h"

namespace slipstream::slp {
namespace {

// JIS X 0208 row 1 (Shift JIS 0x8140..0x819E), as Unicode.
constexpr uint16_t kRow1[94] = {
    0x3000, 0x3001, 0x3002, 0xFF0C, 0xFF0E, 0x30FB, 0xFF1A, 0xFF1B, 0xFF1F, 0xFF01, 0x309B, 0x309C,
    0x00B4, 0xFF40, 0x00A8, 0xFF3E, 0xFFE3, 0xFF3F, 0x30FD, 0x30FE, 0x309D, 0x309E, 0x3003, 0x4EDD,
    0x3005, 0x3006, 0x3007, 0x30FC, 0x2015, 0x2010, 0xFF0F, 0xFF3C, 0x301C, 0x2016, 0xFF5C, 0x2026,
    0x2025, 0x2018, 0x2019, 0x201C, 0x201D, 0xFF08, 0xFF09, 0x3014, 0x3015, 0xFF3B, 0xFF3D, 0xFF5B,
    0xFF5D, 0x3008, 0x3009, 0x300A, 0x300B, 0x300C, 0x300D, 0x300E, 0x300F, 0x3010, 0x3011, 0xFF0B,
    0xFF0D, 0x00B1, 0x00D7, 0x00F7, 0xFF1D, 0x2260, 0xFF1C, 0xFF1E, 0x2266, 0x2267, 0x221E, 0x2234,
    0x2642, 0x2640, 0x00B0, 0x2032, 0x2033, 0x2103, 0xFFE5, 0xFF04, 0x00A2, 0x00A3, 0xFF05, 0xFF03,
    0xFF06, 0xFF0A, 0xFF20, 0x00A7, 0x2606, 0x2605, 0x25CB, 0x25CF, 0x25CE, 0x25C7};

constexpr uint32_t kReplacement = 0xFFFD;

// Index of a trail byte within its 94-character JIS row pair: first row 0..93, second 94..187.
int trail_index(uint8_t t) {
  if (t >= 0x40 && t <= 0x7E) return t - 0x40;
  if (t >= 0x80 && t <= 0xFC) return t - 0x41;
  return -1;
}

uint32_t decode_pair(uint8_t lead, uint8_t trail) {
  const int i = trail_index(trail);
  if (i < 0) return kReplacement;
  if (lead == 0x81) return i < 94 ? kRow1[i] : kReplacement;
  if (lead == 0x82) {
    if (trail >= 0x4F && trail <= 0x58) return '0' + (trail - 0x4F);
    if (trail >= 0x60 && trail <= 0x79) return 'A' + (trail - 0x60);
    if (trail >= 0x81 && trail <= 0x9A) return 'a' + (trail - 0x81);
    if (trail >= 0x9F && trail <= 0xF1) return 0x3041 + (trail - 0x9F);  // hiragana
    return kReplacement;
  }
  if (lead == 0x83 && i < 86) return 0x30A1 + i;  // katakana
  return kReplacement;
}

// Full-width ASCII to ASCII, ideographic space to space.
uint32_t fold_width(uint32_t cp) {
  if (cp >= 0xFF01 && cp <= 0xFF5E) return cp - 0xFF01 + 0x21;
  if (cp == 0x3000) return ' ';
  return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_lead(uint8_t b) {
  return (b >= 0x81 && b <= 0x9F) || (b >= 0xE0 && b <= 0xFC);
}

}  // namespace

std::string decode_shift_jis(std::span<const uint8_t> bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const uint8_t b = bytes[i];
    if (b == 0) break;
    uint32_t cp;
    if (b < 0x80) {
      cp = b;
    } else if (b >= 0xA1 && b <= 0xDF) {
      cp = 0xFF61 + (b - 0xA1);  // half-width katakana
    } else if (is_lead(b) && i + 1 < bytes.size()) {
      cp = fold_width(decode_pair(b, bytes[i + 1]));
      ++i;
    } else {
      cp = kReplacement;
    }
    // Control characters would only garble text output.
    append_utf8(cp < 0x20 || cp == 0x7F ? kReplacement : cp, out);
  }
  return out;
}

std::vector<uint8_t> encode_shift_jis_ascii(const std::string& text, bool full_width,
                                            bool full_width_hash) {
  std::vector<uint8_t> out;
  for (const char ch : text) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == '#' && (full_width || full_width_hash)) {
      out.insert(out.end(), {0x81, 0x94});
    } else if (full_width && c >= '0' && c <= '9') {
      out.insert(out.end(), {0x82, static_cast<uint8_t>(0x4F + (c - '0'))});
    } else if (full_width && c >= 'A' && c <= 'Z') {
      out.insert(out.end(), {0x82, static_cast<uint8_t>(0x60 + (c - 'A'))});
    } else if (full_width && c >= 'a' && c <= 'z') {
      out.insert(out.end(), {0x82, static_cast<uint8_t>(0x81 + (c - 'a'))});
    } else if (full_width && c == ' ') {
      out.insert(out.end(), {0x81, 0x40});
    } else if (c >= 0x20 && c < 0x7F) {
      out.push_back(c);
    } else {
      out.push_back('?');
    }
  }
  return out;
}

}  // namespace slipstream::slp
