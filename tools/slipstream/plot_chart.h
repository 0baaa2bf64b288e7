// The chart model of `slipstream plot`: which metrics become which curves in which panel, the
// axis ticks, and the layout drawn onto a Surface.
#pragma once

#include <string>
#include <vector>

#include "tools/slipstream/plot_metrics.h"
#include "tools/slipstream/plot_surface.h"

namespace slipstream::plot {

struct Series {
  std::string label;          // legend text, e.g. "val acc/buttons"
  std::string metric;         // the metrics.jsonl key
  std::string split;          // "train" or "validation"
  std::vector<Point> points;  // (step, value); a NaN value breaks the line
  Rgb color;
  bool dashed = false;   // baselines
  bool markers = false;  // sparse validation curves get a dot per point
  double width = 1.5;
};

struct Panel {
  std::string title;  // also the y-axis label
  std::vector<Series> series;
};

struct Chart {
  std::string title;
  std::vector<Panel> panels;
};

// Metric keys to draw. Empty `wanted` picks the default set: loss, nll, baseline/loss, every
// acc/* and baseline/acc/*, and lr. An entry ending in '*' matches a prefix; each wanted key
// brings its baseline/<key> along. Throws PlotError when nothing numeric remains.
Chart build_chart(const MetricsLog& log, const std::vector<std::string>& wanted,
                  const std::string& title);

// Wanted keys that match nothing in the log (for a warning).
std::vector<std::string> unmatched_metrics(const MetricsLog& log,
                                           const std::vector<std::string>& wanted);

struct Ticks {
  double lo = 0, hi = 1, step = 1;  // axis range, widened to whole steps
  std::vector<double> values;
};
// About `target` evenly spaced ticks at 1/2/5 x 10^k covering [lo, hi].
Ticks nice_ticks(double lo, double hi, int target);
// A tick label with just the digits that `step` needs ("0.25", "12k", "3e-4").
std::string format_tick(double v, double step);

// Default image size for a chart with this many panels.
int default_height(size_t panels);
void render_chart(const Chart& chart, Surface& s, int width, int height);

}  // namespace slipstream::plot
