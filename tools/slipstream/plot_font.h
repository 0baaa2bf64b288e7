// A 5x7 bitmap font (printable ASCII) for the PNG rasteriser's labels.
#pragma once

#include <array>
#include <cstdint>

namespace slipstream::plot {

inline constexpr int kGlyphWidth = 5, kGlyphHeight = 7, kGlyphAdvance = 6;

// Five columns, left to right; bit r of a column is row r from the top. Characters outside
// ' '..'~' draw as '?'.
const std::array<uint8_t, 5>& glyph(char c);

}  // namespace slipstream::plot
