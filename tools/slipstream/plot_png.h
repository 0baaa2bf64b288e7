// PNG encoding of an 8-bit RGB image (signature, IHDR, one IDAT, IEND).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::plot {

// `rgb` holds width*height*3 bytes, rows top to bottom.
std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace slipstream::plot
