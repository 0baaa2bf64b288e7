// The chart model of `slipstream plot`: which metrics of which runs become which curves on which
// axes, grouped into sections, plus the axis ticks. Drawing it is plot_render's job.
#pragma once

#include <string>
#include <vector>

#include "tools/slipstream/plot_metrics.h"

namespace slipstream::plot {

struct Point {
  double x = 0, y = 0;
};

// One run's log under the name its curves carry in the legend.
struct Run {
  std::string name;
  MetricsLog log;
};

// How a curve is drawn; the colour always says which run it belongs to.
enum class Style {
  baseline,    // dotted: the baseline/<key> reference the validation pass logs
  train_raw,   // faint: the unsmoothed training curve behind a smoothed one
  train,       // solid
  validation,  // dashed, a marker per evaluation
};

struct Series {
  size_t run = 0;  // index into Figure::runs, and so the colour
  Style style = Style::train;
  std::string split;          // the rows' split ("train", "validation", ...)
  std::vector<Point> points;  // (step, value) by step; a NaN value breaks the line
};

// One set of axes: a single metric (with its baseline) for every run and split.
struct Axes {
  std::string metric;  // the metrics.jsonl key, e.g. "acc/main_x"
  std::string title;   // shown above the axes in a grid, e.g. "main_x"
  bool log_y = false;
  std::vector<Series> series;  // in drawing order: baselines under training under validation
};

// Metrics that belong together ("accuracy": every acc/<head>) share a y label and are laid out
// as a grid, one row per group of related heads (main_x with main_y), so none is left out.
struct Section {
  std::string title;  // the y label, e.g. "loss"
  size_t columns = 1;
  std::vector<std::vector<Axes>> rows;
};

struct Figure {
  std::string title;
  std::vector<std::string> runs;
  std::vector<Section> sections;
  std::vector<Style> styles;  // the styles that occur, for the legend
  double smooth = 0;
};

struct ChartOptions {
  // Keys to draw; empty picks the default set: loss, nll (where it is not just loss), every
  // acc/* and lr. An entry ending in '*' matches a prefix; each key brings baseline/<key>.
  std::vector<std::string> metrics;
  bool log_loss = true;  // loss-like metrics on a log axis (falls back where a value is <= 0)
  double smooth = 0;     // EMA weight in [0, 1) for training curves but lr; 0: raw
};

// Throws PlotError when no run has numeric data for the chosen metrics.
Figure build_figure(const std::vector<Run>& runs, const ChartOptions& options);

// Wanted keys that match nothing in any run (for a warning).
std::vector<std::string> unmatched_metrics(const std::vector<Run>& runs,
                                           const std::vector<std::string>& wanted);

// TensorBoard's smoothing: an exponential moving average, debiased so the curve does not start
// at 0. NaN points stay gaps and do not disturb the average.
std::vector<Point> smooth_ema(const std::vector<Point>& pts, double weight);

struct Ticks {
  double lo = 0, hi = 1, step = 1;  // axis range, widened to whole steps
  std::vector<double> values;
};
// About `target` evenly spaced ticks at 1/2/5 x 10^k covering [lo, hi].
Ticks nice_ticks(double lo, double hi, int target);
// A tick label with just the digits that `step` needs ("0.25", "12k", "3e-4").
std::string format_tick(double v, double step);

struct LogTicks {
  std::vector<double> major;  // labelled
  std::vector<double> minor;  // a short tick and a faint grid line
};
// Ticks for a log axis over [lo, hi] (both > 0): labelled decades, and 2..9 x 10^k between them;
// an axis spanning fewer than three decades also labels some of those (2 and 5, then 3, ...) as
// long as that stays within `max_labels`.
LogTicks log_ticks(double lo, double hi, size_t max_labels = 8);
// "0.01", "20", "3e-5".
std::string format_log_tick(double v);

}  // namespace slipstream::plot
