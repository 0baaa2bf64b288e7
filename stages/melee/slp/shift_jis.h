// Decoding of the Shift JIS strings in Game Start (nametags, display names, connect codes).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace slipstream::slp {

// Decodes up to the first NUL into UTF-8 with glibc iconv's CP932 (kana, kanji, symbols and
// Microsoft's extensions); full-width ASCII is folded to ASCII (as slippi-js does). Invalid or
// truncated sequences and control characters become U+FFFD; it never throws.
std::string decode_shift_jis(std::span<const uint8_t> bytes);

// Encodes ASCII text: letters and digits as-is, except '#' (written full width, as connect codes
// are) when `full_width_hash`, or every character full width when `full_width` (nametags).
std::vector<uint8_t> encode_shift_jis_ascii(const std::string& text, bool full_width,
                                            bool full_width_hash);

}  // namespace slipstream::slp
