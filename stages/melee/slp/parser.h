// Parses .slp replay files (Slippi 0.1.0 to 3.18) into the columnar Game of game.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "stages/melee/slp/game.h"

namespace slipstream::slp {

// A file that cannot be read at all, or (with ParseOptions::strict) any damage. The message
// names the file and the byte offset from the start of the file.
class ParseError : public std::runtime_error {
 public:
  ParseError(std::string file, uint64_t offset, const std::string& message);
  const std::string& file() const { return file_; }
  uint64_t offset() const { return offset_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_;
  uint64_t offset_;
  std::string message_;
};

enum class Rollbacks : uint8_t {
  kKeepAll,   // every recorded copy of a frame, in stream order
  kLastCopy,  // only the last copy of each frame number: what the game finally showed (training)
};

struct ParseOptions {
  Rollbacks rollbacks = Rollbacks::kKeepAll;
  bool items = true;  // decode Item Updates into frames.items
  // Damage after Game Start normally yields a partial game (info.partial, info.error) holding
  // the rows before it; strict turns that into a ParseError.
  bool strict = false;
};

// Throws ParseError when the container, the Event Payloads table or Game Start is unreadable.
Game parse_slp(std::span<const uint8_t> bytes, std::string_view source = "<memory>",
               const ParseOptions& options = {});
Game parse_slp_file(const std::filesystem::path& path, const ParseOptions& options = {});

// Parses into `game`, reusing its column buffers (a loader parsing file after file into one
// Game allocates nothing once they are large enough). After a ParseError `game` holds no
// meaningful data.
void parse_slp_into(Game& game, std::span<const uint8_t> bytes,
                    std::string_view source = "<memory>", const ParseOptions& options = {});

// Reads a whole replay file; throws ParseError when it cannot be opened or read, when it is
// not a regular file (directory, FIFO, device: refused before it is opened), or when its first
// bytes already show it is not a .slp file (refused before the rest is read).
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path);

}  // namespace slipstream::slp
