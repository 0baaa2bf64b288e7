#include "tools/slipstream/plot_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace slipstream::plot {

namespace {

constexpr std::string_view kBaseline = "baseline/";

// Matplotlib's tab10: distinguishable, and readable on white.
constexpr Rgb kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                            {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                            {188, 189, 34},  {23, 190, 207}};
constexpr Rgb kInk{40, 40, 40};
constexpr Rgb kAxis{110, 110, 110};
constexpr Rgb kGrid{228, 228, 228};

bool matches(const std::string& pattern, const std::string& key) {
  if (!pattern.empty() && pattern.back() == '*')
    return key.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  return key == pattern;
}

bool is_baseline(const std::string& key) {
  return key.rfind(kBaseline, 0) == 0;
}
std::string base_of(const std::string& key) {
  return is_baseline(key) ? key.substr(kBaseline.size()) : key;
}

// Which panel a metric belongs to; also the panel's y-axis label.
std::string panel_of(const std::string& key) {
  std::string b = base_of(key);
  if (b.rfind("acc", 0) == 0) return "accuracy";
  if (b == "lr") return "learning rate";
  if (b == "loss" || b == "nll" || b.rfind("loss/", 0) == 0 || b.rfind("nll/", 0) == 0)
    return "loss";
  return b;
}

int panel_rank(const std::string& title) {
  if (title == "loss") return 0;
  if (title == "accuracy") return 1;
  if (title == "learning rate") return 3;
  return 2;
}

Rgb lighter(Rgb c) {
  auto mix = [](uint8_t v) { return static_cast<uint8_t>(v + (255 - v) * 0.5); };
  return {mix(c.r), mix(c.g), mix(c.b)};
}

// Keys with at least one finite value.
std::set<std::string> available(const MetricsLog& log) {
  std::set<std::string> keys;
  for (const auto& r : log.rows)
    for (const auto& [k, v] : r.values)
      if (std::isfinite(v)) keys.insert(k);
  return keys;
}

std::vector<std::string> select_keys(const std::set<std::string>& have,
                                     const std::vector<std::string>& wanted) {
  static const std::vector<std::string> kDefault = {"loss", "nll", "acc/*", "lr"};
  const auto& patterns = wanted.empty() ? kDefault : wanted;
  std::vector<std::string> out;
  auto add = [&](const std::string& k) {
    if (have.count(k) && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  };
  for (const auto& p : patterns) {
    for (const auto& k : have) {
      // "acc/*" means the heads themselves; their baselines follow each head.
      if (!matches(p, k) || (is_baseline(k) && !is_baseline(p))) continue;
      add(k);
      add(std::string(kBaseline) + k);
    }
  }
  return out;
}

// (step, value) of one metric in one split, by step; a resumed run appends rows for steps
// it already logged, and the later row wins.
std::vector<Point> collect(const MetricsLog& log, const std::string& key,
                           const std::string& split) {
  std::vector<std::pair<int64_t, double>> pts;
  for (const auto& r : log.rows) {
    if (r.split != split) continue;
    auto it = r.values.find(key);
    if (it != r.values.end()) pts.emplace_back(r.step, it->second);
  }
  std::stable_sort(pts.begin(), pts.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Point> out;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (i + 1 < pts.size() && pts[i + 1].first == pts[i].first) continue;
    out.push_back({static_cast<double>(pts[i].first), pts[i].second});
  }
  return out;
}

std::string split_label(const std::string& split) {
  if (split == "validation") return "val";
  return split;
}

}  // namespace

std::vector<std::string> unmatched_metrics(const MetricsLog& log,
                                           const std::vector<std::string>& wanted) {
  std::set<std::string> have = available(log);
  std::vector<std::string> out;
  for (const auto& p : wanted)
    if (std::none_of(have.begin(), have.end(), [&](const auto& k) { return matches(p, k); }))
      out.push_back(p);
  return out;
}

Chart build_chart(const MetricsLog& log, const std::vector<std::string>& wanted,
                  const std::string& title) {
  std::set<std::string> have = available(log);
  if (have.empty()) throw PlotError("no numeric metrics to plot");
  std::vector<std::string> keys = select_keys(have, wanted);
  if (keys.empty()) {
    std::string list;
    for (const auto& k : have) list += (list.empty() ? "" : ", ") + k;
    throw PlotError("none of the requested metrics has data; available: " + list);
  }
  std::vector<std::string> splits;
  for (const auto& r : log.rows)
    if (std::find(splits.begin(), splits.end(), r.split) == splits.end()) splits.push_back(r.split);
  // Training first so the validation curves are drawn on top of the noisier training ones.
  std::stable_sort(splits.begin(), splits.end(), [](const auto& a, const auto& b) {
    return (a == "train"        ? 0
            : a == "validation" ? 1
                                : 2) < (b == "train"        ? 0
                                        : b == "validation" ? 1
                                                            : 2);
  });

  Chart chart;
  chart.title = title;
  std::map<std::string, std::map<std::string, Rgb>> colors;  // panel -> base metric -> colour
  for (const auto& key : keys) {
    std::string pt = panel_of(key);
    auto pit = std::find_if(chart.panels.begin(), chart.panels.end(),
                            [&](const Panel& p) { return p.title == pt; });
    if (pit == chart.panels.end()) {
      chart.panels.push_back({pt, {}});
      pit = chart.panels.end() - 1;
    }
    auto& pc = colors[pt];
    std::string base = base_of(key);
    if (!pc.count(base)) pc[base] = kPalette[pc.size() % std::size(kPalette)];
    // Lighter training curves only make sense next to a validation curve of the same metric.
    bool has_val = std::any_of(log.rows.begin(), log.rows.end(), [&](const MetricRow& r) {
      auto it = r.values.find(key);
      return r.split != "train" && it != r.values.end() && std::isfinite(it->second);
    });
    for (const auto& split : splits) {
      Series s;
      s.metric = key;
      s.split = split;
      s.points = collect(log, key, split);
      size_t finite = std::count_if(s.points.begin(), s.points.end(),
                                    [](const Point& p) { return std::isfinite(p.y); });
      if (finite == 0) continue;
      bool train = split == "train";
      s.color = train && has_val ? lighter(pc[base]) : pc[base];
      s.dashed = is_baseline(key);
      s.width = train || s.dashed ? 1.5 : 2;
      s.markers = !train && !s.dashed && finite <= 40;
      s.label = s.dashed ? "baseline " + base + (split == "validation" ? "" : " (" + split + ")")
                         : split_label(split) + " " + key;
      pit->series.push_back(std::move(s));
    }
  }
  std::stable_sort(chart.panels.begin(), chart.panels.end(), [](const Panel& a, const Panel& b) {
    return panel_rank(a.title) < panel_rank(b.title);
  });
  return chart;
}

Ticks nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    double pad = lo != 0 ? std::abs(lo) * 0.1 : 1;
    lo -= pad, hi += pad;
  }
  double raw = (hi - lo) / std::max(1, target);
  double mag = std::pow(10, std::floor(std::log10(raw)));
  double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  Ticks t;
  t.step = step;
  double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  t.lo = first * step;
  t.hi = last * step;
  for (double i = first; i <= last + 0.5; ++i) {
    double v = i * step;
    t.values.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  }
  return t;
}

std::string format_tick(double v, double step) {
  if (v == 0) return "0";
  char buf[48];
  // Digits the step needs, and more if this value needs them (a 2.5 step at 12.5).
  auto decimals = [](double s, double x) {
    int d = std::max(0, static_cast<int>(-std::floor(std::log10(s) + 1e-9)));
    while (d < 6 && std::abs(x * std::pow(10, d) - std::round(x * std::pow(10, d))) > 1e-6) ++d;
    return d;
  };
  double a = std::abs(v);
  if (step >= 1000 && a >= 1000) {
    double unit = a >= 1e6 && step >= 1e5 ? 1e6 : 1e3;
    std::snprintf(buf, sizeof buf, "%.*f%s", decimals(step / unit, v / unit), v / unit,
                  unit == 1e6 ? "M" : "k");
  } else if (step < 1e-3) {
    int e = static_cast<int>(std::floor(std::log10(a) + 1e-9));
    int d = std::max(0, e - static_cast<int>(std::floor(std::log10(step) + 1e-9)));
    std::snprintf(buf, sizeof buf, "%.*f", d, v / std::pow(10, e));
    std::string m = buf;
    // "1.0e-4" next to "5e-5" reads as more precision than there is.
    if (m.find('.') != std::string::npos) {
      m.erase(m.find_last_not_of('0') + 1);
      if (m.back() == '.') m.pop_back();
    }
    return m + "e" + std::to_string(e);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", decimals(step, v), v);
  }
  return buf;
}

int default_height(size_t panels) {
  return 44 + 30 + static_cast<int>(panels) * 250;
}

namespace {

// Pixel centre of the nearest pixel, so 1 px rules stay crisp in both backends.
double crisp(double v) {
  return std::floor(v) + 0.5;
}

struct Axis {
  double lo, hi;    // data range shown
  double px0, px1;  // its pixel positions
  Ticks t;          // only the ticks inside [lo, hi] are drawn
  double map(double v) const { return px0 + (v - lo) / (hi - lo) * (px1 - px0); }
  std::vector<double> visible() const {
    std::vector<double> out;
    double eps = (hi - lo) * 1e-9;
    for (double v : t.values)
      if (v >= lo - eps && v <= hi + eps) out.push_back(v);
    return out;
  }
};

// The range of the y values, padded so curves and baselines never sit on the frame.
Axis y_axis(const Panel& p, int target) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : p.series)
    for (const auto& pt : s.points)
      if (std::isfinite(pt.y)) lo = std::min(lo, pt.y), hi = std::max(hi, pt.y);
  double pad = hi > lo ? (hi - lo) * 0.05 : lo != 0 ? std::abs(lo) * 0.1 : 1;
  // A quantity that cannot go negative (loss, lr, accuracy) keeps 0 as its floor.
  double floor = lo >= 0 ? 0 : -INFINITY;
  lo = std::max(floor, lo - pad), hi += pad;
  return {lo, hi, 0, 0, nice_ticks(lo, hi, target)};
}

void draw_series(const Series& s, const Axis& ax, const Axis& ay, Surface& out) {
  out.begin_series(s.label);
  Stroke st{s.color, s.width, s.dashed};
  std::vector<Point> run;
  auto flush = [&] {
    if (run.size() >= 2) out.polyline(run, st);
    run.clear();
  };
  for (const auto& p : s.points) {
    if (!std::isfinite(p.y)) {
      flush();
      continue;
    }
    run.push_back({ax.map(p.x), ay.map(p.y)});
    // A lone point between gaps would otherwise vanish.
    if (s.points.size() == 1 || s.markers) out.dot(run.back(), s.markers ? 2.5 : 2, s.color);
  }
  flush();
  out.end_series();
}

void draw_legend(const Panel& p, double x, double y0, double height, Surface& out) {
  constexpr double kRow = 16;
  size_t fit = static_cast<size_t>(std::max(1.0, height / kRow));
  size_t shown = p.series.size() <= fit ? p.series.size() : fit - 1;
  double y = y0 + 8;
  for (size_t i = 0; i < shown; ++i, y += kRow) {
    const Series& s = p.series[i];
    out.polyline({{x, y}, {x + 22, y}}, {s.color, s.width, s.dashed});
    if (s.markers) out.dot({x + 11, y}, 2.5, s.color);
    out.text({x + 28, y}, s.label, {11, kInk});
  }
  if (shown < p.series.size()) {
    // Appended piecewise: prepending to a std::string trips GCC 12's bogus -Wrestrict.
    std::string more = "+";
    more += std::to_string(p.series.size() - shown);
    more += " more";
    out.text({x + 28, y}, more, {11, kAxis});
  }
}

}  // namespace

void render_chart(const Chart& chart, Surface& out, int width, int height) {
  const double W = width, H = height;
  out.fill_rect({0, 0, W, H}, {255, 255, 255});
  const double top = 44, bottom = 30;
  const size_t n = std::max<size_t>(1, chart.panels.size());
  const double ph = (H - top - bottom) / static_cast<double>(n);

  double legend_w = 0;
  double xmin = INFINITY, xmax = -INFINITY;
  for (const auto& p : chart.panels)
    for (const auto& s : p.series) {
      legend_w = std::max(legend_w, out.text_width(s.label, 11));
      for (const auto& pt : s.points) xmin = std::min(xmin, pt.x), xmax = std::max(xmax, pt.x);
    }
  legend_w = std::min(std::max(legend_w + 40, 110.0), W * 0.35);

  // y axes first: the widest tick label sets the left margin, shared so the panels align.
  std::vector<Axis> yaxes;
  double label_w = 0;
  for (const auto& p : chart.panels) {
    yaxes.push_back(y_axis(p, std::max(2, static_cast<int>((ph - 30) / 35))));
    for (double v : yaxes.back().visible())
      label_w = std::max(label_w, out.text_width(format_tick(v, yaxes.back().t.step), 11));
  }
  const double left = std::ceil(label_w) + 34, right = legend_w + 12;
  const double pw = W - left - right;

  out.text({W / 2, 20}, chart.title, {16, kInk, Anchor::middle, true});
  if (!(xmax > xmin)) xmin -= 1, xmax += 1;  // a single step still gets a width
  Axis ax{xmin, xmax, left, left + pw,
          nice_ticks(xmin, xmax, std::max(2, static_cast<int>(pw / 90)))};

  for (size_t i = 0; i < chart.panels.size(); ++i) {
    const Panel& p = chart.panels[i];
    const Rect plot{left, top + ph * static_cast<double>(i) + 6, pw, ph - 6 - 26};
    Axis ay = yaxes[i];
    ay.px0 = plot.y + plot.h, ay.px1 = plot.y;

    for (double v : ay.visible()) {
      double y = crisp(ay.map(v));
      out.polyline({{plot.x, y}, {plot.x + plot.w, y}}, {kGrid, 1});
      out.polyline({{plot.x - 4, y}, {plot.x, y}}, {kAxis, 1});
      out.text({plot.x - 7, y}, format_tick(v, ay.t.step), {11, kInk, Anchor::end});
    }
    for (double v : ax.visible()) {
      double x = crisp(ax.map(v));
      out.polyline({{x, plot.y}, {x, plot.y + plot.h}}, {kGrid, 1});
      out.polyline({{x, plot.y + plot.h}, {x, plot.y + plot.h + 4}}, {kAxis, 1});
      out.text({x, plot.y + plot.h + 13}, format_tick(v, ax.t.step), {11, kInk, Anchor::middle});
    }
    double x0 = crisp(plot.x), y0 = crisp(plot.y);
    double x1 = crisp(plot.x + plot.w), y1 = crisp(plot.y + plot.h);
    out.polyline({{x0, y0}, {x1, y0}, {x1, y1}, {x0, y1}, {x0, y0}}, {kAxis, 1});
    out.text({12, plot.y + plot.h / 2}, p.title, {12, kInk, Anchor::middle, true, true});

    // A little slack so curves that touch the axis range are not cut in half.
    out.push_clip({plot.x - 3, plot.y - 3, plot.w + 6, plot.h + 6});
    for (const auto& s : p.series) draw_series(s, ax, ay, out);
    out.pop_clip();
    draw_legend(p, plot.x + plot.w + 14, plot.y, plot.h, out);
  }
  out.text({left + pw / 2, H - 12}, "step", {12, kInk, Anchor::middle, true});
}

}  // namespace slipstream::plot
