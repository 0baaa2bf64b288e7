// Damaged input: every outcome must be a ParseError naming an offset or a self-consistent
// (possibly partial) game, never a crash or an out-of-bounds read (run these under ASan).
#include <gtest/gtest.h>

#include "stages/melee/slp/byte_order.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/writer.h"
#include "tests/slp/replay_files.h"

namespace slipstream::slp {
namespace {

using testing::all_replays;
using testing::replay;

// Parses and checks the invariants a consumer relies on. Returns false on ParseError.
bool parse_checked(std::span<const uint8_t> bytes) {
  try {
    const Game g = parse_slp(bytes, "damaged");
    const size_t n = g.frames.size();
    visit_frame_columns(g.frames, [&](const std::string& name, const auto& col) {
      EXPECT_TRUE(col.empty() || col.size() == n) << name;
    });
    for (const auto& r : g.frames.items.row) EXPECT_LT(r, n);
    if (g.info.partial) {
      EXPECT_NE(g.info.error.find("byte offset"), std::string::npos);
    }
    return true;
  } catch (const ParseError& e) {
    EXPECT_LE(e.offset(), bytes.size());
    EXPECT_NE(std::string(e.what()).find("byte offset"), std::string::npos);
    return false;
  }
}

// A small valid file to damage by hand: [0..15) container header, then the payload table.
std::vector<uint8_t> small_file() {
  Game g;
  g.info.start.version = {3, 18, 0};
  Player p;
  p.port = 0;
  g.info.start.players.push_back(p);
  g.frames.frame = {-123, -122};
  FrameStartT<Vec>::visit(g.frames.start, [](FieldDesc, auto& c) { c.resize(2); });
  FrameBookendT<Vec>::visit(g.frames.bookend, [](FieldDesc, auto& c) { c.resize(2); });
  PortFrames pf;
  pf.leader.present = {3, 3};
  PreFrameT<Vec>::visit(pf.leader.pre, [](FieldDesc, auto& c) { c.resize(2); });
  PostFrameT<Vec>::visit(pf.leader.post, [](FieldDesc, auto& c) { c.resize(2); });
  g.frames.ports.push_back(std::move(pf));
  return write_slp(g);
}

constexpr size_t kRawStart = 15;  // {U\x03raw[$U#l + 4 length bytes

TEST(SlpCorrupt, SmallFileParses) {
  const auto bytes = small_file();
  const Game g = parse_slp(bytes);
  EXPECT_EQ(g.frames.size(), 2u);
  EXPECT_TRUE(g.info.error.empty());
}

TEST(SlpCorrupt, TruncatedAtEveryOffsetOfASmallFile) {
  const auto bytes = small_file();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    SCOPED_TRACE(cut);
    parse_checked(std::span<const uint8_t>(bytes.data(), cut));
  }
}

TEST(SlpCorrupt, TruncatedRealFilesAtManyOffsets) {
  SLP_REQUIRE_REPLAYS();
  for (const auto& path : all_replays()) {
    SCOPED_TRACE(path.string());
    const auto bytes = read_file_bytes(path);
    std::vector<size_t> cuts;
    for (size_t i = 0; i < 64 && i < bytes.size(); ++i) cuts.push_back(i);  // container header
    for (size_t i = 1; i < 48; ++i) cuts.push_back(bytes.size() * i / 48);  // spread out
    for (size_t i = 1; i < 16 && i < bytes.size(); ++i)
      cuts.push_back(bytes.size() - i);  // metadata
    for (const size_t cut : cuts) parse_checked(std::span<const uint8_t>(bytes.data(), cut));
  }
}

TEST(SlpCorrupt, TruncatedRawKeepsRowsBeforeTheCut) {
  SLP_REQUIRE_REPLAYS();
  const auto bytes = read_file_bytes(replay("peppi/v3.18.slp"));
  const Game whole = parse_slp(bytes);
  const Game half = parse_slp(std::span<const uint8_t>(bytes.data(), bytes.size() / 2));
  EXPECT_TRUE(half.info.partial);
  EXPECT_GT(half.frames.size(), 100u);
  ASSERT_LT(half.frames.size(), whole.frames.size());
  for (size_t i = 0; i < half.frames.size(); ++i) {
    ASSERT_EQ(half.frames.frame[i], whole.frames.frame[i]);
    ASSERT_EQ(half.frames.ports[0].leader.post.x[i], whole.frames.ports[0].leader.post.x[i]);
  }
}

TEST(SlpCorrupt, FlippedBytesNeverCrash) {
  SLP_REQUIRE_REPLAYS();
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (const char* name : {"peppi/v3.18.slp", "peppi/ics.slp", "peppi/v0.1.slp",
                           "slippi-js/BTTDK.slp", "peppi/v3.12.slp", "slippi-js/geckoCodes.slp"}) {
    SCOPED_TRACE(name);
    const auto original = read_file_bytes(replay(name));
    for (int trial = 0; trial < 60; ++trial) {
      auto bytes = original;
      // Mostly in the header and payload table, where a flip changes the most.
      const int flips = 1 + static_cast<int>(next() % 8);
      for (int f = 0; f < flips; ++f) {
        const size_t limit = trial % 2 ? std::min<size_t>(bytes.size(), 2048) : bytes.size();
        bytes[next() % limit] ^= static_cast<uint8_t>(1 + next() % 255);
      }
      parse_checked(bytes);
    }
  }
}

TEST(SlpCorrupt, OverflowingSizeTable) {
  auto bytes = small_file();
  ASSERT_EQ(bytes[kRawStart], 0x35);
  // 0xFD = 3*84+1 claims 84 entries, far past the end of a tiny raw element.
  const uint32_t raw_len = 40;
  store_be(bytes.data() + 11, raw_len);
  bytes[kRawStart + 1] = 0xFD;
  try {
    parse_slp(bytes, "overflow.slp");
    FAIL() << "accepted an overflowing payload table";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.offset(), kRawStart + 1);
    EXPECT_EQ(e.file(), "overflow.slp");
  }
}

TEST(SlpCorrupt, PayloadTableSizeNot3nPlus1) {
  auto bytes = small_file();
  bytes[kRawStart + 1] = 5;
  EXPECT_THROW(parse_slp(bytes), ParseError);
}

TEST(SlpCorrupt, PayloadSizeTooSmallForItsEvent) {
  auto bytes = small_file();
  // Find the Pre-Frame entry of the table and shrink it below its addressing fields.
  const size_t n = bytes[kRawStart + 1];
  for (size_t i = 0; i + 1 < n; i += 3)
    if (bytes[kRawStart + 2 + i] == 0x37) store_be<uint16_t>(bytes.data() + kRawStart + 3 + i, 3);
  EXPECT_THROW(parse_slp(bytes), ParseError);
}

TEST(SlpCorrupt, WrongEventSizeIsAnErrorOrConsistent) {
  auto bytes = small_file();
  const size_t n = bytes[kRawStart + 1];
  for (uint16_t size : {7, 20, 65, 67, 300, 65535}) {
    auto b = bytes;
    for (size_t i = 0; i + 1 < n; i += 3)
      if (b[kRawStart + 2 + i] == 0x38) store_be<uint16_t>(b.data() + kRawStart + 3 + i, size);
    parse_checked(b);
  }
}

TEST(SlpCorrupt, UnknownCommandMidStreamGivesPartialGameWithOffset) {
  SLP_REQUIRE_REPLAYS();
  auto bytes = read_file_bytes(replay("peppi/game.slp"));
  const Game whole = parse_slp(bytes);
  // Event boundaries: table + Game Start + 1000 frames of 2 pre + 2 post for the v1.0 sizes.
  const size_t table = kRawStart + 1 + bytes[kRawStart + 1];
  const size_t frame_bytes = 2 * (1 + 58) + 2 * (1 + 37);
  const size_t at = table + 1 + 352 + 1000 * frame_bytes;
  ASSERT_EQ(bytes[at], 0x37);
  bytes[at] = 0x99;
  const Game g = parse_slp(bytes, "game.slp");
  EXPECT_TRUE(g.info.partial);
  EXPECT_NE(g.info.error.find("byte offset " + std::to_string(at)), std::string::npos)
      << g.info.error;
  EXPECT_EQ(g.frames.size(), 1000u);
  EXPECT_TRUE(g.info.metadata.present);  // raw length is known, so metadata is still read
  ParseOptions strict;
  strict.strict = true;
  try {
    parse_slp(bytes, "game.slp", strict);
    FAIL();
  } catch (const ParseError& e) {
    EXPECT_EQ(e.offset(), at);
  }
}

TEST(SlpCorrupt, NotASlpFile) {
  const std::vector<uint8_t> empty;
  EXPECT_THROW(parse_slp(empty), ParseError);
  const std::string text = "hello, this is not a replay";
  EXPECT_THROW(parse_slp(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())),
               ParseError);
}

TEST(SlpCorrupt, RawLongerThanTheFile) {
  auto bytes = small_file();
  store_be<uint32_t>(bytes.data() + 11, 1u << 30);
  const Game g = parse_slp(bytes);
  EXPECT_TRUE(g.info.partial);
  EXPECT_FALSE(g.info.error.empty());
}

std::vector<uint8_t> with_metadata(const std::vector<uint8_t>& body) {
  auto bytes = small_file();
  // Replace everything from the metadata key on.
  const std::string key = "U\x08metadata";
  auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  bytes.erase(it + static_cast<long>(key.size()), bytes.end());
  bytes.insert(bytes.end(), body.begin(), body.end());
  return bytes;
}

TEST(SlpCorrupt, HostileMetadata) {
  // A count far beyond the file.
  std::vector<uint8_t> huge = {'[',  '$',  'Z',  '#',  'L',  0x7F, 0xFF,
                               0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  Game g = parse_slp(with_metadata(huge));
  EXPECT_TRUE(g.info.partial);
  EXPECT_EQ(g.frames.size(), 2u);
  // Deep nesting must not overflow the stack.
  std::vector<uint8_t> deep(100000, '[');
  g = parse_slp(with_metadata(deep));
  EXPECT_TRUE(g.info.partial);
  // Negative string length.
  g = parse_slp(with_metadata({'{', 'i', 0xFF, 'Z'}));
  EXPECT_TRUE(g.info.partial);
  // Wrong types are ignored, not errors.
  g = parse_slp(with_metadata({'{', 'U', 7, 's', 't', 'a', 'r', 't', 'A', 't', 'U', 5, '}', '}'}));
  EXPECT_TRUE(g.info.error.empty()) << g.info.error;
  EXPECT_TRUE(g.info.metadata.start_at.empty());
}

TEST(SlpCorrupt, BadPlayerIndex) {
  auto bytes = small_file();
  // First Pre-Frame: after the table, Game Start (1 + 0x2F8) and the first Frame Start (13).
  const size_t pre = kRawStart + 1 + bytes[kRawStart + 1] + 1 + 0x2F8 + 13;
  ASSERT_EQ(bytes[pre], 0x37);
  bytes[pre + 5] = 9;
  const Game g = parse_slp(bytes);
  EXPECT_TRUE(g.info.partial);
  EXPECT_NE(g.info.error.find("byte offset " + std::to_string(pre + 5)), std::string::npos)
      << g.info.error;
}

}  // namespace
}  // namespace slipstream::slp
