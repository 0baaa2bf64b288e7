// `slipstream plot` internals: metrics parsing, the chart model, ticks and smoothing, and the
// cairo drawing, read back through cairo's own PNG loader and checked pixel by pixel.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tools/slipstream/plot_chart.h"
#include "tools/slipstream/plot_render.h"

namespace fs = std::filesystem;

namespace slipstream::plot {
namespace {

// Train rows every 10 steps (loss null at step 100), validation rows every 50 with baselines,
// and three malformed lines (plus a blank one, which is not counted).
std::string synthetic_metrics() {
  std::ostringstream s;
  for (int step = 0; step <= 200; step += 10) {
    double loss = 3.0 * std::exp(-step / 80.0) + 0.5;
    s << R"({"step":)" << step << R"(,"split":"train","time":1700000000.5,"loss":)"
      << (step == 100 ? std::string("null") : std::to_string(loss)) << R"(,"nll":)"
      << (step == 100 ? std::string("null") : std::to_string(loss)) << R"(,"lr":)"
      << 3e-4 * std::min(1.0, step / 50.0) << R"(,"acc/buttons":)" << 0.5 + step / 500.0
      << R"(,"acc/main_x":)" << 0.3 + step / 700.0 << R"(,"acc/main_y":)" << 0.2 + step / 900.0
      << R"(,"grad_norm":1.5,"samples_per_s":900})"
      << "\n";
    if (step == 60) s << "not json at all\n\n{\"split\":\"train\"}\n";
    if (step > 0 && step % 50 == 0)
      s << R"({"step":)" << step << R"(,"split":"validation","loss":)" << loss + 0.2 << R"(,"nll":)"
        << loss + 0.2 << R"(,"acc/buttons":)" << 0.45 + step / 500.0 << R"(,"acc/main_x":)"
        << 0.28 + step / 700.0 << R"(,"acc/main_y":)" << 0.18 + step / 900.0
        << R"(,"baseline/loss":3.4,"baseline/acc/buttons":0.4})"
        << "\n";
  }
  s << R"({"step": 210, "split": "train", "loss")";  // truncated by a crash
  return s.str();
}

MetricsLog parse(const std::string& text) {
  std::istringstream in(text);
  return parse_metrics(in);
}

std::vector<plot::Run> sample_runs() {
  return {{"demo-run", parse(synthetic_metrics())}};
}

const Axes* find_axes(const Figure& f, const std::string& metric) {
  for (const auto& sec : f.sections)
    for (const auto& row : sec.rows)
      for (const auto& ax : row)
        if (ax.metric == metric) return &ax;
  return nullptr;
}

const Series* find_series(const Axes& ax, Style style, size_t run = 0) {
  for (const auto& s : ax.series)
    if (s.style == style && s.run == run) return &s;
  return nullptr;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("plot_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// A PNG read back with cairo's own loader.
struct Image {
  int width = 0, height = 0;
  std::vector<uint32_t> px;  // 0x00RRGGBB
  explicit Image(const fs::path& file) {
    cairo_surface_t* s = cairo_image_surface_create_from_png(file.string().c_str());
    if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
      cairo_surface_flush(s);
      width = cairo_image_surface_get_width(s);
      height = cairo_image_surface_get_height(s);
      int stride = cairo_image_surface_get_stride(s);
      const unsigned char* data = cairo_image_surface_get_data(s);
      for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x)
          px.push_back(reinterpret_cast<const uint32_t*>(data + y * stride)[x] & 0xFFFFFF);
    }
    cairo_surface_destroy(s);
  }
  uint32_t at(int x, int y) const { return px[static_cast<size_t>(y) * width + x]; }
  // `c` drawn over white with at least half coverage: antialiasing blends a line's edge pixels
  // (and a thin line's every pixel) with the background.
  bool near(int x, int y, Rgb c) const {
    uint32_t p = at(x, y);
    double got[3] = {static_cast<double>((p >> 16) & 255), static_cast<double>((p >> 8) & 255),
                     static_cast<double>(p & 255)};
    double want[3] = {c.r * 255, c.g * 255, c.b * 255};
    // Least-squares coverage a in got = 255 - a * (255 - want), then how far off that blend is.
    double num = 0, den = 0;
    for (int i = 0; i < 3; ++i)
      num += (255 - got[i]) * (255 - want[i]), den += std::pow(255 - want[i], 2);
    double a = num / den, err = 0;
    for (int i = 0; i < 3; ++i) err = std::max(err, std::abs(255 - a * (255 - want[i]) - got[i]));
    return a >= 0.5 && a <= 1.1 && err <= 14;
  }
  size_t count(const Rect& r, Rgb c) const {
    size_t n = 0;
    for (int y = static_cast<int>(r.y); y < static_cast<int>(r.y + r.h); ++y)
      for (int x = static_cast<int>(r.x); x < static_cast<int>(r.x + r.w); ++x) n += near(x, y, c);
    return n;
  }
  // Mean row of the pixels in column x (inside [y0, y1)) that have colour c; -1 when none.
  double row_of(int x, int y0, int y1, Rgb c) const {
    double sum = 0;
    int n = 0;
    for (int y = y0; y < y1; ++y)
      if (near(x, y, c)) sum += y, ++n;
    return n ? sum / n : -1;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(PlotMetrics, ParsesRowsAndCountsMalformedLines) {
  MetricsLog log = parse(synthetic_metrics());
  EXPECT_EQ(log.skipped, 3u);
  ASSERT_EQ(log.rows.size(), 21u + 4u);
  // Line 8 is train step 60; after it come the garbage line, a blank and a row with no step.
  EXPECT_EQ(log.bad_lines, (std::vector<size_t>{9, 11, 29}));
  EXPECT_EQ(log.first_bad, "not json at all");
  EXPECT_EQ(log.rows[0].split, "train");
  EXPECT_EQ(log.rows[0].values.count("time"), 0u);  // row fields are not metrics
  const MetricRow& r100 = log.rows[11];
  EXPECT_EQ(r100.step, 100);
  ASSERT_EQ(r100.values.count("loss"), 1u);
  EXPECT_TRUE(std::isnan(r100.values.at("loss")));
  EXPECT_EQ(skipped_summary("m.jsonl", log),
            "m.jsonl: skipped 3 malformed lines (lines 9, 11, 29)");
}

TEST(PlotMetrics, MissingEmptyAndCorruptFilesNameTheFile) {
  auto message = [](const fs::path& p) -> std::string {
    try {
      load_metrics(p);
    } catch (const PlotError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message("/nonexistent/run-42/metrics.jsonl").find("/nonexistent/run-42/metrics.jsonl"),
            std::string::npos);
  TempDir dir;
  std::ofstream(dir / "empty.jsonl") << "\n";
  EXPECT_NE(message(dir / "empty.jsonl").find((dir / "empty.jsonl").string() + ": empty"),
            std::string::npos);
  std::ofstream(dir / "bad.jsonl") << "\n\x89PNG garbage\n{\"loss\": 1}\n";
  std::string bad = message(dir / "bad.jsonl");
  EXPECT_NE(bad.find((dir / "bad.jsonl").string() + ":2: not a metrics row"), std::string::npos)
      << bad;
}

TEST(PlotChart, DefaultSections) {
  Figure f = build_figure(sample_runs(), {});
  ASSERT_EQ(f.sections.size(), 3u);
  EXPECT_EQ(f.sections[0].title, "loss");
  EXPECT_EQ(f.sections[1].title, "accuracy");
  EXPECT_EQ(f.sections[2].title, "learning rate");
  EXPECT_EQ(f.title, "demo-run");
  EXPECT_EQ(find_axes(f, "nll"), nullptr);        // identical to loss here: not worth a panel
  EXPECT_EQ(find_axes(f, "grad_norm"), nullptr);  // not in the default set
  const Axes& loss = *find_axes(f, "loss");
  EXPECT_TRUE(loss.log_y);
  ASSERT_NE(find_series(loss, Style::train), nullptr);
  ASSERT_NE(find_series(loss, Style::validation), nullptr);
  ASSERT_NE(find_series(loss, Style::baseline), nullptr);
  EXPECT_EQ(find_series(loss, Style::train_raw), nullptr);         // no smoothing asked for
  EXPECT_EQ(find_series(loss, Style::train)->points.size(), 21u);  // the null stays, as a gap
  EXPECT_EQ(find_series(loss, Style::validation)->points.size(), 4u);
  EXPECT_EQ(find_series(loss, Style::validation)->split, "validation");
  // Drawing order: baseline under training under validation.
  EXPECT_EQ(loss.series.front().style, Style::baseline);
  EXPECT_EQ(loss.series.back().style, Style::validation);
  EXPECT_FALSE(find_axes(f, "lr")->log_y);
  EXPECT_FALSE(find_axes(f, "acc/buttons")->log_y);
  EXPECT_EQ(f.styles, (std::vector<Style>{Style::train, Style::validation, Style::baseline}));
}

TEST(PlotChart, NllKeptWhenItDiffersFromLoss) {
  plot::Run r{"r", parse(R"({"step":1,"loss":3,"nll":2.5})"
                         "\n"
                         R"({"step":2,"loss":2,"nll":1.5})")};
  Figure f = build_figure({r}, {});
  ASSERT_EQ(f.sections.size(), 1u);
  ASSERT_EQ(f.sections[0].rows.size(), 1u);
  EXPECT_EQ(f.sections[0].rows[0].size(), 2u);  // loss and nll side by side
  EXPECT_NE(find_axes(f, "nll"), nullptr);
}

TEST(PlotChart, HeadsAreGroupedIntoRows) {
  std::string row = R"({"step":1,"split":"validation")";
  for (const char* head : {"buttons", "c_x", "c_y", "main_x", "main_y", "shoulder"})
    row += std::string(",\"acc/") + head + "\":0.5";
  Figure f = build_figure({{"r", parse(row + "}")}}, {{"acc/*"}, true, 0});
  ASSERT_EQ(f.sections.size(), 1u);
  const Section& acc = f.sections[0];
  EXPECT_EQ(acc.columns, 2u);
  std::vector<std::vector<std::string>> titles;
  for (const auto& r : acc.rows) {
    titles.emplace_back();
    for (const auto& ax : r) titles.back().push_back(ax.title);
  }
  EXPECT_EQ(titles, (std::vector<std::vector<std::string>>{
                        {"buttons", "shoulder"}, {"c_x", "c_y"}, {"main_x", "main_y"}}));
}

TEST(PlotChart, OptionsLinearSmoothAndChosenMetrics) {
  Figure lin = build_figure(sample_runs(), {{"loss"}, false, 0});
  EXPECT_FALSE(find_axes(lin, "loss")->log_y);
  Figure sm = build_figure(sample_runs(), {{"loss", "lr"}, true, 0.6});
  EXPECT_EQ(find_series(*find_axes(sm, "lr"), Style::train_raw), nullptr);  // not noise
  const Axes& loss = *find_axes(sm, "loss");
  ASSERT_NE(find_series(loss, Style::train_raw), nullptr);
  EXPECT_NE(find_series(loss, Style::train)->points[5].y,
            find_series(loss, Style::train_raw)->points[5].y);
  EXPECT_EQ(find_series(loss, Style::validation)->points[0].y,  // validation is never smoothed
            find_series(*find_axes(lin, "loss"), Style::validation)->points[0].y);

  Figure c = build_figure(sample_runs(), {{"acc/*", "grad_norm", "nll"}, true, 0});
  ASSERT_EQ(c.sections.size(), 3u);
  EXPECT_EQ(c.sections[0].title, "loss");  // nll asked for by name
  EXPECT_EQ(c.sections[1].title, "accuracy");
  EXPECT_EQ(c.sections[2].title, "grad_norm");
  EXPECT_NE(find_series(*find_axes(c, "acc/buttons"), Style::baseline), nullptr);
  EXPECT_EQ(unmatched_metrics(sample_runs(), {"loss", "ppl"}), std::vector<std::string>{"ppl"});
  EXPECT_THROW(build_figure(sample_runs(), {{"ppl"}, true, 0}), PlotError);
}

TEST(PlotChart, LogFallsBackToLinearForNonPositiveValues) {
  Figure f =
      build_figure({{"r", parse("{\"step\":1,\"loss\":-0.5}\n{\"step\":2,\"loss\":1}")}}, {});
  EXPECT_FALSE(find_axes(f, "loss")->log_y);
}

TEST(PlotChart, NoNumericDataIsAnError) {
  MetricsLog log = parse(R"({"step":1,"split":"train","loss":null})"
                         "\n"
                         R"({"step":2,"split":"train","time":5})");
  EXPECT_EQ(log.rows.size(), 2u);
  EXPECT_THROW(build_figure({{"r", log}}, {}), PlotError);
}

TEST(PlotChart, SeveralRunsKeepTheirIndex) {
  Figure f = build_figure({{"a", parse(synthetic_metrics())}, {"b", parse(synthetic_metrics())}},
                          {{"loss"}, true, 0});
  EXPECT_EQ(f.runs, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.title, "");  // the renderer names the runs
  const Axes& loss = *find_axes(f, "loss");
  EXPECT_NE(find_series(loss, Style::train, 0), nullptr);
  EXPECT_NE(find_series(loss, Style::train, 1), nullptr);
  EXPECT_NE(find_series(loss, Style::validation, 1), nullptr);
}

TEST(PlotSmooth, MatchesTensorBoard) {
  std::vector<Point> pts = {{0, 0}, {1, 1}, {2, NAN}, {3, 1}};
  auto s = smooth_ema(pts, 0.5);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_DOUBLE_EQ(s[0].y, 0);  // debiased: starts at the first value, not pulled to 0
  EXPECT_DOUBLE_EQ(s[1].y, 0.5 / 0.75);
  EXPECT_TRUE(std::isnan(s[2].y));
  EXPECT_DOUBLE_EQ(s[3].y, 0.75 / 0.875);
  auto flat = smooth_ema({{0, 4}, {1, 4}, {2, 4}}, 0.9);
  for (const auto& p : flat) EXPECT_NEAR(p.y, 4, 1e-12);
  EXPECT_EQ(smooth_ema(pts, 0)[1].y, 1);
}

TEST(PlotTicks, NiceStepsAndLabels) {
  Ticks t = nice_ticks(0.03, 0.97, 5);
  EXPECT_DOUBLE_EQ(t.step, 0.2);
  EXPECT_DOUBLE_EQ(t.lo, 0);
  EXPECT_DOUBLE_EQ(t.hi, 1);
  EXPECT_EQ(t.values.size(), 6u);
  Ticks flat = nice_ticks(2, 2, 4);  // a single value still gets a range
  EXPECT_LT(flat.lo, 2);
  EXPECT_GT(flat.hi, 2);
  // A smoothed constant differs from itself in the last bits; that is a flat line too.
  Ticks fuzz = nice_ticks(0.001, std::nextafter(0.001, 1.0), 5);
  EXPECT_LT(fuzz.values.size(), 10u);
  EXPECT_LT(fuzz.lo, 0.001);
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(0.4, 0.2), "0.4");
  EXPECT_EQ(format_tick(20000, 5000), "20k");
  EXPECT_EQ(format_tick(12500, 2500), "12.5k");
  EXPECT_EQ(format_tick(3e-4, 1e-4), "3e-4");
  EXPECT_EQ(format_tick(1.5e-4, 5e-5), "1.5e-4");
  EXPECT_EQ(format_tick(150, 50), "150");
  EXPECT_EQ(format_tick(0, 0.1), "0");
}

TEST(PlotTicks, LogDecadesAndMinorTicks) {
  LogTicks wide = log_ticks(0.85, 120);
  ASSERT_EQ(wide.major.size(), 3u);
  EXPECT_DOUBLE_EQ(wide.major[0], 1);
  EXPECT_DOUBLE_EQ(wide.major[1], 10);
  EXPECT_DOUBLE_EQ(wide.major[2], 100);
  EXPECT_EQ(wide.minor.size(), 1u + 8u + 8u);  // 0.9, 2..9, 20..90
  // About one decade: 10 alone is too few labels, so 3 and 5 are labelled as well.
  LogTicks narrow = log_ticks(2.5, 19);
  std::vector<std::string> labels;
  for (double v : narrow.major) labels.push_back(format_log_tick(v));
  EXPECT_EQ(labels, (std::vector<std::string>{"3", "5", "10"}));
  // Two decades on a short axis: 2 and 5 as well would crowd it.
  EXPECT_EQ(log_ticks(0.015, 2.5, 5).major, (std::vector<double>{0.1, 1}));
  EXPECT_EQ(log_ticks(0.015, 2.5, 8).major.size(), 7u);
  // Twenty decades: every few labelled, the rest minor ticks.
  LogTicks huge = log_ticks(1e-10, 1e10);
  EXPECT_LE(huge.major.size(), 8u);
  EXPECT_GE(huge.major.size(), 4u);
  EXPECT_FALSE(log_ticks(3.1, 3.2).major.empty());  // narrower than any 1..9 step
  EXPECT_EQ(format_log_tick(0.01), "0.01");
  EXPECT_EQ(format_log_tick(3e-5), "3e-5");
  EXPECT_EQ(format_log_tick(1e6), "1e6");
  EXPECT_EQ(format_log_tick(20), "20");
}

TEST(PlotRender, FormatsFromNames) {
  EXPECT_EQ(format_of("a/curves.PNG"), Format::png);
  EXPECT_EQ(format_of("x.svg"), Format::svg);
  EXPECT_EQ(format_of("x.pdf"), Format::pdf);
  EXPECT_EQ(format_of("x.jpg"), std::nullopt);
  EXPECT_EQ(format_of("pdf"), std::nullopt);
  EXPECT_EQ(parse_format("PDF"), Format::pdf);
}

bool overlaps(const Rect& a, const Rect& b) {
  return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}

TEST(PlotRender, PngHasEveryPanelWithCurvesAndAClearLegend) {
  TempDir dir;
  Figure f = build_figure(sample_runs(), {});
  const int W = 900, H = default_height(f, W);
  Layout layout = write_figure(f, dir / "c.png", Format::png, W, H);
  Image img(dir / "c.png");
  ASSERT_EQ(img.width, W);
  ASSERT_EQ(img.height, H);
  // loss; buttons alone, main_x beside main_y; lr.
  std::vector<std::string> metrics;
  for (const auto& b : layout.axes) metrics.push_back(b.metric);
  EXPECT_EQ(metrics,
            (std::vector<std::string>{"loss", "acc/buttons", "acc/main_x", "acc/main_y", "lr"}));
  Rgb blue = run_color(0);
  for (size_t i = 0; i < layout.axes.size(); ++i) {
    const Rect& p = layout.axes[i].plot;
    EXPECT_GE(p.x, 0);
    EXPECT_LE(p.x + p.w, W);
    EXPECT_LE(p.y + p.h, H);
    EXPECT_FALSE(overlaps(p, layout.legend)) << metrics[i];
    for (size_t j = 0; j < i; ++j)
      EXPECT_FALSE(overlaps(p, layout.axes[j].plot)) << metrics[i] << " " << metrics[j];
    EXPECT_GT(img.count(p, blue), 40u) << metrics[i];  // the run's curves are drawn in there
  }
  // Nothing of the run's colour spills left of the first plot, where the tick labels are.
  const Rect& loss = layout.axes[0].plot;
  EXPECT_EQ(img.count({0, loss.y, loss.x - 6, loss.h}, blue), 0u);
  // A validation marker sits on the loss at step 150.
  const AxesBox& lb = layout.axes[0];
  double val150 = 3.0 * std::exp(-150 / 80.0) + 0.5 + 0.2;
  EXPECT_TRUE(img.near(static_cast<int>(lb.px(150)), static_cast<int>(lb.py(val150)), blue));
}

// Loss 1 for steps 0-90, 10 for 100-190, 100 for 200-300: three flat lines.
std::vector<plot::Run> plateaus() {
  std::string text;
  for (int step = 0; step <= 300; step += 10) {
    double v = step < 100 ? 1 : step < 200 ? 10 : 100;
    text += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(v) + "}\n";
  }
  return {{"plateaus", parse(text)}};
}

TEST(PlotRender, LogAxisPlacesDecadesEvenly) {
  TempDir dir;
  Figure f = build_figure(plateaus(), {});
  Layout layout = write_figure(f, dir / "log.png", Format::png, 600, 400);
  Image img(dir / "log.png");
  ASSERT_EQ(layout.axes.size(), 1u);
  const AxesBox& b = layout.axes[0];
  ASSERT_TRUE(b.log_y);
  int y0 = static_cast<int>(b.plot.y), y1 = static_cast<int>(b.plot.y + b.plot.h);
  double r1 = img.row_of(static_cast<int>(b.px(50)), y0, y1, run_color(0));
  double r10 = img.row_of(static_cast<int>(b.px(150)), y0, y1, run_color(0));
  double r100 = img.row_of(static_cast<int>(b.px(250)), y0, y1, run_color(0));
  ASSERT_GT(r1, 0);
  ASSERT_GT(r10, 0);
  ASSERT_GT(r100, 0);
  EXPECT_NEAR(r1, b.py(1), 1.5);
  EXPECT_NEAR(r100, b.py(100), 1.5);
  // Equal ratios, equal distances: 10 lies halfway between 1 and 100.
  EXPECT_GT(r1 - r10, 40);
  EXPECT_NEAR(r1 - r10, r10 - r100, 2);

  Figure lin = build_figure(plateaus(), {{}, false, 0});
  Layout ll = write_figure(lin, dir / "lin.png", Format::png, 600, 400);
  Image li(dir / "lin.png");
  const AxesBox& lb = ll.axes[0];
  ASSERT_FALSE(lb.log_y);
  y0 = static_cast<int>(lb.plot.y), y1 = static_cast<int>(lb.plot.y + lb.plot.h);
  r1 = li.row_of(static_cast<int>(lb.px(50)), y0, y1, run_color(0));
  r10 = li.row_of(static_cast<int>(lb.px(150)), y0, y1, run_color(0));
  r100 = li.row_of(static_cast<int>(lb.px(250)), y0, y1, run_color(0));
  EXPECT_NEAR((r1 - r10) / (r10 - r100), 9.0 / 90.0, 0.03);
}

TEST(PlotRender, SeveralRunsGetTheirOwnColours) {
  TempDir dir;
  std::vector<plot::Run> runs = {{"a", parse(synthetic_metrics())}, {"b", plateaus()[0].log}};
  Figure f = build_figure(runs, {{"loss"}, true, 0});
  Layout layout = write_figure(f, dir / "two.png", Format::png, 700, 420);
  Image img(dir / "two.png");
  const Rect& p = layout.axes.at(0).plot;
  EXPECT_GT(img.count(p, run_color(0)), 100u);
  EXPECT_GT(img.count(p, run_color(1)), 100u);
  EXPECT_EQ(img.count(p, run_color(2)), 0u);
  // The legend names the runs in their colours, above the plots.
  EXPECT_GT(img.count(layout.legend, run_color(0)), 10u);
  EXPECT_GT(img.count(layout.legend, run_color(1)), 10u);
  EXPECT_LT(layout.legend.y + layout.legend.h, p.y);
}

// Balanced start/end tags with quote-aware scanning: enough XML to catch a broken document.
// Returns the root element's name, or "" with `why` set.
std::string xml_root(const std::string& xml, std::string& why) {
  std::vector<std::string> stack;
  std::string root;
  size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    if (xml.compare(i, 4, "<!--") == 0) {
      i = xml.find("-->", i);
      if (i == std::string::npos) return why = "unterminated comment", "";
      continue;
    }
    size_t end = i + 1;
    char quote = 0;
    for (; end < xml.size() && (quote || xml[end] != '>'); ++end)
      if (xml[end] == '"' || xml[end] == '\'')
        quote = quote == xml[end] ? 0 : quote ? quote : xml[end];
    if (end >= xml.size()) return why = "unterminated tag", "";
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return why = "empty tag", "";
    if (tag.front() == '?' || tag.front() == '!') continue;
    if (tag.front() == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return why = "stray </" + tag, "";
      stack.pop_back();
      continue;
    }
    std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (root.empty())
      root = name;
    else if (stack.empty())
      return why = "second root <" + name, "";
    if (tag.back() != '/') stack.push_back(name);
  }
  if (!stack.empty()) return why = "unclosed <" + stack.back(), "";
  return root;
}

TEST(PlotRender, SvgAndPdfFromTheSameDrawing) {
  TempDir dir;
  Figure f = build_figure(sample_runs(), {});
  const int W = 960, H = default_height(f);
  Layout png = write_figure(f, dir / "c.png", Format::png, W, H);
  Layout svg = write_figure(f, dir / "c.svg", Format::svg, W, H);
  Layout pdf = write_figure(f, dir / "c.pdf", Format::pdf, W, H);
  ASSERT_EQ(svg.axes.size(), png.axes.size());
  for (size_t i = 0; i < png.axes.size(); ++i) {
    EXPECT_NEAR(svg.axes[i].plot.x, png.axes[i].plot.x, 3);  // text widths may differ a hair
    EXPECT_EQ(svg.axes[i].plot.y, png.axes[i].plot.y);
    EXPECT_EQ(pdf.axes[i].plot.y, png.axes[i].plot.y);
  }

  std::string doc = slurp(dir / "c.svg"), why;
  EXPECT_EQ(xml_root(doc, why), "svg") << why;
  EXPECT_NE(doc.find("width=\"960px\""), std::string::npos);
  EXPECT_NE(doc.find("<path"), std::string::npos);

  std::string p = slurp(dir / "c.pdf");
  ASSERT_GT(p.size(), 1000u);
  EXPECT_EQ(p.compare(0, 5, "%PDF-"), 0);
  EXPECT_NE(p.find("%%EOF", p.size() - 8), std::string::npos);
  EXPECT_NE(p.find("/MediaBox [ 0 0 720 "), std::string::npos);  // 960 px at 96 dpi
}

TEST(PlotRender, UnwritableFileIsNamed) {
  Figure f = build_figure(sample_runs(), {});
  for (Format fmt : {Format::png, Format::svg, Format::pdf}) {
    fs::path out = fs::path("/nonexistent-dir") / (std::string("c") + extension(fmt));
    try {
      write_figure(f, out, fmt, 400, 300);
      ADD_FAILURE() << "expected PlotError for " << out;
    } catch (const PlotError& e) {
      EXPECT_NE(std::string(e.what()).find(out.string()), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace slipstream::plot
