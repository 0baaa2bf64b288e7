// `slipstream plot` internals: metrics parsing, the chart model, ticks, the SVG writer, the
// rasteriser and the PNG/zlib encoder (checked against an independent reader and zlib).
#include <cmath>
#include <map>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "png_check.h"
#include "tools/slipstream/plot_chart.h"
#include "tools/slipstream/plot_deflate.h"
#include "tools/slipstream/plot_png.h"
#include "tools/slipstream/plot_raster.h"
#include "tools/slipstream/plot_svg.h"

namespace slipstream::plot {
namespace {

// Train rows every 10 steps (loss null at step 100), validation rows every 50 with a baseline,
// and three malformed lines (plus a blank one, which is not counted).
std::string synthetic_metrics() {
  std::ostringstream s;
  for (int step = 0; step <= 200; step += 10) {
    double loss = 3.0 * std::exp(-step / 80.0) + 0.5;
    s << R"({"step":)" << step << R"(,"split":"train","time":1700000000.5,"loss":)"
      << (step == 100 ? std::string("null") : std::to_string(loss)) << R"(,"lr":)"
      << 3e-4 * std::min(1.0, step / 50.0) << R"(,"acc/buttons":)" << 0.5 + step / 500.0
      << R"(,"acc/stick":)" << 0.3 + step / 700.0 << R"(,"grad_norm":1.5,"samples_per_s":900})"
      << "\n";
    if (step == 60) s << "not json at all\n\n{\"split\":\"train\"}\n";
    if (step > 0 && step % 50 == 0)
      s << R"({"step":)" << step << R"(,"split":"validation","loss":)" << loss + 0.2 << R"(,"nll":)"
        << loss + 0.1 << R"(,"acc/buttons":)" << 0.45 + step / 500.0 << R"(,"acc/stick":)"
        << 0.28 + step / 700.0 << R"(,"baseline/loss":3.4,"baseline/acc/buttons":0.4})"
        << "\n";
  }
  s << R"({"step": 210, "split": "train", "loss")";  // truncated by a crash
  return s.str();
}

MetricsLog sample_log() {
  std::istringstream in(synthetic_metrics());
  return parse_metrics(in);
}

const Series* find_series(const Chart& c, const std::string& label) {
  for (const auto& p : c.panels)
    for (const auto& s : p.series)
      if (s.label == label) return &s;
  return nullptr;
}

TEST(PlotMetrics, ParsesRowsAndCountsMalformedLines) {
  MetricsLog log = sample_log();
  EXPECT_EQ(log.skipped, 3u);
  ASSERT_EQ(log.rows.size(), 21u + 4u);
  EXPECT_EQ(log.rows[0].split, "train");
  EXPECT_EQ(log.rows[0].values.count("time"), 0u);  // row fields are not metrics
  const MetricRow& r100 = log.rows[11];
  EXPECT_EQ(r100.step, 100);
  ASSERT_EQ(r100.values.count("loss"), 1u);
  EXPECT_TRUE(std::isnan(r100.values.at("loss")));
}

TEST(PlotMetrics, MissingFileNamesIt) {
  try {
    load_metrics("/nonexistent/run-42/metrics.jsonl");
    FAIL() << "expected PlotError";
  } catch (const PlotError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/run-42/metrics.jsonl"), std::string::npos);
  }
}

TEST(PlotChart, DefaultPanelsAndSeries) {
  Chart c = build_chart(sample_log(), {}, "demo-run");
  ASSERT_EQ(c.panels.size(), 3u);
  EXPECT_EQ(c.panels[0].title, "loss");
  EXPECT_EQ(c.panels[1].title, "accuracy");
  EXPECT_EQ(c.panels[2].title, "learning rate");
  for (const char* l :
       {"train loss", "val loss", "val nll", "baseline loss", "train acc/buttons",
        "val acc/buttons", "baseline acc/buttons", "train acc/stick", "val acc/stick", "train lr"})
    EXPECT_NE(find_series(c, l), nullptr) << l;
  EXPECT_EQ(find_series(c, "train grad_norm"), nullptr);  // not in the default set
  EXPECT_TRUE(find_series(c, "baseline loss")->dashed);
  EXPECT_FALSE(find_series(c, "val loss")->dashed);
  EXPECT_EQ(find_series(c, "train loss")->points.size(), 21u);  // the null stays, as a gap
  EXPECT_EQ(find_series(c, "val loss")->points.size(), 4u);
  // Training curves are the lighter shade of the validation colour.
  const Series& tb = *find_series(c, "train acc/buttons");
  const Series& vb = *find_series(c, "val acc/buttons");
  EXPECT_GT(tb.color.r + tb.color.g + tb.color.b, vb.color.r + vb.color.g + vb.color.b);
}

TEST(PlotChart, ChosenMetrics) {
  Chart c = build_chart(sample_log(), {"acc/*", "grad_norm"}, "r");
  ASSERT_EQ(c.panels.size(), 2u);
  EXPECT_EQ(c.panels[0].title, "accuracy");
  EXPECT_EQ(c.panels[1].title, "grad_norm");
  EXPECT_NE(find_series(c, "baseline acc/buttons"), nullptr);
  EXPECT_EQ(unmatched_metrics(sample_log(), {"loss", "ppl"}), std::vector<std::string>{"ppl"});
  EXPECT_THROW(build_chart(sample_log(), {"ppl"}, "r"), PlotError);
}

TEST(PlotChart, NoNumericDataIsAnError) {
  std::istringstream in(R"({"step":1,"split":"train","loss":null})"
                        "\n"
                        R"({"step":2,"split":"train","time":5})");
  MetricsLog log = parse_metrics(in);
  EXPECT_EQ(log.rows.size(), 2u);
  EXPECT_THROW(build_chart(log, {}, "r"), PlotError);
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
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(0.4, 0.2), "0.4");
  EXPECT_EQ(format_tick(20000, 5000), "20k");
  EXPECT_EQ(format_tick(12500, 2500), "12.5k");
  EXPECT_EQ(format_tick(3e-4, 1e-4), "3e-4");
  EXPECT_EQ(format_tick(1.5e-4, 5e-5), "1.5e-4");
  EXPECT_EQ(format_tick(150, 50), "150");
  EXPECT_EQ(format_tick(0, 0.1), "0");
}

// Balanced start/end tags and quoted attributes: enough XML to catch a broken writer.
bool well_formed(const std::string& xml, std::string& why) {
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = xml.find('<', i)) != std::string::npos) {
    size_t end = xml.find('>', i);
    if (end == std::string::npos) return why = "unterminated tag", false;
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.front() == '?') continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2) return why = "odd quotes in " + tag, false;
    if (tag.front() == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return why = "stray </" + tag, false;
      stack.pop_back();
      continue;
    }
    if (tag.back() == '/') continue;
    stack.push_back(tag.substr(0, tag.find(' ')));
  }
  if (!stack.empty()) return why = "unclosed <" + stack.back(), false;
  return true;
}

// label -> points per polyline of that series. Plain string scanning: std::regex recurses per
// character and overflows the stack on long documents.
std::map<std::string, std::vector<size_t>> svg_series(const std::string& svg) {
  std::map<std::string, std::vector<size_t>> out;
  const std::string open = "<g class=\"series\" data-label=\"", pts_attr = "points=\"";
  for (size_t g = svg.find(open); g != std::string::npos; g = svg.find(open, g + 1)) {
    size_t label_end = svg.find('"', g + open.size());
    size_t body_end = svg.find("</g>", label_end);
    auto& counts = out[svg.substr(g + open.size(), label_end - g - open.size())];
    for (size_t l = svg.find("<polyline", label_end); l < body_end;
         l = svg.find("<polyline", l + 1)) {
      size_t a = svg.find(pts_attr, l) + pts_attr.size(), b = svg.find('"', a);
      counts.push_back(static_cast<size_t>(std::count(svg.begin() + a, svg.begin() + b, ',')));
    }
  }
  return out;
}

TEST(PlotSvg, SeriesLegendAndAxes) {
  Chart c = build_chart(sample_log(), {}, "demo-run");
  SvgSurface svg(900, default_height(c.panels.size()));
  render_chart(c, svg, 900, default_height(c.panels.size()));
  std::string doc = svg.finish();
  std::string why;
  EXPECT_TRUE(well_formed(doc, why)) << why;
  EXPECT_NE(doc.find("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\""), std::string::npos);

  auto series = svg_series(doc);
  EXPECT_EQ(series["train loss"], (std::vector<size_t>{10, 10}));  // split at the null
  EXPECT_EQ(series["val loss"], std::vector<size_t>{4});
  EXPECT_EQ(series["val nll"], std::vector<size_t>{4});
  EXPECT_EQ(series["baseline loss"], std::vector<size_t>{4});
  EXPECT_EQ(series["train acc/stick"], std::vector<size_t>{21});
  EXPECT_EQ(series["train lr"], std::vector<size_t>{21});
  EXPECT_NE(doc.find("stroke-dasharray"), std::string::npos);
  for (const char* text : {">demo-run</text>", ">step</text>", ">loss</text>", ">accuracy</text>",
                           ">learning rate</text>", ">train loss</text>", ">baseline loss</text>",
                           ">val acc/buttons</text>", ">200</text>", ">3e-4</text>"})
    EXPECT_NE(doc.find(text), std::string::npos) << text;
}

TEST(PlotSvg, EscapesText) {
  EXPECT_EQ(xml_escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
}

TEST(PlotDeflate, KnownChecksums) {
  EXPECT_EQ(crc32("123456789"), 0xCBF43926u);
  EXPECT_EQ(adler32("Wikipedia"), 0x11E60398u);
}

TEST(PlotDeflate, RoundTripsThroughZlib) {
#ifndef PLOT_HAVE_ZLIB
  GTEST_SKIP() << "zlib not found by CMake";
#else
  std::mt19937 rng(7);
  std::vector<std::string> inputs = {"", "a", "ab", "abc", std::string(100000, 'x')};
  std::string noise, text;
  for (int i = 0; i < 70000; ++i) noise += static_cast<char>(rng() & 0xFF);
  for (int i = 0; i < 5000; ++i) text += "step " + std::to_string(i % 37) + " loss ";
  inputs.push_back(noise);
  inputs.push_back(text);
  for (const auto& in : inputs) {
    std::string z = zlib_compress(in), back;
    ASSERT_TRUE(test::reference_inflate(z, back)) << in.size();
    EXPECT_EQ(back, in) << in.size();
  }
  EXPECT_LT(zlib_compress(std::string(100000, 'x')).size(), 2000u);
#endif
}

TEST(PlotPng, EncodesTheRasterisedChart) {
  const int W = 640, H = 480;
  Chart c = build_chart(sample_log(), {}, "demo-run");
  RasterSurface r(W, H);
  render_chart(c, r, W, H);
  std::string bytes = encode_png(W, H, r.rgb());
  test::DecodedPng png = test::read_png(bytes);
  ASSERT_EQ(png.error, "");
  EXPECT_EQ(png.width, W);
  EXPECT_EQ(png.height, H);
  EXPECT_EQ(png.bit_depth, 8);
  EXPECT_EQ(png.color_type, 2);
  EXPECT_EQ(png.chunks, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  if (!png.inflated) GTEST_SKIP() << "zlib not found: pixels not checked";
  EXPECT_EQ(png.raw_size, static_cast<size_t>(W * 3 + 1) * H);
  EXPECT_EQ(png.rgb, r.rgb());
  // The plot area (right of the tick labels, left of the legend) has curves in it.
  size_t inked = 0, val_loss_blue = 0;
  for (int y = 50; y < H - 40; ++y)
    for (int x = 120; x < W / 2; ++x) {
      const uint8_t* p = &png.rgb[(static_cast<size_t>(y) * W + x) * 3];
      if (p[0] != 255 || p[1] != 255 || p[2] != 255) ++inked;
      if (p[0] == 31 && p[1] == 119 && p[2] == 180) ++val_loss_blue;
    }
  EXPECT_GT(inked, 2000u);
  EXPECT_GT(val_loss_blue, 20u);
}

TEST(PlotRaster, TextAndClipping) {
  RasterSurface r(100, 40);
  r.text({10, 20}, "A", {11, {0, 0, 0}});
  // 'A' is five columns wide starting at x=10, seven rows centred on y=20.
  EXPECT_EQ(r.pixel(10, 20), (Rgb{0, 0, 0}));
  EXPECT_EQ(r.pixel(16, 20), (Rgb{255, 255, 255}));
  r.push_clip({50, 0, 50, 40});
  r.polyline({{0, 30.5}, {100, 30.5}}, {{255, 0, 0}, 1});
  r.pop_clip();
  EXPECT_EQ(r.pixel(20, 30), (Rgb{255, 255, 255}));
  EXPECT_EQ(r.pixel(70, 30), (Rgb{255, 0, 0}));
}

}  // namespace
}  // namespace slipstream::plot
