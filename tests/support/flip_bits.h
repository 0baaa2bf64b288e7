// Damages a file in place, as a failing disk or a bad copy would: XORs the byte at `offset` with
// `mask`.
#pragma once

#include <filesystem>
#include <fstream>

namespace slipstream::testing {

inline void flip_bits(const std::filesystem::path& file, std::streamoff offset, char mask) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(offset);
  f.write(&c, 1);
}

}  // namespace slipstream::testing
