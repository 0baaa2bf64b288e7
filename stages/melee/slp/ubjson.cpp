#include "stages/melee/slp/ubjson.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

#include "stages/melee/slp/byte_order.h"

namespace slipstream::slp {
namespace {

using json = nlohmann::json;

// The byte iterator nlohmann reads through. It publishes how far the reader got: the SAX
// interface reports no position, and the caller needs the end of the value (it is embedded in
// a larger file) and offsets for errors.
class TrackedBytes {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;  // nlohmann reads through std::char_traits<value_type>
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedBytes(const uint8_t* p, const uint8_t** cursor) : p_(p), cursor_(cursor) {}
  reference operator*() const { return *reinterpret_cast<const char*>(p_); }
  TrackedBytes& operator++() {
    *cursor_ = ++p_;
    return *this;
  }
  TrackedBytes operator++(int) {
    TrackedBytes before = *this;
    ++*this;
    return before;
  }
  bool operator==(const TrackedBytes& other) const { return p_ == other.p_; }

 private:
  const uint8_t* p_;
  const uint8_t** cursor_;
};

// nlohmann's "[json.exception.parse_error.110] parse error at byte 5: <message>": the byte
// count is relative to where this read started, so only <message> is kept.
std::string describe(const json::exception& e) {
  std::string_view s = e.what();
  if (const size_t p = s.find("] "); p != std::string_view::npos) s.remove_prefix(p + 2);
  if (s.starts_with("parse error"))
    if (const size_t p = s.find(": "); p != std::string_view::npos) s.remove_prefix(p + 2);
  return std::string(s);
}

// nlohmann's DOM builder behind the caps. A callback returning false stops the reader, before
// it recurses into a container or loops over a declared count.
class BoundedDomSax {
 public:
  BoundedDomSax(json& root, const uint8_t* begin, const uint8_t* const& cursor, const uint8_t* end)
      : dom_(root, /*allow_exceptions=*/false), begin_(begin), cursor_(cursor), end_(end) {}

  bool null() { return count() && dom_.null(); }
  bool boolean(bool v) { return count() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return count() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return count() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    // JSON has no NaN or infinity (and NaN would make a value unequal to itself).
    return count() && (std::isfinite(v) ? dom_.number_float(v, s) : dom_.null());
  }
  bool string(json::string_t& s) { return count() && dom_.string(s); }
  bool binary(json::binary_t& b) { return count() && dom_.binary(b); }
  bool key(json::string_t& k) { return dom_.key(k); }
  bool start_object(std::size_t n) { return open(n) && dom_.start_object(n); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return open(n) && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string&, const json::exception& e) {
    // `position` counts the byte that failed, 1-based (one past the end at the end of input).
    offset_ = position > 0 ? position - 1 : 0;
    message_ = describe(e);
    return false;
  }

  size_t offset() const { return offset_; }  // relative to `begin`
  const std::string& message() const { return message_; }

 private:
  bool fail(std::string message) {
    offset_ = cursor_ > begin_ ? static_cast<size_t>(cursor_ - begin_) - 1 : 0;  // last byte read
    message_ = std::move(message);
    return false;
  }
  bool count() {
    if (++values_ > kUbjsonMaxValues)
      return fail("UBJSON value has more than " + std::to_string(kUbjsonMaxValues) + " elements");
    return true;
  }
  bool open(std::size_t declared) {
    if (depth_ == kUbjsonMaxDepth)
      return fail("UBJSON nesting deeper than " + std::to_string(kUbjsonMaxDepth));
    ++depth_;
    const auto left = static_cast<size_t>(end_ - cursor_);
    if (declared != static_cast<std::size_t>(-1) && declared > left)
      return fail("UBJSON container declares " + std::to_string(declared) + " elements but only " +
                  std::to_string(left) + " bytes are left");
    return count();
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const uint8_t* begin_;
  const uint8_t* const& cursor_;
  const uint8_t* end_;
  size_t depth_ = 0;
  size_t values_ = 0;
  size_t offset_ = 0;
  std::string message_ = "UBJSON value rejected";
};

}  // namespace

nlohmann::json read_ubjson(std::span<const uint8_t> data, size_t& pos) {
  if (pos > data.size()) throw UbjsonError(pos, "UBJSON value starts past the end of the file");
  const uint8_t* const begin = data.data() + pos;
  const size_t left = data.size() - pos;
  const uint8_t* const end = begin + std::min(left, kUbjsonMaxBytes);
  const uint8_t* cursor = begin;
  json root;
  BoundedDomSax sax(root, begin, cursor, end);
  bool ok;
  try {
    // strict=false: the value is followed by the rest of the file, not by the end of input.
    ok = json::sax_parse(TrackedBytes(begin, &cursor), TrackedBytes(end, &cursor), &sax,
                         json::input_format_t::ubjson, /*strict=*/false);
  } catch (const json::exception& e) {  // not expected with the caps; never let it escape
    throw UbjsonError(pos + static_cast<size_t>(cursor - begin), describe(e));
  }
  if (!ok) {
    if (left > kUbjsonMaxBytes && sax.offset() == kUbjsonMaxBytes)  // ran into the cap
      throw UbjsonError(pos + kUbjsonMaxBytes,
                        "UBJSON value larger than " + std::to_string(kUbjsonMaxBytes) + " bytes");
    throw UbjsonError(pos + sax.offset(), sax.message());
  }
  pos += static_cast<size_t>(cursor - begin);
  return root;
}

int64_t read_ubjson_length(std::span<const uint8_t> data, size_t& pos) {
  static constexpr std::string_view kIntegerMarkers = "iUIlL";
  if (pos >= data.size()) throw UbjsonError(pos, "UBJSON length runs past the end of the file");
  if (kIntegerMarkers.find(static_cast<char>(data[pos])) == std::string_view::npos) {
    static constexpr char kHex[] = "0123456789abcdef";
    throw UbjsonError(pos, std::string("expected a UBJSON integer marker, found 0x") +
                               kHex[data[pos] >> 4] + kHex[data[pos] & 15]);
  }
  size_t p = pos;
  const int64_t n = read_ubjson(data, p).get<int64_t>();
  if (n < 0) throw UbjsonError(pos, "negative UBJSON length");
  pos = p;
  return n;
}

void write_ubjson_key(const std::string& key, std::vector<uint8_t>& out) {
  if (key.size() <= 0xFF) {
    out.push_back('U');
    out.push_back(static_cast<uint8_t>(key.size()));
  } else {
    uint8_t length[4];
    store_be(length, static_cast<int32_t>(key.size()));
    out.push_back('l');
    out.insert(out.end(), length, length + 4);
  }
  out.insert(out.end(), key.begin(), key.end());
}

}  // namespace slipstream::slp
