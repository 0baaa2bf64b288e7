#include "engine/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "tests/support/flip_bits.h"

namespace slipstream {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() /
          ("slipstream-core-" + std::to_string(::getpid()) + "-" + info->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string file(const std::string& name) const { return (dir / name).string(); }
  fs::path dir;
};

// Element i of a test tensor, as raw little-endian bytes: an exact pattern Python can rebuild.
Tensor pattern(DType dtype, const Shape& shape) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::f32:
        t.data<float>()[i] = static_cast<float>(i) * 0.5f - 3;
        break;
      case DType::f64:
        t.data<double>()[i] = static_cast<double>(i) * 0.25 - 7;
        break;
      case DType::bf16:
        t.data<uint16_t>()[i] = static_cast<uint16_t>(0x3F80 + i);
        break;
      case DType::f16:
        t.data<uint16_t>()[i] = static_cast<uint16_t>(0x3C00 + i);
        break;
      case DType::i32:
        t.data<int32_t>()[i] = static_cast<int32_t>(i * 3 - 100);
        break;
      case DType::i64:
        t.data<int64_t>()[i] = (int64_t{1} << 40) + i;
        break;
      case DType::u8:
        t.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
        break;
      case DType::u16:
        t.data<uint16_t>()[i] = static_cast<uint16_t>(60000 + i);
        break;
    }
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> m;
  m["w_f32"] = pattern(DType::f32, {3, 4});
  m["w_f64"] = pattern(DType::f64, {5});
  m["w_bf16"] = pattern(DType::bf16, {2, 3, 2});
  m["w_f16"] = pattern(DType::f16, {7});
  m["i_i32"] = pattern(DType::i32, {4, 1});
  m["i_i64"] = pattern(DType::i64, {3});
  m["b_u8"] = pattern(DType::u8, {9});
  m["b_u16"] = pattern(DType::u16, {2, 2});
  return m;
}

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  auto tensors = every_dtype();
  tensors["scalar"] = pattern(DType::f32, {});
  tensors["empty"] = pattern(DType::i32, {0, 5});
  tensors["view"] = pattern(DType::f32, {6, 2}).slice_rows(2, 5);  // non-zero offset
  const std::map<std::string, std::string> meta{{"step", "1000"}, {"format", "slipstream"}};
  const std::string path = file("all.safetensors");
  write_safetensors(path, tensors, meta);
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(f.tensors.at(name), t)) << name << ": " << f.tensors.at(name).describe();
    EXPECT_TRUE(f.tensors.at(name).device().is_cpu());
  }
  // Header padded to 8 bytes and larger elements first: every tensor is aligned in the file.
  std::ifstream in(path, std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  EXPECT_EQ(len % 8, 0u);
}

TEST_F(SafetensorsTest, AtomicWriteLeavesNoTemporary) {
  const std::string path = file("ckpt.safetensors");
  write_safetensors(path, {{"a", pattern(DType::f32, {4})}});
  write_safetensors(path, {{"b", pattern(DType::u8, {3})}});  // replaces it whole
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt.safetensors"});
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.tensors.size(), 1u);
  EXPECT_TRUE(f.tensors.count("b"));
}

TEST_F(SafetensorsTest, WriteErrorsNamePath) {
  const std::string path = file("missing_dir/x.safetensors");
  try {
    write_safetensors(path, {{"a", pattern(DType::f32, {4})}});
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_safetensors(file("u.safetensors"), {{"a", Tensor()}}), std::runtime_error);
  EXPECT_THROW(
      write_safetensors(file("m.safetensors"), {{"__metadata__", pattern(DType::u8, {1})}}),
      std::runtime_error);
  EXPECT_FALSE(fs::exists(file("u.safetensors")));
}

// Writes a file from a header text and `data_bytes` zero bytes; `len` overrides the length field.
std::string raw_file(const fs::path& p, const std::string& header, size_t data_bytes,
                     std::optional<uint64_t> len = std::nullopt) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = len.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
  return p.string();
}

void expect_rejected(const std::string& path, const std::string& what) {
  try {
    (void)read_safetensors(path);
    ADD_FAILURE() << path << ": expected rejection mentioning '" << what << "'";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

// Tensors written with their checksums read back the same; one flipped bit in a tensor's bytes
// is an error naming the file and that tensor (the header alone still reads, as the graph
// lookup needs), and a file without checksums reads as before.
TEST_F(SafetensorsTest, ChecksumsCatchAFlippedBit) {
  const std::string path = file("sum.safetensors");
  std::map<std::string, Tensor> tensors = {{"a", pattern(DType::f32, {64})},
                                           {"b", pattern(DType::u8, {7})}};
  std::map<std::string, std::string> meta = {{"by", "test"}};
  add_tensor_checksums(tensors, meta);
  EXPECT_EQ(meta.size(), 3u);
  EXPECT_EQ(meta.at("crc32c:b").size(), 8u);
  write_safetensors(path, tensors, meta);
  EXPECT_EQ(read_safetensors(path).metadata, meta);
  const auto size = fs::file_size(path);
  // Inside a's bytes (b, u8, comes last).
  slipstream::testing::flip_bits(path, static_cast<std::streamoff>(size - 20), 0x04);
  expect_rejected(path, "tensor 'a' does not match its checksum");
  EXPECT_NO_THROW(read_safetensors(path, SafetensorsRead::metadata));
  write_safetensors(path, tensors);  // no checksums: nothing to check
  EXPECT_NO_THROW(read_safetensors(path));
}

TEST_F(SafetensorsTest, CorruptFilesRejectedWithPath) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(read_safetensors(raw_file(dir / "good", good, 8)));

  // Truncated: data cut short, and cut inside the length field.
  expect_rejected(raw_file(dir / "trunc", good, 5), "run past the 5-byte data section");
  {
    std::ofstream(dir / "tiny", std::ios::binary) << "abc";
    expect_rejected((dir / "tiny").string(), "too short for the 8-byte header length");
  }
  expect_rejected(raw_file(dir / "trunc_header", good, 0, good.size() + 100), "runs past the end");
  expect_rejected(raw_file(dir / "overlap",
                           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                           8),
                  "overlap");
  expect_rejected(
      raw_file(dir / "gap", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4),
      "belong to no tensor");
  expect_rejected(raw_file(dir / "trailing", good, 12), "trailing bytes");
  expect_rejected(
      raw_file(dir / "dtype", R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8),
      "unsupported dtype 'Q7'");
  expect_rejected(
      raw_file(dir / "size", R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", 8),
      "needs 16");
  expect_rejected(raw_file(dir / "huge_len", good, 8, uint64_t{1} << 40), "exceeds");
  expect_rejected(raw_file(dir / "json", R"({"a":{"dtype":"F32",)", 8), "not valid JSON");
  expect_rejected(raw_file(dir / "notjson", "PK\x03\x04", 8), "does not start with '{'");
  expect_rejected(
      raw_file(dir / "neg", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
      "invalid dimension");
  expect_rejected(
      raw_file(dir / "rev", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
      "reversed");
  expect_rejected(
      raw_file(dir / "field", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1),
      "unexpected field 'x'");
  expect_rejected(raw_file(dir / "meta", R"({"__metadata__":{"k":3}})", 0), "not a string");
  expect_rejected(
      raw_file(dir / "overflow",
               R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
      "too large");
  expect_rejected(file("does_not_exist"), "open");
}

TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const std::string path = file("fuzz.safetensors");
  write_safetensors(path, every_dtype(), {{"k", "v"}});
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    std::string b = bytes;
    if (i % 3 == 0) b.resize(rng() % b.size());
    for (int k = 0; k < 3; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    const std::string p = file("fuzz_" + std::to_string(i));
    std::ofstream(p, std::ios::binary) << b;
    try {
      (void)read_safetensors(p);
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

// ---- Python interop: the files PyTorch/numpy users load ------------------------------------

std::string python() {
  const char* p = std::getenv("SLIPSTREAM_PYTHON");
  return p && *p ? p : "python3";
}

// Why Python interop cannot be tested here, or "" when it can.
std::string python_unavailable() {
  const std::string cmd = python() + " -c 'import safetensors.numpy, numpy' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0)
    return python() +
           " cannot import safetensors and numpy (make deps / pip install safetensors numpy)";
  return "";
}

int run_python(const fs::path& script_path, const std::string& script, const std::string& arg) {
  std::ofstream(script_path) << script;
  const std::string cmd = python() + " " + script_path.string() + " " + arg;
  return std::system(cmd.c_str());
}

constexpr const char* kPattern = R"(
import numpy as np
def pattern(dtype, shape):
    n = int(np.prod(shape)) if len(shape) else 1
    i = np.arange(n)
    v = {"F32": (i * 0.5 - 3).astype(np.float32), "F64": (i * 0.25 - 7).astype(np.float64),
         "BF16": (0x3F80 + i).astype(np.uint16), "F16": (0x3C00 + i).astype(np.uint16).view(np.float16),
         "I32": (i * 3 - 100).astype(np.int32), "I64": ((1 << 40) + i).astype(np.int64),
         "U8": ((i * 7) % 256).astype(np.uint8), "U16": (60000 + i).astype(np.uint16)}[dtype]
    return v.reshape(shape)
)";

TEST_F(SafetensorsTest, PythonReadsOurFiles) {
  if (auto why = python_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string path = file("from_cpp.safetensors");
  write_safetensors(path, every_dtype(), {{"step", "42"}});
  const std::string script = std::string(kPattern) + R"(
import sys, safetensors, safetensors.numpy
path = sys.argv[1]
data = open(path, "rb").read()
raw = dict(safetensors.deserialize(data))
want = {"w_f32": ("F32", [3, 4]), "w_f64": ("F64", [5]), "w_bf16": ("BF16", [2, 3, 2]),
        "w_f16": ("F16", [7]), "i_i32": ("I32", [4, 1]), "i_i64": ("I64", [3]),
        "b_u8": ("U8", [9]), "b_u16": ("U16", [2, 2])}
assert sorted(raw) == sorted(want), sorted(raw)
for name, (dt, shape) in want.items():
    assert raw[name]["dtype"] == dt and list(raw[name]["shape"]) == shape, (name, raw[name]["dtype"])
    assert bytes(raw[name]["data"]) == pattern(dt, shape).tobytes(), name
# numpy has no bf16 (so load_file refuses this file): check the others one by one through numpy.
with safetensors.safe_open(path, framework="numpy") as f:
    assert f.metadata() == {"step": "42"}, f.metadata()
    for name, (dt, shape) in want.items():
        if dt != "BF16":
            assert np.array_equal(f.get_tensor(name), pattern(dt, shape)), name
print("python: ok")
)";
  EXPECT_EQ(run_python(dir / "check.py", script, path), 0);
}

TEST_F(SafetensorsTest, WeReadPythonFiles) {
  if (auto why = python_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string path = file("from_python.safetensors");
  const std::string script = std::string(kPattern) + R"(
import sys, safetensors.numpy
t = {"w_f32": pattern("F32", [3, 4]), "w_f64": pattern("F64", [5]), "w_f16": pattern("F16", [7]),
     "i_i32": pattern("I32", [4, 1]), "i_i64": pattern("I64", [3]), "b_u8": pattern("U8", [9]),
     "b_u16": pattern("U16", [2, 2])}
safetensors.numpy.save_file(t, sys.argv[1], metadata={"by": "python"})
)";
  ASSERT_EQ(run_python(dir / "write.py", script, path), 0);
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata.at("by"), "python");
  auto want = every_dtype();
  want.erase("w_bf16");
  ASSERT_EQ(f.tensors.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(f.tensors.at(name), t)) << name << ": " << f.tensors.at(name).describe();
  }
}

}  // namespace
}  // namespace slipstream
