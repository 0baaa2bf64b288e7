// The UBJSON (Draft 12) subset a .slp container uses, for the metadata element: a reader into
// nlohmann::json and a writer from it. Inputs are untrusted: depth, counts and sizes are bounded.
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

// Reads one value at data[pos] and advances pos past it.
nlohmann::json read_ubjson(std::span<const uint8_t> data, size_t& pos);

// Reads the length that follows a string/key or a '#' count marker (one type byte + integer).
int64_t read_ubjson_length(std::span<const uint8_t> data, size_t& pos);

void write_ubjson(const nlohmann::json& value, std::vector<uint8_t>& out);
// An object key or string body: integer length then bytes, no type marker.
void write_ubjson_key(const std::string& key, std::vector<uint8_t>& out);

}  // namespace slipstream::slp
