// UBJSON (Draft 12) in a .slp container. Values are read by nlohmann::json's UBJSON reader with
// caps for untrusted input (nesting depth, value count, declared counts, total size); metadata
// is written with nlohmann::json::to_ubjson.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace slipstream::slp {

struct UbjsonError : std::runtime_error {
  UbjsonError(size_t offset_, const std::string& what)
      : std::runtime_error(what), offset(offset_) {}
  size_t offset;  // into the span given to the reader
};

// Limits on one value read by read_ubjson; going past one is a UbjsonError.
inline constexpr size_t kUbjsonMaxDepth = 64;                // nested arrays/objects
inline constexpr size_t kUbjsonMaxValues = size_t{1} << 20;  // values and containers
inline constexpr size_t kUbjsonMaxBytes = size_t{16} << 20;  // encoded size

// Reads one value at data[pos] and advances pos just past it (bytes after it are not looked at).
// A declared container count larger than the bytes left is refused: typed null/true/false
// elements take no bytes, so such a count could only be hostile. nlohmann 3.11.2 reads a
// negative string length as an empty string (later releases reject it); the bytes after it are
// then read as values, so the damage still shows as an error or as ignored garbage.
nlohmann::json read_ubjson(std::span<const uint8_t> data, size_t& pos);

// Reads the length that follows a string/key or a '#' count marker (one type byte + integer).
int64_t read_ubjson_length(std::span<const uint8_t> data, size_t& pos);

// A container key: 'U' length (as Slippi writes "raw" and "metadata"), then the bytes.
void write_ubjson_key(const std::string& key, std::vector<uint8_t>& out);

}  // namespace slipstream::slp
