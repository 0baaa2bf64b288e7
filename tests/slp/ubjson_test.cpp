// The UBJSON reader (nlohmann's, behind caps for hostile input) and the metadata writer.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include "stages/melee/slp/ubjson.h"

namespace slipstream::slp {
namespace {

using json = nlohmann::json;
using Bytes = std::vector<uint8_t>;

Bytes bytes_of(std::initializer_list<int> values) {
  Bytes out;
  for (int v : values) out.push_back(static_cast<uint8_t>(v));
  return out;
}

json read_all(const Bytes& b) {
  size_t pos = 0;
  json j = read_ubjson(b, pos);
  EXPECT_EQ(pos, b.size());
  return j;
}

// The error a read of `b` from 0 gives (fails the test if there is none).
UbjsonError read_error(const Bytes& b, size_t pos = 0) {
  try {
    (void)read_ubjson(b, pos);
  } catch (const UbjsonError& e) {
    return e;
  }
  ADD_FAILURE() << "no UbjsonError";
  return UbjsonError(std::numeric_limits<size_t>::max(), "");
}

json sample() {
  return {{"startAt", "2018-06-22T07:52:59Z"},
          {"lastFrame", 8382},
          {"playedOn", "dolphin"},
          {"consoleNick", "日本 Station"},
          {"empty", ""},
          {"players",
           {{"0", {{"characters", {{"18", 5209}}}, {"names", {{"netplay", "x"}, {"code", "A#1"}}}}},
            {"1", {{"characters", json::object()}}}}},
          {"ints",
           {0, -1, 127, 128, 255, 256, -129, 40000, -40000, int64_t{1} << 40,
            std::numeric_limits<int64_t>::min()}},
          {"floats", {0.5, -1.25e-300, 3.0e300}},
          {"flags", {true, false, nullptr}},
          {"nested", {{"a", {{"b", {{"c", {1, {2, {3, json::array()}}}}}}}}}}};
}

TEST(SlpUbjson, NestedValuesRoundTrip) {
  const json value = sample();
  Bytes b;
  json::to_ubjson(value, b);
  EXPECT_EQ(read_all(b), value);
}

TEST(SlpUbjson, ReadStopsJustAfterTheValueInsideALargerBuffer) {
  Bytes b = {'x', 'y'};
  json::to_ubjson(sample(), b);
  const size_t value_end = b.size();
  b.insert(b.end(), {'}', 'S', 0xFF});  // what follows must not be read
  size_t pos = 2;
  EXPECT_EQ(read_ubjson(b, pos), sample());
  EXPECT_EQ(pos, value_end);

  // Unsized containers end at their closing marker, sized ones after the last element.
  const Bytes unsized = bytes_of({'[', 'U', 1, 'N', ']', ']'});
  pos = 0;
  EXPECT_EQ(read_ubjson(unsized, pos), json::array({1}));
  EXPECT_EQ(pos, 5u);
  const Bytes sized = bytes_of({'{', '#', 'U', 1, 'U', 1, 'k', 'T', '}'});
  pos = 0;
  EXPECT_EQ(read_ubjson(sized, pos), json({{"k", true}}));
  EXPECT_EQ(pos, 8u);
}

TEST(SlpUbjson, OptimizedContainersAndOtherMarkers) {
  EXPECT_EQ(read_all(bytes_of({'[', '$', 'U', '#', 'U', 3, 1, 2, 250})), json({1, 2, 250}));
  EXPECT_EQ(read_all(bytes_of({'{', '$', 'i', '#', 'U', 2, 'U', 1, 'a', 0xFF, 'U', 1, 'b', 7})),
            json({{"a", -1}, {"b", 7}}));
  EXPECT_EQ(read_all(bytes_of({'N', 'N', 'C', 'q'})), "q");
  EXPECT_EQ(read_all(bytes_of({'d', 0x3F, 0xC0, 0, 0})), 1.5);
  EXPECT_EQ(read_all(bytes_of({'I', 0x80, 0x00})), -32768);
  // JSON has no NaN or infinity.
  EXPECT_TRUE(read_all(bytes_of({'D', 0x7F, 0xF8, 0, 0, 0, 0, 0, 0})).is_null());
  EXPECT_TRUE(read_all(bytes_of({'d', 0x7F, 0x80, 0, 0})).is_null());
}

TEST(SlpUbjson, DepthCap) {
  const size_t cap = kUbjsonMaxDepth;
  Bytes ok(cap, '[');
  ok.insert(ok.end(), cap, ']');
  json j = read_all(ok);
  for (size_t i = 1; i < cap; ++i) j = j.at(0);
  EXPECT_EQ(j, json::array());

  Bytes deep(cap + 1, '[');
  deep.insert(deep.end(), cap + 1, ']');
  const UbjsonError e = read_error(deep);
  EXPECT_NE(std::string(e.what()).find("nesting deeper than 64"), std::string::npos) << e.what();
  EXPECT_GE(e.offset, cap);  // at the 65th '[' (the reader has looked one byte ahead)
  EXPECT_LE(e.offset, cap + 1);

  // Far deeper than the cap, with and without the closing markers: no stack exhaustion.
  EXPECT_NE(std::string(read_error(Bytes(1'000'000, '[')).what()).find("nesting"),
            std::string::npos);
  EXPECT_NE(std::string(read_error(Bytes(1'000'000, '{')).what()).find("UBJSON"),
            std::string::npos);
}

TEST(SlpUbjson, DeclaredCountBeyondTheBytesLeft) {
  // Typed nulls take no bytes: only the cap stops 2^63 iterations.
  const Bytes huge =
      bytes_of({'[', '$', 'Z', '#', 'L', 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, '}', '}'});
  const auto start = std::chrono::steady_clock::now();
  UbjsonError e = read_error(huge);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_NE(std::string(e.what()).find("declares 9223372036854775807 elements but only 2 bytes"),
            std::string::npos)
      << e.what();
  EXPECT_EQ(e.offset, 12u);  // the count's last byte

  // The bound is exact: as many typed elements as bytes are left is allowed.
  EXPECT_EQ(read_error(bytes_of({'[', '$', 'Z', '#', 'U', 4, 0, 0, 0})).offset, 5u);
  Bytes three = bytes_of({'[', '$', 'Z', '#', 'U', 3, 0, 0, 0});
  size_t pos = 0;
  EXPECT_EQ(read_ubjson(three, pos), json({nullptr, nullptr, nullptr}));
  EXPECT_EQ(pos, 6u);

  e = read_error(bytes_of({'{', '#', 'l', 0x00, 0xFF, 0xFF, 0xFF, 'U', 1, 'a', 'Z'}));
  EXPECT_NE(std::string(e.what()).find("declares 16777215 elements"), std::string::npos);
}

TEST(SlpUbjson, ValueCountCap) {
  Bytes many(kUbjsonMaxValues + 2, 'Z');  // the array counts too
  many.front() = '[';
  many.back() = ']';
  const UbjsonError e = read_error(many);
  EXPECT_NE(std::string(e.what()).find("more than 1048576 elements"), std::string::npos)
      << e.what();
  EXPECT_EQ(e.offset, kUbjsonMaxValues);  // the last null, which is one too many

  Bytes fits(kUbjsonMaxValues + 1, 'Z');
  fits.front() = '[';
  fits.back() = ']';
  EXPECT_EQ(read_all(fits).size(), kUbjsonMaxValues - 1);
}

TEST(SlpUbjson, TruncatedInput) {
  Bytes b;
  json::to_ubjson(sample(), b);
  for (size_t cut = 0; cut < b.size(); ++cut) {
    SCOPED_TRACE(cut);
    const UbjsonError e = read_error(Bytes(b.begin(), b.begin() + static_cast<long>(cut)));
    EXPECT_LE(e.offset, cut);
  }
  // Running out names the end of the input.
  const UbjsonError e = read_error(bytes_of({'S', 'U', 5, 'a', 'b'}));
  EXPECT_EQ(e.offset, 5u);
  EXPECT_NE(std::string(e.what()).find("unexpected end of input"), std::string::npos) << e.what();
  EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
  EXPECT_EQ(read_error(Bytes{}).offset, 0u);
  EXPECT_EQ(read_error(bytes_of({'Z'}), 2).offset, 2u);  // starting past the end
}

TEST(SlpUbjson, HugeStringLengthReadsOnlyWhatIsThere) {
  const Bytes b = bytes_of({'S', 'L', 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 'a', 'b'});
  const auto start = std::chrono::steady_clock::now();
  const UbjsonError e = read_error(b);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(e.offset, b.size());
  EXPECT_NE(std::string(e.what()).find("unexpected end of input"), std::string::npos) << e.what();
}

TEST(SlpUbjson, TotalSizeCap) {
  // A string longer than the cap, all of it present.
  Bytes b = bytes_of({'S', 'l', 0x01, 0x10, 0x00, 0x00});  // 17 MiB
  b.resize(b.size() + (size_t{17} << 20), 'a');
  const UbjsonError e = read_error(b);
  EXPECT_EQ(e.offset, kUbjsonMaxBytes);
  EXPECT_NE(std::string(e.what()).find("larger than 16777216 bytes"), std::string::npos)
      << e.what();
  // Just under the cap is fine.
  Bytes under = bytes_of({'S', 'l', 0x00, 0xFF, 0xFF, 0xFA});
  under.resize(kUbjsonMaxBytes, 'b');
  EXPECT_EQ(read_all(under).get_ref<const std::string&>().size(), kUbjsonMaxBytes - 6);
}

TEST(SlpUbjson, MalformedMarkers) {
  UbjsonError e = read_error(bytes_of({'[', 'U', 1, 'X'}));
  EXPECT_EQ(e.offset, 3u);
  EXPECT_NE(std::string(e.what()).find("invalid byte: 0x58"), std::string::npos) << e.what();
  e = read_error(bytes_of({'[', '$', 'U', 'U', 1, 2}));
  EXPECT_NE(std::string(e.what()).find("expected '#'"), std::string::npos) << e.what();
  e = read_error(bytes_of({'{', 'S', 'U', 1, 'k', 'Z', '}'}));  // keys carry no 'S'
  EXPECT_EQ(e.offset, 1u);
}

TEST(SlpUbjson, NegativeStringLength) {
  // Refused by newer nlohmann releases, read as "" by 3.11.2: either way nothing past it is read.
  const Bytes b = bytes_of({'S', 'i', 0xFF, 'Z'});
  size_t pos = 0;
  try {
    EXPECT_EQ(read_ubjson(b, pos), "");
    EXPECT_EQ(pos, 3u);
  } catch (const UbjsonError& e) {
    EXPECT_LE(e.offset, 3u);
  }
}

TEST(SlpUbjson, Lengths) {
  const Bytes b =
      bytes_of({'U', 200, 'I', 0x01, 0x00, 'l', 0, 0, 0, 9, 'L', 0, 0, 0, 0, 0, 0, 0, 3});
  size_t pos = 0;
  EXPECT_EQ(read_ubjson_length(b, pos), 200);
  EXPECT_EQ(pos, 2u);
  EXPECT_EQ(read_ubjson_length(b, pos), 256);
  EXPECT_EQ(read_ubjson_length(b, pos), 9);
  EXPECT_EQ(read_ubjson_length(b, pos), 3);
  EXPECT_EQ(pos, b.size());

  pos = 0;
  EXPECT_THROW(read_ubjson_length(bytes_of({'i', 0xFF}), pos), UbjsonError);  // negative
  EXPECT_EQ(pos, 0u);
  try {
    pos = 1;
    read_ubjson_length(bytes_of({'{', 'S', 1}), pos);
    ADD_FAILURE();
  } catch (const UbjsonError& e) {
    EXPECT_EQ(e.offset, 1u);
    EXPECT_NE(std::string(e.what()).find("integer marker, found 0x53"), std::string::npos);
  }
  pos = 0;
  EXPECT_THROW(read_ubjson_length(bytes_of({'l', 0, 0}), pos), UbjsonError);  // truncated
  pos = 1;
  EXPECT_THROW(read_ubjson_length(bytes_of({'U'}), pos), UbjsonError);  // at the end
}

TEST(SlpUbjson, ContainerKeys) {
  Bytes out;
  write_ubjson_key("raw", out);
  EXPECT_EQ(out, bytes_of({'U', 3, 'r', 'a', 'w'}));
  out.clear();
  write_ubjson_key(std::string(300, 'k'), out);
  EXPECT_EQ(Bytes(out.begin(), out.begin() + 5), bytes_of({'l', 0, 0, 1, 44}));
  size_t pos = 0;
  EXPECT_EQ(read_ubjson_length(out, pos), 300);
  EXPECT_EQ(out.size() - pos, 300u);
}

}  // namespace
}  // namespace slipstream::slp
