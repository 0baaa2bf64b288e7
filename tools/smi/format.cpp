#include "format.h"

#include <cmath>
#include <cstdio>

namespace slipstream::smi {

namespace {

// Length of the valid UTF-8 sequence at s[i] (its code point in cp), or 0 when the byte there
// does not start one (stray continuation, overlong form, surrogate, past U+10FFFF, cut short).
size_t utf8_sequence(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = b(i);
  size_t n;
  uint32_t min;
  if (lead < 0x80) {
    cp = lead;
    return 1;
  } else if ((lead & 0xE0) == 0xC0) {
    n = 2, cp = lead & 0x1F, min = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    n = 3, cp = lead & 0x0F, min = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    n = 4, cp = lead & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void append_hex(std::string& out, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", v);
  out += buf;
}

}  // namespace

namespace {

// Walks `s` one UTF-8 character at a time: on_char(code point, its bytes) for each well-formed
// one, on_invalid(byte) for each byte that starts none.
template <class OnChar, class OnInvalid>
std::string each_utf8(std::string_view s, OnChar on_char, OnInvalid on_invalid) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, cp);
    if (n == 0) {
      on_invalid(out, static_cast<uint8_t>(s[i]));
      ++i;
    } else {
      on_char(out, cp, s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace

std::string printable(std::string_view s) {
  return each_utf8(
      s,
      [](std::string& out, uint32_t cp, std::string_view bytes) {
        if (cp == '\n')
          out += "\\n";
        else if (cp == '\r')
          out += "\\r";
        else if (cp == '\t')
          out += "\\t";
        else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0))
          append_hex(out, cp);  // C1 controls too: some terminals take U+009B as CSI
        else
          out.append(bytes);
      },
      [](std::string& out, uint8_t byte) { append_hex(out, byte); });
}

std::string valid_utf8(std::string_view s) {
  return each_utf8(
      s, [](std::string& out, uint32_t, std::string_view bytes) { out.append(bytes); },
      [](std::string& out, uint8_t) { out += "\xEF\xBF\xBD"; });  // U+FFFD
}

std::optional<double> plausible(double v, double max) {
  if (!std::isfinite(v) || v < 0 || v > max) return std::nullopt;
  return v;
}

std::string csv_escape(std::string_view field) {
  bool quote = !field.empty() && (field.front() == ' ' || field.back() == ' ');
  for (char c : field) {
    if (c == ',' || c == '"' || c == '\n' || c == '\r') quote = true;
  }
  if (!quote) return std::string(field);
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + '"';
}

std::string csv_join(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ", ";
    out += csv_escape(fields[i]);
  }
  return out;
}

std::string render_value(const FieldValue& v, bool units) {
  if (!v.text) return std::string(kNotAvailable);
  if (!units || v.unit.empty()) return *v.text;
  return *v.text + " " + v.unit;
}

std::string header_cell(std::string_view name, std::string_view unit) {
  std::string out(name);
  if (!unit.empty()) out += " [" + std::string(unit) + "]";
  return out;
}

std::optional<std::string> fixed(double v, int decimals) {
  if (!std::isfinite(v)) return std::nullopt;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return std::string(buf);
}

std::string fixed_or_na(double v, int decimals, std::string_view suffix) {
  auto s = fixed(v, decimals);
  return s ? *s + std::string(suffix) : std::string(kNotAvailable);
}

uint64_t to_mib(uint64_t bytes) {
  return bytes / (1024 * 1024);
}

std::string human_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10.0 ? "%.2f %s" : "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string compact_rate(double per_s) {
  if (!plausible(per_s, kMaxRate)) return std::string(kNotAvailable);
  char buf[32];
  if (per_s < 100.0)
    std::snprintf(buf, sizeof buf, "%.2f", per_s);
  else if (per_s < 100000.0)
    std::snprintf(buf, sizeof buf, "%.1f", per_s);
  else if (per_s < 1e8)
    std::snprintf(buf, sizeof buf, "%.1fk", per_s / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.1fM", per_s / 1e6);
  if (std::string_view(buf).size() > 8) return std::string(kNotAvailable);
  return buf;
}

std::string latency_text(double ms) {
  if (!plausible(ms, kMaxSeconds * 1e3)) return std::string(kNotAvailable);
  char buf[32];
  if (ms < 1.0)
    std::snprintf(buf, sizeof buf, "%.3fms", ms);
  else if (ms < 100.0)
    std::snprintf(buf, sizeof buf, "%.2fms", ms);
  else if (ms < 1000.0)
    std::snprintf(buf, sizeof buf, "%.1fms", ms);
  else
    std::snprintf(buf, sizeof buf, "%.2fs", ms / 1000.0);
  return buf;
}

std::string duration_text(double seconds) {
  // 100 years: beyond that the estimate is meaningless and the integer cast could overflow.
  if (!plausible(seconds, kMaxSeconds)) return std::string(kNotAvailable);
  auto total = static_cast<uint64_t>(std::llround(seconds));
  uint64_t days = total / 86400, h = total / 3600 % 24, m = total / 60 % 60, s = total % 60;
  char buf[48];
  if (days)
    std::snprintf(buf, sizeof buf, "%llud %02llu:%02llu:%02llu",
                  static_cast<unsigned long long>(days), static_cast<unsigned long long>(h),
                  static_cast<unsigned long long>(m), static_cast<unsigned long long>(s));
  else
    std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", static_cast<unsigned long long>(h),
                  static_cast<unsigned long long>(m), static_cast<unsigned long long>(s));
  return buf;
}

std::string percent_text(double fraction) {
  if (!plausible(fraction, kMaxFraction)) return std::string(kNotAvailable);
  return fixed_or_na(fraction * 100.0, 1, "%");
}

std::string pstate_name(int pstate) {
  return cat("P", std::to_string(pstate));
}

namespace {

// Terminal columns of code point `cp`: 2 for the East Asian wide and emoji blocks, else 1 (the
// text reaching here is printable(): no control characters).
size_t columns_of(uint32_t cp) {
  const bool wide = (cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0xA4CF) ||
                    (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) ||
                    (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
                    (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x1F300 && cp <= 0x1F64F) ||
                    (cp >= 0x1F900 && cp <= 0x1F9FF) || (cp >= 0x20000 && cp <= 0x3FFFD);
  return wide ? 2 : 1;
}

// The bytes of `s`'s first characters that fill at most `width` columns, and their columns.
std::pair<size_t, size_t> prefix_within(std::string_view s, size_t width) {
  size_t bytes = 0, cols = 0;
  while (bytes < s.size()) {
    uint32_t cp = 0;
    size_t n = utf8_sequence(s, bytes, cp);
    const size_t w = n ? columns_of(cp) : 1;
    if (n == 0) n = 1;  // a stray byte: one column, as a terminal's replacement shows it
    if (cols + w > width) break;
    bytes += n;
    cols += w;
  }
  return {bytes, cols};
}

}  // namespace

size_t display_width(std::string_view s) {
  return prefix_within(s, SIZE_MAX).second;
}

// In columns, not bytes: a name in another script lines up as an ASCII one does.
std::string fit(std::string_view s, size_t width) {
  if (display_width(s) <= width) return std::string(s);
  if (width <= 3) return std::string(s.substr(0, prefix_within(s, width).first));
  return std::string(s.substr(0, prefix_within(s, width - 3).first)) + "...";
}

std::string pad_right(std::string_view s, size_t width) {
  std::string out = fit(s, width);
  out.append(width - display_width(out), ' ');
  return out;
}

std::string pad_left(std::string_view s, size_t width) {
  std::string out = fit(s, width);
  return std::string(width - display_width(out), ' ') + out;
}

std::vector<std::string> wrap(std::string_view text, size_t width) {
  std::vector<std::string> lines;
  if (width == 0) return lines;
  while (text.size() > width) {
    size_t cut = text.rfind(' ', width);
    if (cut == std::string_view::npos || cut == 0) cut = width;
    lines.emplace_back(text.substr(0, cut));
    text.remove_prefix(cut);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  }
  if (!text.empty() || lines.empty()) lines.emplace_back(text);
  return lines;
}

}  // namespace slipstream::smi
