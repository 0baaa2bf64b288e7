#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "engine/atomic_file.h"
#include "engine/crc32c.h"

namespace slipstream {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts would need byte swaps");

namespace {

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length would
// otherwise make us allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("safetensors " + path + ": " + what);
}
[[noreturn]] void fail_errno(const std::string& path, const std::string& what) {
  fail(path, what + ": " + std::strerror(errno));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

void read_all_at(int fd, void* data, size_t n, uint64_t offset, const std::string& path,
                 const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "reading " + what);
    }
    if (r == 0) fail(path, "unexpected end of file reading " + what);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

std::string checksum_text(const Tensor& t) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc32c(t.raw(), t.nbytes()));
  return buf;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// One tensor's header entry, checked: fields, dtype, shape, and offsets that hold exactly its
// bytes inside the `data_len`-byte data section.
Entry parse_entry(const std::string& name, const nlohmann::json& v, uint64_t data_len,
                  const std::string& path) {
  const std::string where = "tensor '" + name + "': ";
  if (!v.is_object()) fail(path, where + "entry is not an object");
  for (const auto& [k, unused] : v.items()) {
    (void)unused;
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail(path, where + "unexpected field '" + k + "'");
  }
  if (!v.contains("dtype") || !v["dtype"].is_string()) fail(path, where + "missing dtype");
  const std::string dt = v["dtype"].get<std::string>();
  auto dtype = dtype_from_safetensors_name(dt);
  if (!dtype)
    fail(path,
         where + "unsupported dtype '" + dt + "' (supported: F32 F64 BF16 F16 I32 I64 U8 U16)");
  if (!v.contains("shape") || !v["shape"].is_array()) fail(path, where + "missing shape");
  const auto& js = v["shape"];
  if (js.size() > static_cast<size_t>(Shape::kMaxRank))
    fail(path, where + "rank " + std::to_string(js.size()) + " exceeds the maximum of " +
                   std::to_string(Shape::kMaxRank));
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : js) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62))
      fail(path, where + "shape " + js.dump() + " has an invalid dimension");
    uint64_t dim = d.get<uint64_t>();
    if (dim && numel > UINT64_MAX / dim) overflow = true;
    numel *= dim;
    dims.push_back(static_cast<int64_t>(dim));
  }
  const uint64_t esize = dtype_size(*dtype);
  if (overflow || numel > UINT64_MAX / esize)
    fail(path, where + "shape " + js.dump() + " is too large");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
      !v["data_offsets"][1].is_number_unsigned())
    fail(path, where + "data_offsets must be two non-negative integers");
  const uint64_t begin = v["data_offsets"][0].get<uint64_t>();
  const uint64_t end = v["data_offsets"][1].get<uint64_t>();
  const std::string offs = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end) fail(path, where + "data_offsets " + offs + " are reversed");
  if (end > data_len)
    fail(path, where + "data_offsets " + offs + " run past the " + std::to_string(data_len) +
                   "-byte data section (truncated?)");
  if (end - begin != numel * esize)
    fail(path, where + "data_offsets " + offs + " hold " + std::to_string(end - begin) +
                   " bytes but " + dt + js.dump() + " needs " + std::to_string(numel * esize));
  return {name, *dtype, Shape(std::span<const int64_t>(dims)), begin, end};
}

// Like the reference reader: tensors must tile the data section, no overlaps, no holes.
void check_tiling(const std::vector<Entry>& entries, uint64_t data_len, const std::string& path) {
  std::vector<const Entry*> sorted;
  for (const auto& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t expect = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : sorted) {
    if (e->begin < expect)
      fail(path, "tensor '" + e->name + "' data_offsets [" + std::to_string(e->begin) + ", " +
                     std::to_string(e->end) + "] overlap tensor '" + prev->name + "' [" +
                     std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
    if (e->begin > expect)
      fail(path, "bytes [" + std::to_string(expect) + ", " + std::to_string(e->begin) +
                     ") of the data section belong to no tensor");
    expect = e->end;
    prev = e;
  }
  if (expect != data_len)
    fail(path, std::to_string(data_len - expect) +
                   " trailing bytes after the last tensor's data (corrupt or truncated header?)");
}

// The header of the open file `fd`: its length (checked against the file's size) and its JSON.
nlohmann::json read_header(int fd, uint64_t file_size, uint64_t& header_len,
                           const std::string& path) {
  if (file_size < 8)
    fail(path, "file is " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length (truncated?)");
  unsigned char len_le[8];
  read_all_at(fd, len_le, 8, 0, path, "header length");
  header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t{len_le[i]} << (8 * i);
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(kMaxHeaderBytes) + "-byte limit (not a safetensors file?)");
  if (header_len > file_size - 8)
    fail(path, "header length " + std::to_string(header_len) + " runs past the end of the " +
                   std::to_string(file_size) + "-byte file (truncated?)");
  if (header_len < 2) fail(path, "header of " + std::to_string(header_len) + " bytes is too short");
  std::string text(header_len, '\0');
  read_all_at(fd, text.data(), header_len, 8, path, "header");
  if (text[0] != '{') fail(path, "header does not start with '{' (not a safetensors file?)");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  return header;
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Larger elements first, then by name (as the reference writer does): with an 8-aligned header
  // every tensor starts aligned to its element size, so readers may map it in place.
  std::vector<const std::pair<const std::string, Tensor>*> order;
  for (const auto& kv : tensors) {
    const Tensor& t = kv.second;
    if (kv.first.empty() || kv.first == "__metadata__")
      fail(path, "invalid tensor name '" + kv.first + "'");
    if (!t.defined()) fail(path, "tensor '" + kv.first + "' is undefined");
    if (!t.device().is_cpu())
      fail(path, "tensor '" + kv.first + "' is " + t.describe() + "; copy it to the host first");
    order.push_back(&kv);
  }
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return dtype_size(a->second.dtype()) > dtype_size(b->second.dtype());
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto* kv : order) {
    const Tensor& t = kv->second;
    std::vector<int64_t> shape(t.shape().dims().begin(), t.shape().dims().end());
    header[kv->first] = {{"dtype", std::string(dtype_safetensors_name(t.dtype()))},
                         {"shape", shape},
                         {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format allows trailing spaces

  try {
    AtomicFile file(path);
    const uint64_t len = text.size();
    unsigned char len_le[8];
    for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(len >> (8 * i));
    file.write(len_le, 8);
    file.write(text);
    for (const auto* kv : order) file.write(kv->second.raw(), kv->second.nbytes());
    file.commit();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("safetensors ") + e.what());
  }
}

SafetensorsFile read_safetensors(const std::string& path, SafetensorsRead what) {
  // O_NONBLOCK: a FIFO put in a file's place opens at once and is refused below, instead of
  // blocking the open until a writer comes.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) fail_errno(path, "open");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno(path, "stat");
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  uint64_t header_len = 0;
  const nlohmann::json header = read_header(fd.get(), file_size, header_len, path);
  SafetensorsFile out;
  std::vector<Entry> entries;
  const uint64_t data_len = file_size - 8 - header_len;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string()) fail(path, "__metadata__ value for '" + k + "' is not a string");
        out.metadata[k] = mv.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(name, v, data_len, path));
  }
  check_tiling(entries, data_len, path);
  if (what == SafetensorsRead::metadata) return out;

  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu(), "safetensors tensor");
    read_all_at(fd.get(), t.raw(), t.nbytes(), 8 + header_len + e.begin, path,
                "tensor '" + e.name + "'");
    if (auto c = out.metadata.find(kChecksumPrefix + e.name); c != out.metadata.end()) {
      const std::string got = checksum_text(t);
      if (got != c->second)
        fail(path, "tensor '" + e.name + "' does not match its checksum (crc32c " + got +
                       ", written as " + c->second +
                       "): the file is damaged; use another checkpoint, or a copy of this one");
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

void add_tensor_checksums(const std::map<std::string, Tensor>& tensors,
                          std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) metadata[kChecksumPrefix + name] = checksum_text(t);
}

}  // namespace slipstream
