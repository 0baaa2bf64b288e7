// An RGB pixel buffer as a Surface: anti-aliased lines and dots, and the 5x7 bitmap font,
// for `slipstream plot --out FILE.png`.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/slipstream/plot_surface.h"

namespace slipstream::plot {

class RasterSurface : public Surface {
 public:
  RasterSurface(int width, int height);
  void fill_rect(const Rect& r, Rgb color) override;
  void polyline(const std::vector<Point>& pts, const Stroke& stroke) override;
  void dot(Point center, double radius, Rgb color) override;
  void text(Point at, std::string_view s, const TextStyle& style) override;
  double text_width(std::string_view s, double size) const override;
  void push_clip(const Rect& r) override;
  void pop_clip() override;

  int width() const { return w_; }
  int height() const { return h_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }
  Rgb pixel(int x, int y) const;

 private:
  struct Box {
    int x0, y0, x1, y1;  // half-open pixel bounds
  };
  void blend(int x, int y, Rgb c, double alpha);
  void cover_segment(Point a, Point b, double half_width);
  void flush_coverage(Rgb c);

  int w_, h_;
  std::vector<uint8_t> rgb_;
  std::vector<Box> clips_;
  // Per-polyline coverage, max-combined so joints between segments are not painted twice.
  std::vector<float> cover_;
  std::vector<int> touched_;
};

}  // namespace slipstream::plot
