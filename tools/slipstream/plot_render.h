// Drawing a Figure with cairo: one routine onto any cairo surface, so the PNG, SVG and PDF of a
// chart are the same picture.
#pragma once

#include <cairo.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tools/slipstream/plot_chart.h"

namespace slipstream::plot {

enum class Format { png, svg, pdf };

// The format a file name's extension asks for (any case); nullopt for another extension.
std::optional<Format> format_of(const std::filesystem::path& file);
std::optional<Format> parse_format(const std::string& name);  // "png", "svg", "pdf"
const char* extension(Format f);                              // ".png", ...

struct Rgb {
  double r = 0, g = 0, b = 0;  // 0..1
};
// The colour of the i-th run's curves (matplotlib's tab10, cycling).
Rgb run_color(size_t i);

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
};

// Where one Axes landed on the page, in pixels, and how it maps data there.
struct AxesBox {
  std::string metric;
  Rect plot;  // inside the frame
  double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  bool log_y = false;
  double px(double step) const;
  double py(double value) const;
};

struct Layout {
  std::vector<AxesBox> axes;  // in drawing order: sections top to bottom, rows left to right
  Rect legend;
};

constexpr int kDefaultWidth = 960;
// The height that gives each full-width panel about 250 px and each grid row about 180 px.
int default_height(const Figure& fig, int width = kDefaultWidth);

// Draws the whole figure (white background included) in a width x height box at the origin.
Layout draw_figure(cairo_t* cr, const Figure& fig, double width, double height);

// Draws onto a surface of the format's kind and writes it to `out`; throws PlotError naming the
// file when it cannot be written. PDF pages are sized at 96 px per inch.
Layout write_figure(const Figure& fig, const std::filesystem::path& out, Format format, int width,
                    int height);

}  // namespace slipstream::plot
