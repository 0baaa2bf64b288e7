#include "tools/slipstream/plot_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace slipstream::plot {

namespace {

constexpr std::string_view kBaseline = "baseline/";

bool matches(const std::string& pattern, const std::string& key) {
  if (!pattern.empty() && pattern.back() == '*')
    return key.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  return key == pattern;
}

bool is_baseline(const std::string& key) {
  return key.rfind(kBaseline, 0) == 0;
}

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool loss_like(const std::string& key) {
  return key == "loss" || key == "nll" || starts_with(key, "loss/") || starts_with(key, "nll/");
}

// Which section a metric belongs to; also the section's y label.
std::string section_of(const std::string& key) {
  if (starts_with(key, "acc")) return "accuracy";
  if (key == "lr") return "learning rate";
  if (loss_like(key)) return "loss";
  return key;
}

int section_rank(const std::string& title) {
  if (title == "loss") return 0;
  if (title == "accuracy") return 1;
  if (title == "learning rate") return 3;
  return 2;
}

// Keys with at least one finite value in some run.
std::set<std::string> available(const std::vector<Run>& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs)
    for (const auto& r : run.log.rows)
      for (const auto& [k, v] : r.values)
        if (std::isfinite(v)) keys.insert(k);
  return keys;
}

// A model without auxiliary losses logs nll == loss; a second identical panel says nothing.
bool nll_is_loss(const std::vector<Run>& runs) {
  for (const auto& run : runs)
    for (const auto& r : run.log.rows) {
      auto n = r.values.find("nll");
      if (n == r.values.end()) continue;
      auto l = r.values.find("loss");
      if (l == r.values.end() ||
          !(l->second == n->second || (std::isnan(l->second) && std::isnan(n->second))))
        return false;
    }
  return true;
}

std::vector<std::string> select_keys(const std::vector<Run>& runs,
                                     const std::set<std::string>& have,
                                     const std::vector<std::string>& wanted) {
  static const std::vector<std::string> kDefault = {"loss", "nll", "acc/*", "lr"};
  bool defaults = wanted.empty();
  const auto& patterns = defaults ? kDefault : wanted;
  bool skip_nll = defaults && nll_is_loss(runs);
  std::vector<std::string> out;
  for (const auto& p : patterns)
    for (const auto& k : have) {
      // "acc/*" means the heads themselves; their baselines join each head's axes.
      if (!matches(p, k) || (is_baseline(k) && !is_baseline(p))) continue;
      if (skip_nll && k == "nll") continue;
      if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
    }
  return out;
}

// (step, value) of one metric in the rows `use` accepts, by step; a resumed run appends rows
// for steps it already logged, and the later row wins.
template <typename Pred>
std::vector<Point> collect(const MetricsLog& log, const std::string& key, Pred use) {
  std::vector<std::pair<int64_t, double>> pts;
  for (const auto& r : log.rows) {
    if (!use(r)) continue;
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

bool any_finite(const std::vector<Point>& pts) {
  return std::any_of(pts.begin(), pts.end(), [](const Point& p) { return std::isfinite(p.y); });
}

// Splits in a stable order: training first, then validation, then the rest by name.
std::vector<std::string> splits_of(const std::vector<Run>& runs) {
  std::set<std::string> seen;
  for (const auto& run : runs)
    for (const auto& r : run.log.rows) seen.insert(r.split);
  std::vector<std::string> out(seen.begin(), seen.end());
  auto rank = [](const std::string& s) { return s == "train" ? 0 : s == "validation" ? 1 : 2; };
  std::stable_sort(out.begin(), out.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  return out;
}

Axes build_axes(const std::vector<Run>& runs, const std::string& key,
                const std::vector<std::string>& splits, const ChartOptions& opt) {
  Axes ax;
  ax.metric = key;
  ax.title = key;
  std::string base_key = std::string(kBaseline) + key;
  for (size_t r = 0; r < runs.size(); ++r) {
    const MetricsLog& log = runs[r].log;
    auto base = collect(log, base_key, [](const MetricRow&) { return true; });
    if (any_finite(base)) ax.series.push_back({r, Style::baseline, "", std::move(base)});
    for (const auto& split : splits) {
      auto pts = collect(log, key, [&](const MetricRow& row) { return row.split == split; });
      if (!any_finite(pts)) continue;
      if (split != "train") {
        ax.series.push_back({r, Style::validation, split, std::move(pts)});
      } else if (opt.smooth > 0 && key != "lr") {  // a schedule is not noise
        auto smoothed = smooth_ema(pts, opt.smooth);
        ax.series.push_back({r, Style::train_raw, split, std::move(pts)});
        ax.series.push_back({r, Style::train, split, std::move(smoothed)});
      } else {
        ax.series.push_back({r, Style::train, split, std::move(pts)});
      }
    }
  }
  // Validation markers on top of the busier training curves, baselines under everything.
  std::stable_sort(ax.series.begin(), ax.series.end(),
                   [](const Series& a, const Series& b) { return a.style < b.style; });
  if (opt.log_loss && loss_like(key)) {
    ax.log_y = true;
    for (const auto& s : ax.series)
      for (const auto& p : s.points)
        if (std::isfinite(p.y) && p.y <= 0) ax.log_y = false;  // no log of 0 or below
  }
  return ax;
}

// "main_x" and "main_y" -> "main"; a head without such a suffix is its own stem.
std::string stem_of(const std::string& head) {
  size_t u = head.rfind('_');
  if (u != std::string::npos && u > 0 && u + 2 == head.size()) return head.substr(0, u);
  return head;
}

// Axes titles without the prefix every key of the section shares, then rows: the heads that
// stand alone packed together first, then one row (or more) per group of related heads.
Section lay_out(std::string title, std::vector<Axes> axes) {
  Section sec;
  sec.title = std::move(title);
  size_t slash = axes.front().metric.find('/');
  std::string prefix = slash == std::string::npos ? "" : axes.front().metric.substr(0, slash + 1);
  bool shared = !prefix.empty() && std::all_of(axes.begin(), axes.end(), [&](const Axes& a) {
    return starts_with(a.metric, prefix) && a.metric.size() > prefix.size();
  });
  if (shared)
    for (auto& a : axes) a.title = a.metric.substr(prefix.size());

  std::vector<std::string> stems;
  std::map<std::string, std::vector<Axes>> groups;
  for (auto& a : axes) {
    std::string s = stem_of(a.title);
    if (!groups.count(s)) stems.push_back(s);
    groups[s].push_back(std::move(a));
  }
  std::vector<Axes> singles;
  std::vector<std::vector<Axes>> pairs;
  size_t widest = 1;
  for (const auto& s : stems) {
    auto& g = groups[s];
    if (g.size() == 1) {
      singles.push_back(std::move(g.front()));
    } else {
      widest = std::max(widest, g.size());
      pairs.push_back(std::move(g));
    }
  }
  sec.columns = std::min<size_t>(4, std::max(widest, std::min<size_t>(singles.size(), 3)));
  auto add_rows = [&](std::vector<Axes>& list) {
    for (size_t i = 0; i < list.size(); i += sec.columns)
      sec.rows.emplace_back(
          std::make_move_iterator(list.begin() + i),
          std::make_move_iterator(list.begin() + std::min(list.size(), i + sec.columns)));
  };
  add_rows(singles);
  for (auto& g : pairs) add_rows(g);
  return sec;
}

}  // namespace

std::vector<std::string> unmatched_metrics(const std::vector<Run>& runs,
                                           const std::vector<std::string>& wanted) {
  std::set<std::string> have = available(runs);
  std::vector<std::string> out;
  for (const auto& p : wanted)
    if (std::none_of(have.begin(), have.end(), [&](const auto& k) { return matches(p, k); }))
      out.push_back(p);
  return out;
}

std::vector<Point> smooth_ema(const std::vector<Point>& pts, double weight) {
  std::vector<Point> out;
  out.reserve(pts.size());
  double last = 0;
  int n = 0;
  for (const auto& p : pts) {
    if (!std::isfinite(p.y)) {
      out.push_back(p);
      continue;
    }
    last = last * weight + (1 - weight) * p.y;
    ++n;
    double debias = weight > 0 ? 1 - std::pow(weight, n) : 1;
    out.push_back({p.x, last / debias});
  }
  return out;
}

Figure build_figure(const std::vector<Run>& runs, const ChartOptions& opt) {
  std::set<std::string> have = available(runs);
  if (have.empty()) throw PlotError("no numeric metrics to plot");
  std::vector<std::string> keys = select_keys(runs, have, opt.metrics);
  if (keys.empty()) {
    std::string list;
    for (const auto& k : have) list += (list.empty() ? "" : ", ") + k;
    throw PlotError("none of the requested metrics has data; available: " + list);
  }
  std::vector<std::string> splits = splits_of(runs);

  std::vector<std::string> order;  // section titles, first appearance
  std::map<std::string, std::vector<Axes>> by_section;
  std::set<Style> styles;
  for (const auto& key : keys) {
    Axes ax = build_axes(runs, key, splits, opt);
    if (ax.series.empty()) continue;
    for (const auto& s : ax.series) styles.insert(s.style);
    std::string sec = section_of(key);
    if (!by_section.count(sec)) order.push_back(sec);
    by_section[sec].push_back(std::move(ax));
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return section_rank(a) < section_rank(b); });

  Figure fig;
  for (const auto& r : runs) fig.runs.push_back(r.name);
  fig.title = runs.size() == 1 ? runs.front().name : "";
  fig.smooth = opt.smooth;
  for (const auto& sec : order) fig.sections.push_back(lay_out(sec, std::move(by_section[sec])));
  // Legend order: what a reader looks for first.
  for (Style s : {Style::train, Style::train_raw, Style::validation, Style::baseline})
    if (styles.count(s)) fig.styles.push_back(s);
  return fig;
}

Ticks nice_ticks(double lo, double hi, int target) {
  // A range lost in rounding (a smoothed constant) is a single value: steps that small would
  // leave the tick counter below stuck at a float too big to increment.
  if (!(hi - lo > 1e-9 * std::max(std::abs(lo), std::abs(hi)))) {
    lo = hi = (lo + hi) / 2;
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
  for (double n = 0; n <= last - first + 0.5 && n < 1000; ++n) {
    double v = (first + n) * step;
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

LogTicks log_ticks(double lo, double hi, size_t max_labels) {
  LogTicks t;
  if (!(lo > 0) || !(hi > lo)) return t;
  max_labels = std::max<size_t>(max_labels, 2);
  const int k0 = static_cast<int>(std::floor(std::log10(lo))) - 1;
  const int k1 = static_cast<int>(std::ceil(std::log10(hi))) + 1;
  auto inside = [&](double v) { return v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9); };
  // Label sets, coarsest first: finer ones until three labels, unless that would crowd them.
  static const std::vector<std::vector<int>> kLabelled = {
      {1}, {1, 2, 5}, {1, 2, 3, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  for (const auto& set : kLabelled) {
    LogTicks c;
    for (int k = k0; k <= k1; ++k)
      for (int m = 1; m <= 9; ++m) {
        double v = m * std::pow(10.0, k);
        if (!inside(v)) continue;
        (std::count(set.begin(), set.end(), m) ? c.major : c.minor).push_back(v);
      }
    if (c.major.size() > max_labels && t.major.size() >= 2) break;
    t = std::move(c);
    if (t.major.size() >= 3) break;
  }
  if (t.major.empty()) {
    // Less than the gap between two 1..9 multiples: plain linear ticks inside the range.
    t.minor.clear();
    for (double v : nice_ticks(lo, hi, 3).values)
      if (inside(v)) t.major.push_back(v);
    return t;
  }
  // Many decades: label every n-th one so the labels stay apart; the rest become minor ticks.
  if (t.major.size() > max_labels) {
    size_t every = (t.major.size() + max_labels - 1) / max_labels;
    std::vector<double> keep;
    for (size_t i = 0; i < t.major.size(); ++i)
      (i % every == 0 ? keep : t.minor).push_back(t.major[i]);
    t.major = std::move(keep);
    std::sort(t.minor.begin(), t.minor.end());
  }
  return t;
}

std::string format_log_tick(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  std::string s = buf;
  // "1e-05" -> "1e-5", "1e+06" -> "1e6".
  size_t e = s.find('e');
  if (e != std::string::npos) {
    std::string sign = s[e + 1] == '-' ? "-" : "";
    std::string digits = s.substr(e + 2);
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
    s = s.substr(0, e + 1) + sign + digits;
  }
  return s;
}

}  // namespace slipstream::plot
