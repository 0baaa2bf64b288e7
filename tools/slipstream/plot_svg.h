// An SVG document as a Surface: the default output of `slipstream plot`.
#pragma once

#include <string>

#include "tools/slipstream/plot_surface.h"

namespace slipstream::plot {

class SvgSurface : public Surface {
 public:
  SvgSurface(int width, int height);
  void fill_rect(const Rect& r, Rgb color) override;
  void polyline(const std::vector<Point>& pts, const Stroke& stroke) override;
  void dot(Point center, double radius, Rgb color) override;
  void text(Point at, std::string_view s, const TextStyle& style) override;
  double text_width(std::string_view s, double size) const override;
  void push_clip(const Rect& r) override;
  void pop_clip() override;
  void begin_series(std::string_view label) override;
  void end_series() override;
  // The complete document; call once, after drawing.
  std::string finish();

 private:
  std::string body_;
  int clips_ = 0;
};

std::string xml_escape(std::string_view s);

}  // namespace slipstream::plot
