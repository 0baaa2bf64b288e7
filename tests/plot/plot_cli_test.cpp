// `slipstream plot` end to end: default SVG next to the metrics, PNG/PDF by extension or
// --format, several runs in one figure, and the error paths (missing, empty or corrupt file,
// malformed lines, nothing numeric, bad flags).
#include <cairo.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

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

struct Png {
  int width = 0, height = 0;
  std::vector<uint32_t> px;  // 0x00RRGGBB
};

Png read_png(const fs::path& file) {
  Png png;
  cairo_surface_t* s = cairo_image_surface_create_from_png(file.string().c_str());
  if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
    cairo_surface_flush(s);
    png.width = cairo_image_surface_get_width(s);
    png.height = cairo_image_surface_get_height(s);
    int stride = cairo_image_surface_get_stride(s);
    const unsigned char* data = cairo_image_surface_get_data(s);
    for (int y = 0; y < png.height; ++y)
      for (int x = 0; x < png.width; ++x)
        png.px.push_back(reinterpret_cast<const uint32_t*>(data + y * stride)[x] & 0xFFFFFF);
  }
  cairo_surface_destroy(s);
  return png;
}

// Pixels within a little of 0xRRGGBB (antialiased edges blend with the white background).
size_t count_near(const Png& png, uint32_t c) {
  size_t n = 0;
  for (uint32_t p : png.px) {
    int d = 0;
    for (int shift : {16, 8, 0})
      d += std::abs(static_cast<int>((p >> shift) & 255) - static_cast<int>((c >> shift) & 255));
    n += d <= 40;
  }
  return n;
}

constexpr uint32_t kBlue = 0x1F77B4, kOrange = 0xFF7F0E;  // the first two runs' colours

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

  void write_metrics(const std::string& text, const fs::path& run = {}) {
    fs::path d = run.empty() ? run_ : run;
    fs::create_directories(d);
    std::ofstream(d / "metrics.jsonl") << text;
  }

  Result plot(const std::string& args, const fs::path& cwd = {}) {
    Result r;
    fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    std::string cmd = (cwd.empty() ? "" : "cd " + cwd.string() + " && ") +
                      std::string(SLIPSTREAM_EXE) + " plot " + args + " >" + out.string() + " 2>" +
                      err.string();
    int status = std::system(cmd.c_str());
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static std::string metrics(int steps, double scale = 1) {
    std::ostringstream s;
    for (int i = 0; i <= steps; i += 5) {
      s << "{\"step\":" << i << ",\"split\":\"train\",\"loss\":" << scale * 14 / (1 + i / 5.0)
        << ",\"acc/buttons\":" << 0.5 + i / (4.0 * steps) << ",\"lr\":0.001}\n";
      if (i % 25 == 0 && i > 0)
        s << "{\"step\":" << i
          << ",\"split\":\"validation\",\"loss\":" << scale * 15 / (1 + i / 5.0)
          << ",\"acc/buttons\":" << 0.45 + i / (4.0 * steps)
          << ",\"baseline/loss\":2.5,\"baseline/acc/buttons\":0.4}\n";
    }
    s << "{\"reason\":\"steps\",\"split\":\"end\",\"step\":" << steps << "}\n";
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
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(r.out.find("curves.svg"), std::string::npos);
  EXPECT_NE(r.out.find("3 panels"), std::string::npos) << r.out;  // loss, acc/buttons, lr
  EXPECT_NE(r.out.find("1 run,"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST_F(PlotCli, PngWithSizeAndChosenMetrics) {
  write_metrics(metrics(100));
  fs::path png_path = dir_ / "out.png";
  Result r =
      plot(run_.string() + "/ --out " + png_path.string() + " --size 800x500 --metrics loss,lr");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 panels"), std::string::npos) << r.out;
  Png png = read_png(png_path);
  EXPECT_EQ(png.width, 800);
  EXPECT_EQ(png.height, 500);
  EXPECT_GT(count_near(png, kBlue), 500u);
  EXPECT_EQ(count_near(png, kOrange), 0u);  // one run, one colour
}

TEST_F(PlotCli, PdfByExtensionAndPngByFormat) {
  write_metrics(metrics(60));
  Result r = plot(run_.string() + " -o " + (dir_ / "c.PDF").string() + " --linear");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string pdf = slurp(dir_ / "c.PDF");
  EXPECT_EQ(pdf.rfind("%PDF-", 0), 0u);
  EXPECT_NE(pdf.find("%%EOF", pdf.size() - 8), std::string::npos);

  r = plot(run_.string() + " --format png --smooth 0.8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_png(run_ / "curves.png").width, 960);
}

TEST_F(PlotCli, SeveralRunsInOneFigure) {
  fs::path a = dir_ / "lr-3e-3", b = dir_ / "lr-1e-3";
  write_metrics(metrics(100), a);
  write_metrics(metrics(100, 0.5), b);
  // --metrics takes one list, so the run directories may come after it.
  Result r = plot(
      "--metrics loss,lr " + a.string() + " " + (b / "metrics.jsonl").string() + " --format png",
      dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 panels"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 runs"), std::string::npos) << r.out;
  Png png = read_png(dir_ / "curves.png");  // several runs: the current directory
  EXPECT_GT(count_near(png, kBlue), 300u);
  EXPECT_GT(count_near(png, kOrange), 300u);
}

// Two runs of one name, one given as a bare name from its parent folder: the legend tells them
// apart by their parents (a bare name's parent is "", which made the command fail).
TEST_F(PlotCli, RunsOfOneNameGivenAsABareName) {
  write_metrics(metrics(50), dir_ / "x" / "r");
  write_metrics(metrics(50, 0.5), dir_ / "y" / "r");
  Result r = plot("r ../y/r --format png", dir_ / "x");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 runs"), std::string::npos) << r.out;
}

TEST_F(PlotCli, MissingFileIsNamed) {
  fs::path missing = dir_ / "no-such-run";
  Result r = plot(missing.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find((missing / "metrics.jsonl").string()), std::string::npos) << r.err;
}

TEST_F(PlotCli, EmptyFileIsNamed) {
  write_metrics("");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find((run_ / "metrics.jsonl").string() + ": empty"), std::string::npos) << r.err;
}

TEST_F(PlotCli, CorruptFileNamesFileAndLine) {
  write_metrics("\n<html>not metrics</html>\nstill not\n");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find((run_ / "metrics.jsonl").string() + ":2: not a metrics row"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("<html>"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_ / "curves.svg"));
}

TEST_F(PlotCli, MalformedLinesAreSkippedAndCounted) {
  write_metrics(metrics(50) + "garbage\n{\"step\": \"x\"}\n{\"step\": 60, \"loss\"");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("metrics.jsonl: skipped 3 malformed lines (lines 15, 16, 17)"),
            std::string::npos)
      << r.err;
}

TEST_F(PlotCli, NoNumericDataIsAnError) {
  write_metrics("{\"step\":1,\"split\":\"train\",\"loss\":null}\nnonsense\n");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("metrics.jsonl: no numeric metrics"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_ / "curves.svg"));
}

TEST_F(PlotCli, BadFlags) {
  write_metrics(metrics(20));
  Result r = plot(run_.string() + " --out " + (dir_ / "x.jpg").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(".svg, .png or .pdf"), std::string::npos) << r.err;
  r = plot(run_.string() + " --out " + (dir_ / "x.png").string() + " --format pdf");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("does not match --format pdf"), std::string::npos) << r.err;
  r = plot(run_.string() + " --smooth 1.5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--smooth"), std::string::npos) << r.err;
  r = plot(run_.string() + " --format gif");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--format gif"), std::string::npos) << r.err;
  // An empty --metrics list takes no option after it for a key, nor the --out after it for a run.
  r = plot(run_.string() + " --metrics , --out " + (dir_ / "m.png").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--metrics: '--out' is an option, not a metric key"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "m.png"));
}

// A diverged run (every loss null, the lr still logged): its missing loss curve is said.
TEST_F(PlotCli, ADivergedRunsMissingLossIsSaid) {
  write_metrics(
      "{\"step\":1,\"split\":\"train\",\"loss\":null,\"lr\":0.1}\n"
      "{\"step\":2,\"split\":\"train\",\"loss\":null,\"lr\":0.1}\n");
  Result r = plot(run_.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("no row's loss is finite (the run diverged?)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace slipstream::plot::test
