#include "stages/melee/slp/ubjson.h"

#include <cmath>
#include <limits>

#include "stages/melee/slp/byte_order.h"

namespace slipstream::slp {
namespace {

constexpr int kMaxDepth = 64;
// Bounds the tree built from a hostile metadata element (each node costs ~16 bytes).
constexpr size_t kMaxNodes = 1 << 20;

class Reader {
 public:
  Reader(std::span<const uint8_t> data, size_t& pos) : data_(data), pos_(pos) {}

  nlohmann::json value(int depth) {
    if (depth > kMaxDepth) fail("UBJSON nesting deeper than 64");
    if (++nodes_ > kMaxNodes) fail("UBJSON metadata has too many values");
    uint8_t marker = byte();
    while (marker == 'N') marker = byte();  // no-op padding
    return typed(marker, depth);
  }

  int64_t length() {
    const int64_t n = integer(byte());
    if (n < 0) fail("negative UBJSON length");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw UbjsonError(pos_, what); }

  uint8_t byte() {
    if (pos_ >= data_.size()) fail("UBJSON value runs past the end of the file");
    return data_[pos_++];
  }
  const uint8_t* take(size_t n) {
    if (data_.size() - pos_ < n) fail("UBJSON value runs past the end of the file");
    const uint8_t* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }

  int64_t integer(uint8_t marker) {
    switch (marker) {
      case 'i':
        return static_cast<int8_t>(*take(1));
      case 'U':
        return *take(1);
      case 'I':
        return load_be<int16_t>(take(2));
      case 'l':
        return load_be<int32_t>(take(4));
      case 'L':
        return load_be<int64_t>(take(8));
      default:
        fail("expected a UBJSON integer marker");
    }
  }

  std::string string_body() {
    const int64_t n = length();
    if (static_cast<uint64_t>(n) > data_.size() - pos_)
      fail("UBJSON string runs past the end of the file");
    const uint8_t* p = take(static_cast<size_t>(n));
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
  }

  nlohmann::json typed(uint8_t marker, int depth) {
    switch (marker) {
      case 'Z':
        return nullptr;
      case 'T':
        return true;
      case 'F':
        return false;
      case 'i':
      case 'U':
      case 'I':
      case 'l':
      case 'L':
        return integer(marker);
      case 'd': {
        const float f = load_be<float>(take(4));
        return std::isfinite(f) ? nlohmann::json(f) : nlohmann::json(nullptr);
      }
      case 'D': {
        const double d = load_be<double>(take(8));
        return std::isfinite(d) ? nlohmann::json(d) : nlohmann::json(nullptr);
      }
      case 'C':
        return std::string(1, static_cast<char>(byte()));
      case 'S':
      case 'H':
        return string_body();
      case '[':
        return container(false, depth);
      case '{':
        return container(true, depth);
      default:
        fail("unknown UBJSON marker 0x" + hex(marker));
    }
  }

  nlohmann::json container(bool object, int depth) {
    nlohmann::json out = object ? nlohmann::json::object() : nlohmann::json::array();
    int elem_type = -1;
    int64_t count = -1;
    if (peek() == '$') {
      ++pos_;
      elem_type = byte();
      if (peek() != '#') fail("UBJSON '$' without '#'");
    }
    if (peek() == '#') {
      ++pos_;
      count = length();
      // Every element takes at least one byte, except typed no-payload elements; bounding by the
      // bytes left keeps a hostile count from allocating without end.
      if (static_cast<uint64_t>(count) > data_.size() - pos_) fail("UBJSON count exceeds the file");
    }
    for (int64_t i = 0; count < 0 || i < count; ++i) {
      if (count < 0) {
        while (peek() == 'N') ++pos_;
        if (peek() == (object ? '}' : ']')) {
          ++pos_;
          break;
        }
      }
      std::string key;
      if (object) key = string_body();
      nlohmann::json v;
      if (elem_type >= 0) {
        if (++nodes_ > kMaxNodes) fail("UBJSON metadata has too many values");
        v = typed(static_cast<uint8_t>(elem_type), depth + 1);
      } else {
        v = value(depth + 1);
      }
      if (object)
        out[key] = std::move(v);
      else
        out.push_back(std::move(v));
    }
    return out;
  }

  uint8_t peek() const {
    if (pos_ >= data_.size())
      throw UbjsonError(pos_, "UBJSON container runs past the end of the file");
    return data_[pos_];
  }

  static std::string hex(uint8_t b) {
    const char* digits = "0123456789abcdef";
    return {digits[b >> 4], digits[b & 15]};
  }

  std::span<const uint8_t> data_;
  size_t& pos_;
  size_t nodes_ = 0;
};

void write_integer(int64_t v, std::vector<uint8_t>& out) {
  uint8_t buf[8];
  if (v >= 0 && v <= 255) {
    out.push_back('U');
    out.push_back(static_cast<uint8_t>(v));
  } else if (v >= -128 && v <= 127) {
    out.push_back('i');
    out.push_back(static_cast<uint8_t>(static_cast<int8_t>(v)));
  } else if (v >= std::numeric_limits<int16_t>::min() && v <= std::numeric_limits<int16_t>::max()) {
    out.push_back('I');
    store_be(buf, static_cast<int16_t>(v));
    out.insert(out.end(), buf, buf + 2);
  } else if (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) {
    out.push_back('l');
    store_be(buf, static_cast<int32_t>(v));
    out.insert(out.end(), buf, buf + 4);
  } else {
    out.push_back('L');
    store_be(buf, v);
    out.insert(out.end(), buf, buf + 8);
  }
}

}  // namespace

nlohmann::json read_ubjson(std::span<const uint8_t> data, size_t& pos) {
  Reader r(data, pos);
  return r.value(0);
}

int64_t read_ubjson_length(std::span<const uint8_t> data, size_t& pos) {
  Reader r(data, pos);
  return r.length();
}

void write_ubjson_key(const std::string& key, std::vector<uint8_t>& out) {
  write_integer(static_cast<int64_t>(key.size()), out);
  out.insert(out.end(), key.begin(), key.end());
}

void write_ubjson(const nlohmann::json& value, std::vector<uint8_t>& out) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      out.push_back('Z');
      break;
    case nlohmann::json::value_t::boolean:
      out.push_back(value.get<bool>() ? 'T' : 'F');
      break;
    case nlohmann::json::value_t::number_integer:
      write_integer(value.get<int64_t>(), out);
      break;
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = value.get<uint64_t>();
      write_integer(u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                        ? std::numeric_limits<int64_t>::max()
                        : static_cast<int64_t>(u),
                    out);
      break;
    }
    case nlohmann::json::value_t::number_float: {
      uint8_t buf[8];
      out.push_back('D');
      store_be(buf, value.get<double>());
      out.insert(out.end(), buf, buf + 8);
      break;
    }
    case nlohmann::json::value_t::string: {
      out.push_back('S');
      write_ubjson_key(value.get_ref<const std::string&>(), out);
      break;
    }
    case nlohmann::json::value_t::array:
      out.push_back('[');
      for (const auto& v : value) write_ubjson(v, out);
      out.push_back(']');
      break;
    case nlohmann::json::value_t::object:
      out.push_back('{');
      for (auto it = value.begin(); it != value.end(); ++it) {
        write_ubjson_key(it.key(), out);
        write_ubjson(it.value(), out);
      }
      out.push_back('}');
      break;
    default:
      out.push_back('Z');
      break;
  }
}

}  // namespace slipstream::slp
