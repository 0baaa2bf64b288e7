// A corpus as format version 1 wrote it with --zstd (each whole column one zstd frame, unpacked
// when the corpus opens), made from an uncompressed corpus in place: what corpora built before
// the per-game frames look like, for the tests that older corpora still read.
#pragma once

#include <zstd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "stages/melee/slp/corpus.h"

namespace slipstream::slp::testing {

inline void rewrite_as_whole_column_zstd(const std::filesystem::path& dir) {
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir / "manifest.json"));
  std::ifstream in(dir / "columns.bin", std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  std::vector<uint8_t> out;
  for (auto& c : m.at("columns")) {
    if (c.at("compression") != "none") throw std::logic_error("not an uncompressed corpus");
    const size_t offset = c.at("offset"), size = c.at("stored_bytes");
    out.resize((out.size() + 63) / 64 * 64, 0);
    const size_t at = out.size();
    std::vector<uint8_t> packed(ZSTD_compressBound(size));
    const size_t n =
        size ? ZSTD_compress(packed.data(), packed.size(), bytes.data() + offset, size, 3) : 0;
    out.insert(out.end(), packed.begin(), packed.begin() + static_cast<long>(n));
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  static_cast<unsigned long long>(
                      content_hash(std::span<const uint8_t>(out.data() + at, n))));
    c["offset"] = at;
    c["stored_bytes"] = n;
    c["hash"] = std::string("mix64:") + hash;
    c["compression"] = size ? "zstd" : "none";
  }
  for (auto& g : m.at("games")) g.erase("game_hash");  // kept since, not by version 1
  m["format_version"] = 1;
  m["compression"] = "zstd";
  std::ofstream(dir / "columns.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  std::ofstream(dir / "manifest.json") << m.dump(1);
}

}  // namespace slipstream::slp::testing
