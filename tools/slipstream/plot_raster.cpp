#include "tools/slipstream/plot_raster.h"

#include <algorithm>
#include <cmath>

#include "tools/slipstream/plot_font.h"

namespace slipstream::plot {

namespace {

int glyph_scale(double size) {
  return size >= 15 ? 2 : 1;
}

double seg_distance(Point p, Point a, Point b) {
  double dx = b.x - a.x, dy = b.y - a.y;
  double len2 = dx * dx + dy * dy;
  double t = len2 > 0 ? std::clamp(((p.x - a.x) * dx + (p.y - a.y) * dy) / len2, 0.0, 1.0) : 0;
  double ex = a.x + t * dx - p.x, ey = a.y + t * dy - p.y;
  return std::sqrt(ex * ex + ey * ey);
}

}  // namespace

RasterSurface::RasterSurface(int width, int height)
    : w_(width),
      h_(height),
      rgb_(static_cast<size_t>(width) * height * 3, 255),
      cover_(static_cast<size_t>(width) * height, 0.0f) {
  clips_.push_back({0, 0, w_, h_});
}

Rgb RasterSurface::pixel(int x, int y) const {
  const uint8_t* p = &rgb_[(static_cast<size_t>(y) * w_ + x) * 3];
  return {p[0], p[1], p[2]};
}

void RasterSurface::blend(int x, int y, Rgb c, double a) {
  const Box& b = clips_.back();
  if (x < b.x0 || y < b.y0 || x >= b.x1 || y >= b.y1 || a <= 0) return;
  a = std::min(a, 1.0);
  uint8_t* p = &rgb_[(static_cast<size_t>(y) * w_ + x) * 3];
  auto mix = [a](uint8_t dst, uint8_t src) {
    return static_cast<uint8_t>(std::lround(dst + (src - dst) * a));
  };
  p[0] = mix(p[0], c.r);
  p[1] = mix(p[1], c.g);
  p[2] = mix(p[2], c.b);
}

void RasterSurface::fill_rect(const Rect& r, Rgb color) {
  // Pixels whose centres fall inside the rectangle.
  int x0 = static_cast<int>(std::ceil(r.x - 0.5)),
      x1 = static_cast<int>(std::ceil(r.x + r.w - 0.5));
  int y0 = static_cast<int>(std::ceil(r.y - 0.5)),
      y1 = static_cast<int>(std::ceil(r.y + r.h - 0.5));
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) blend(x, y, color, 1);
}

void RasterSurface::cover_segment(Point a, Point b, double hw) {
  // Coverage falls off over one pixel at the edge: a cheap anti-alias.
  const Box& clip = clips_.back();
  int x0 = std::max(clip.x0, static_cast<int>(std::floor(std::min(a.x, b.x) - hw - 1)));
  int x1 = std::min(clip.x1, static_cast<int>(std::ceil(std::max(a.x, b.x) + hw + 1)));
  int y0 = std::max(clip.y0, static_cast<int>(std::floor(std::min(a.y, b.y) - hw - 1)));
  int y1 = std::min(clip.y1, static_cast<int>(std::ceil(std::max(a.y, b.y) + hw + 1)));
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      double d = seg_distance({x + 0.5, y + 0.5}, a, b);
      float c = static_cast<float>(std::clamp(hw + 0.5 - d, 0.0, 1.0));
      if (c <= 0) continue;
      size_t i = static_cast<size_t>(y) * w_ + x;
      if (cover_[i] == 0) touched_.push_back(static_cast<int>(i));
      cover_[i] = std::max(cover_[i], c);
    }
}

void RasterSurface::flush_coverage(Rgb c) {
  for (int i : touched_) {
    blend(i % w_, i / w_, c, cover_[i]);
    cover_[i] = 0;
  }
  touched_.clear();
}

void RasterSurface::polyline(const std::vector<Point>& pts, const Stroke& st) {
  const double hw = st.width / 2;
  if (!st.dashed) {
    for (size_t i = 1; i < pts.size(); ++i) cover_segment(pts[i - 1], pts[i], hw);
  } else {
    // The dash pattern (6 on, 4 off) continues across vertices, as in SVG.
    constexpr double kOn = 6, kPeriod = 10;
    double phase = 0;
    for (size_t i = 1; i < pts.size(); ++i) {
      Point a = pts[i - 1], b = pts[i];
      double len = std::hypot(b.x - a.x, b.y - a.y);
      double t = 0;
      while (t < len) {
        double in_period = std::fmod(phase + t, kPeriod);
        double run = in_period < kOn ? kOn - in_period : kPeriod - in_period;
        double t1 = std::min(len, t + run);
        if (in_period < kOn && len > 0) {
          Point p{a.x + (b.x - a.x) * t / len, a.y + (b.y - a.y) * t / len};
          Point q{a.x + (b.x - a.x) * t1 / len, a.y + (b.y - a.y) * t1 / len};
          cover_segment(p, q, hw);
        }
        t = t1;
      }
      phase = std::fmod(phase + len, kPeriod);
    }
  }
  flush_coverage(st.color);
}

void RasterSurface::dot(Point c, double r, Rgb color) {
  for (int y = static_cast<int>(c.y - r - 1); y <= static_cast<int>(c.y + r + 1); ++y)
    for (int x = static_cast<int>(c.x - r - 1); x <= static_cast<int>(c.x + r + 1); ++x)
      blend(x, y, color, std::clamp(r + 0.5 - std::hypot(x + 0.5 - c.x, y + 0.5 - c.y), 0.0, 1.0));
}

double RasterSurface::text_width(std::string_view s, double size) const {
  if (s.empty()) return 0;
  return static_cast<double>(s.size() * kGlyphAdvance - 1) * glyph_scale(size);
}

void RasterSurface::text(Point at, std::string_view s, const TextStyle& st) {
  const int k = glyph_scale(st.size);
  const double w = text_width(s, st.size) + (st.bold ? k : 0);
  const double lead = st.anchor == Anchor::start ? 0 : st.anchor == Anchor::middle ? w / 2 : w;
  // (u, v): position along the text and down the glyph, in pixels; vertical text runs upward.
  const int u0 = static_cast<int>(std::lround(-lead));
  const int v0 = static_cast<int>(std::lround(-kGlyphHeight * k / 2.0));
  const int ax = static_cast<int>(std::floor(at.x)), ay = static_cast<int>(std::floor(at.y));
  auto put = [&](int u, int v) {
    for (int dy = 0; dy < k; ++dy)
      for (int dx = 0; dx < k; ++dx) {
        if (st.vertical)
          blend(ax + v + dy, ay - (u + dx), st.color, 1);
        else
          blend(ax + u + dx, ay + v + dy, st.color, 1);
      }
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& cols = glyph(s[i]);
    for (int col = 0; col < kGlyphWidth; ++col)
      for (int row = 0; row < kGlyphHeight; ++row) {
        if (!((cols[col] >> row) & 1)) continue;
        int u = u0 + (static_cast<int>(i) * kGlyphAdvance + col) * k, v = v0 + row * k;
        put(u, v);
        if (st.bold) put(u + k, v);  // smeared one pixel right: a bitmap bold
      }
  }
}

void RasterSurface::push_clip(const Rect& r) {
  const Box& p = clips_.back();
  clips_.push_back({std::max(p.x0, static_cast<int>(std::floor(r.x))),
                    std::max(p.y0, static_cast<int>(std::floor(r.y))),
                    std::min(p.x1, static_cast<int>(std::ceil(r.x + r.w))),
                    std::min(p.y1, static_cast<int>(std::ceil(r.y + r.h)))});
}

void RasterSurface::pop_clip() {
  if (clips_.size() > 1) clips_.pop_back();
}

}  // namespace slipstream::plot
