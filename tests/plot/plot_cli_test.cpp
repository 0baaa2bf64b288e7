// `slipstream plot` end to end: default SVG next to the metrics, PNG by extension and size,
// and the error paths (missing file, malformed lines, nothing numeric).
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "png_check.h"

namespace fs = std::filesystem;

namespace slipstream::plot::test {
namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class PlotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("plot_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    run_ = dir_ / "bc-2024-05-01";
    fs::create_directories(run_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_metrics(const std::string& text) { std::ofstream(run_ / "metrics.jsonl") << text; }

  Result plot(const std::string& args) {
    Result r;
    fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    std::string cmd =
        std::string(SLIPSTREAM_EXE) + " plot " + args + " >" + out.string() + " 2>" + err.string();
    int status = std::system(cmd.c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static std::string metrics(int steps) {
    std::ostringstream s;
    for (int i = 0; i <= steps; i += 5) {
      s << "{\"step\":" << i << ",\"split\":\"train\",\"loss\":" << 2.0 / (1 + i / 20.0)
        << ",\"acc/buttons\":" << 0.5 + i / (4.0 * steps) << ",\"lr\":0.001}\n";
      if (i % 25 == 0 && i > 0)
        s << "{\"step\":" << i << ",\"split\":\"validation\",\"loss\":" << 2.2 / (1 + i / 20.0)
          << ",\"acc/buttons\":" << 0.45 + i / (4.0 * steps)
          << ",\"baseline/loss\":2.5,\"baseline/acc/buttons\":0.4}\n";
    }
    return s.str();
  }

  fs::path dir_, run_;
};

TEST_F(PlotCli, DefaultSvgInRunDir) {
  write_metrics(metrics(100));
  Result r = plot(run_.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::string svg = slurp(run_ / "curves.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find(">bc-2024-05-01</text>"), std::string::npos);  // title is the dir name
  EXPECT_NE(svg.find("data-label=\"val acc/buttons\""), std::string::npos);
  EXPECT_NE(r.out.find("curves.svg"), std::string::npos);
  EXPECT_EQ(r.err, "");
}

TEST_F(PlotCli, PngWithSizeAndChosenMetrics) {
  write_metrics(metrics(100));
  fs::path png_path = dir_ / "out.png";
  Result r =
      plot(run_.string() + "/ --out " + png_path.string() + " --size 800x500 --metrics loss,lr");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 panels"), std::string::npos) << r.out;
  DecodedPng png = read_png(slurp(png_path));
  ASSERT_EQ(png.error, "");
  EXPECT_EQ(png.width, 800);
  EXPECT_EQ(png.height, 500);
  if (!png.inflated) GTEST_SKIP() << "zlib not found: pixels not checked";
  EXPECT_EQ(png.raw_size, (800u * 3 + 1) * 500);
  size_t inked = 0;
  for (size_t i = 0; i < png.rgb.size(); i += 3)
    inked += png.rgb[i] != 255 || png.rgb[i + 1] != 255 || png.rgb[i + 2] != 255;
  EXPECT_GT(inked, 5000u);
}

TEST_F(PlotCli, PythonReadsThePng) {
  if (std::system("python3 -c 'import zlib, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with numpy not available";
  write_metrics(metrics(60));
  fs::path png_path = dir_ / "c.png";
  ASSERT_EQ(plot(run_.string() + " -o " + png_path.string()).code, 0);
  fs::path script = dir_ / "check.py";
  std::ofstream(script) << R"(import struct, sys, zlib, numpy as np
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, size = 8, b'', None
while pos < len(data):
    n, = struct.unpack('>I', data[pos:pos + 4]); kind = data[pos + 4:pos + 8]
    body = data[pos + 8:pos + 8 + n]
    assert struct.unpack('>I', data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
    if kind == b'IHDR': size = struct.unpack('>II', body[:8])
    if kind == b'IDAT': idat += body
    pos += 12 + n
w, h = size
raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, w * 3 + 1)
assert (raw[:, 0] <= 4).all()
print(w, h)
)";
  std::string cmd = "python3 " + script.string() + " " + png_path.string() + " > " +
                    (dir_ / "py.txt").string() + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << slurp(dir_ / "py.txt");
  EXPECT_EQ(slurp(dir_ / "py.txt"), "960 824\n");
}

TEST_F(PlotCli, MissingFileIsNamed) {
  fs::path missing = dir_ / "no-such-run";
  Result r = plot(missing.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find((missing / "metrics.jsonl").string()), std::string::npos) << r.err;
}

TEST_F(PlotCli, MalformedLinesAreSkippedAndCounted) {
  write_metrics(metrics(50) + "garbage\n{\"step\": \"x\"}\n{\"step\": 60, \"loss\"");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("skipped 3 malformed lines"), std::string::npos) << r.err;
}

TEST_F(PlotCli, NoNumericDataIsAnError) {
  write_metrics("{\"step\":1,\"split\":\"train\",\"loss\":null}\nnonsense\n");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no numeric metrics"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_ / "curves.svg"));
}

TEST_F(PlotCli, BadOutputExtension) {
  write_metrics(metrics(20));
  Result r = plot(run_.string() + " --out " + (dir_ / "x.jpg").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(".svg or .png"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace slipstream::plot::test
