// What the chart layout draws on: one interface so the SVG writer and the PNG rasteriser place
// every line and label identically.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace slipstream::plot {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

struct Point {
  double x = 0, y = 0;
};

struct Rect {
  double x = 0, y = 0, w = 0, h = 0;
};

enum class Anchor { start, middle, end };

struct Stroke {
  Rgb color;
  double width = 1;
  bool dashed = false;
};

struct TextStyle {
  double size = 11;  // nominal pixel height
  Rgb color;
  Anchor anchor = Anchor::start;
  bool bold = false;
  bool vertical = false;  // rotated 90 degrees counter-clockwise (a y-axis label)
};

class Surface {
 public:
  virtual ~Surface() = default;
  virtual void fill_rect(const Rect& r, Rgb color) = 0;
  // One connected run of points in pixel coordinates.
  virtual void polyline(const std::vector<Point>& pts, const Stroke& stroke) = 0;
  virtual void dot(Point center, double radius, Rgb color) = 0;
  // `at` is the anchor point on the text's vertical centre line.
  virtual void text(Point at, std::string_view s, const TextStyle& style) = 0;
  virtual double text_width(std::string_view s, double size) const = 0;
  // Drawing between push_clip and pop_clip stays inside the rectangle.
  virtual void push_clip(const Rect& r) = 0;
  virtual void pop_clip() = 0;
  // Groups one labelled series (the SVG marks it; the raster ignores it).
  virtual void begin_series(std::string_view /*label*/) {}
  virtual void end_series() {}
};

}  // namespace slipstream::plot
