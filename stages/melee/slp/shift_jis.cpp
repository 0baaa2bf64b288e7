#include "stages/melee/slp/shift_jis.h"

#include <iconv.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace slipstream::slp {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

bool is_lead(uint8_t b) {
  return (b >= 0x81 && b <= 0x9F) || (b >= 0xE0 && b <= 0xFC);
}

// Bytes an undecodable sequence at `p` spans: a lead byte takes its trail byte along unless
// that byte is ASCII, which then decodes on its own (as WHATWG's Shift_JIS decoder does).
size_t bad_sequence_length(const uint8_t* p, size_t left) {
  return is_lead(p[0]) && left >= 2 && p[1] >= 0x80 ? 2 : 1;
}

// glibc's CP932 (Shift JIS with Microsoft's mappings, as iconv-lite under slippi-js decodes it).
// One per thread: an iconv_t keeps conversion state and the loader decodes on several threads.
class Cp932Decoder {
 public:
  Cp932Decoder() : cd_(iconv_open("UTF-32LE", "CP932")) {}
  ~Cp932Decoder() {
    if (ok()) iconv_close(cd_);
  }
  Cp932Decoder(const Cp932Decoder&) = delete;
  Cp932Decoder& operator=(const Cp932Decoder&) = delete;

  bool ok() const { return cd_ != reinterpret_cast<iconv_t>(-1); }

  // Invalid and truncated sequences become U+FFFD.
  std::u32string decode(std::span<const uint8_t> in) {
    // Every input byte yields at most one code point (a replacement consumes at least one).
    std::string buf(4 * in.size(), '\0');
    iconv(cd_, nullptr, nullptr, nullptr, nullptr);  // a previous call may have stopped mid-way
    auto* src = const_cast<char*>(reinterpret_cast<const char*>(in.data()));
    size_t src_left = in.size();
    char* dst = buf.data();
    size_t dst_left = buf.size();
    while (src_left > 0) {
      if (iconv(cd_, &src, &src_left, &dst, &dst_left) != static_cast<size_t>(-1)) break;
      if ((errno != EILSEQ && errno != EINVAL) || dst_left < 4) break;  // E2BIG cannot happen
      const char fffd_le[4] = {'\xFD', '\xFF', 0, 0};
      std::memcpy(dst, fffd_le, 4);
      dst += 4;
      dst_left -= 4;
      const size_t skip = bad_sequence_length(reinterpret_cast<const uint8_t*>(src), src_left);
      src += skip;
      src_left -= skip;
    }
    std::u32string out;
    for (const char* p = buf.data(); p + 4 <= dst; p += 4) {
      const auto* u = reinterpret_cast<const uint8_t*>(p);
      out.push_back(char32_t(u[0]) | char32_t(u[1]) << 8 | char32_t(u[2]) << 16 |
                    char32_t(u[3]) << 24);
    }
    return out;
  }

 private:
  iconv_t cd_;
};

// Full-width ASCII to ASCII, ideographic space to space.
char32_t fold_width(char32_t cp) {
  if (cp >= 0xFF01 && cp <= 0xFF5E) return cp - 0xFF01 + 0x21;
  if (cp == 0x3000) return ' ';
  return cp;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

std::string decode_shift_jis(std::span<const uint8_t> bytes) {
  bytes =
      bytes.first(static_cast<size_t>(std::find(bytes.begin(), bytes.end(), 0) - bytes.begin()));
  thread_local Cp932Decoder decoder;
  std::u32string cps;
  if (decoder.ok()) {
    cps = decoder.decode(bytes);
  } else {
    // No CP932 converter (glibc without its gconv modules): keep the ASCII.
    for (const uint8_t b : bytes) cps.push_back(b < 0x80 ? b : kReplacement);
  }
  std::string out;
  for (char32_t cp : cps) {
    cp = fold_width(cp);
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
