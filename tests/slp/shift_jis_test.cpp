// Shift JIS (CP932 through iconv) names: kana, kanji, full-width folding, and bad bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include <nlohmann/json.hpp>

#include "stages/melee/slp/event_codes.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/shift_jis.h"
#include "stages/melee/slp/synth.h"
#include "stages/melee/slp/writer.h"

namespace slipstream::slp {
namespace {

std::string decode(std::initializer_list<int> values) {
  std::vector<uint8_t> b;
  for (int v : values) b.push_back(static_cast<uint8_t>(v));
  return decode_shift_jis(b);
}

const std::initializer_list<int> kMario = {0x83, 0x7D, 0x83, 0x8A, 0x83, 0x49};  // マリオ
const std::initializer_list<int> kNihon = {0x93, 0xFA, 0x96, 0x7B};              // 日本

TEST(SlpShiftJis, KanaAndKanji) {
  EXPECT_EQ(decode(kMario), "マリオ");
  EXPECT_EQ(decode(kNihon), "日本");
  EXPECT_EQ(decode({'A', 0x82, 0xCC, 0x8C, 0x8E, 0x97, 0x6A}), "Aの月曜");
  EXPECT_EQ(decode({0x82, 0xA9, 0x81, 0x41, 0x82, 0x58, 0x81, 0x97}), "か、9@");
  EXPECT_EQ(decode({0xB1, 0xDD}), "ｱﾝ");               // half-width katakana
  EXPECT_EQ(decode({0x87, 0x40, 0xED, 0x40}), "①纊");  // NEC and IBM extensions
  EXPECT_EQ(decode({0x81, 0x60}), "~");                // CP932's wave dash is U+FF5E
}

TEST(SlpShiftJis, FullWidthAsciiIsFolded) {
  EXPECT_EQ(decode({0x82, 0x60, 0x82, 0x81, 0x81, 0x40, 0x82, 0x4F, 0x81, 0x94}), "Aa 0#");
  EXPECT_EQ(decode_shift_jis(encode_shift_jis_ascii("AB 12#z", true, true)), "AB 12#z");
}

TEST(SlpShiftJis, StopsAtTheFirstNul) {
  EXPECT_EQ(decode({'A', 'B', 0, 'C'}), "AB");
  EXPECT_EQ(decode({0}), "");
  EXPECT_EQ(decode({}), "");
  // A lead byte just before the NUL does not swallow it.
  EXPECT_EQ(decode({'A', 0x82, 0, 'C'}), "A\uFFFD");
}

TEST(SlpShiftJis, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(decode({0x80}), "\uFFFD");
  EXPECT_EQ(decode({0xA0, 'x'}), "\uFFFDx");
  EXPECT_EQ(decode({0xFD, 0xFE, 0xFF}), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(decode({'a', 0x82}), "a\uFFFD");  // truncated pair
  // An unmapped pair: an ASCII trail byte is kept, any other is part of the bad sequence.
  EXPECT_EQ(decode({0x85, 0x40, 'z'}), "\uFFFD@z");
  EXPECT_EQ(decode({0x85, 0x9F, 'z'}), "\uFFFDz");
  EXPECT_EQ(decode({0x82, 0x20, 0x83, 0x7D}), "\uFFFD マ");  // bad trail, then decoding resumes
  EXPECT_EQ(decode({0x01, 'a', 0x7F}), "\uFFFDa\uFFFD");     // control characters
  // Any bytes decode to valid UTF-8 (dump() throws on invalid UTF-8), one character or more.
  for (int a = 1; a < 256; ++a)
    for (int b : {0x00, 0x3F, 0x40, 0x7F, 0x80, 0x9F, 0xA0, 0xFC, 0xFD, 0xFF}) {
      const std::string s = decode({a, b, a});
      EXPECT_FALSE(s.empty());
      EXPECT_NO_THROW((void)nlohmann::json(s).dump()) << a << " " << b;
    }
}

// The loader decodes Game Starts on several threads; each needs its own iconv handle.
TEST(SlpShiftJis, ConcurrentDecoding) {
  std::vector<std::thread> threads;
  std::vector<int> wrong(8, 0);
  for (size_t t = 0; t < wrong.size(); ++t)
    threads.emplace_back([&wrong, t] {
      for (int i = 0; i < 2000; ++i) {
        const bool mario = (i + static_cast<int>(t)) % 2 == 0;
        const std::string s = mario ? decode(kMario) : decode({0x93, 0xFA, 0x85, 0x40, 0x82});
        wrong[t] += s != (mario ? "マリオ" : "日\uFFFD@\uFFFD");
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(std::count(wrong.begin(), wrong.end(), 0), static_cast<long>(wrong.size()));
}

// Through the parser: Game Start's nametag and display name.
TEST(SlpShiftJis, ParsedGameStartNames) {
  SynthOptions o;
  o.frames = 30;
  Game g = synthesize_game(o);
  ASSERT_FALSE(g.info.start.players.empty());
  const uint8_t port = g.info.start.players[0].port;
  std::vector<uint8_t> bytes = write_slp(g);
  // Game Start follows the Event Payloads table at the start of 'raw'.
  const size_t raw = 15;  // {U\x03raw[$U#l + 4 length bytes
  ASSERT_EQ(bytes[raw], event::kEventPayloads);
  const size_t start = raw + 1 + bytes[raw + 1];
  ASSERT_EQ(bytes[start], event::kGameStart);
  namespace gs = event::start;
  uint8_t* tag = bytes.data() + start + gs::kNametag + gs::kNametagSize * port;
  std::fill(tag, tag + gs::kNametagSize, 0);
  std::copy(kMario.begin(), kMario.end(), tag);
  uint8_t* name = bytes.data() + start + gs::kDisplayName + gs::kDisplayNameSize * port;
  std::fill(name, name + gs::kDisplayNameSize, 0);
  const std::initializer_list<int> bad_name = {0x93, 0xFA, 0x96, 0x7B, 0xFF, 'x'};
  std::copy(bad_name.begin(), bad_name.end(), name);

  const Game parsed = parse_slp(bytes, "names");
  EXPECT_TRUE(parsed.info.error.empty()) << parsed.info.error;
  ASSERT_FALSE(parsed.info.start.players.empty());
  EXPECT_EQ(parsed.info.start.players[0].nametag, "マリオ");
  EXPECT_EQ(parsed.info.start.players[0].display_name, "日本\uFFFDx");
}

}  // namespace
}  // namespace slipstream::slp
