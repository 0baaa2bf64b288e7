#include "tools/slipstream/plot_svg.h"

#include <cstdio>

namespace slipstream::plot {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

std::string hex(Rgb c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

SvgSurface::SvgSurface(int width, int height) {
  body_ =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
      "width=\"" +
      std::to_string(width) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
      std::to_string(width) + " " + std::to_string(height) +
      "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
}

void SvgSurface::fill_rect(const Rect& r, Rgb color) {
  body_ += "<rect x=\"" + num(r.x) + "\" y=\"" + num(r.y) + "\" width=\"" + num(r.w) +
           "\" height=\"" + num(r.h) + "\" fill=\"" + hex(color) + "\"/>\n";
}

void SvgSurface::polyline(const std::vector<Point>& pts, const Stroke& stroke) {
  body_ += "<polyline fill=\"none\" stroke=\"" + hex(stroke.color) + "\" stroke-width=\"" +
           num(stroke.width) + "\" stroke-linejoin=\"round\"";
  if (stroke.dashed) body_ += " stroke-dasharray=\"6 4\"";
  body_ += " points=\"";
  for (size_t i = 0; i < pts.size(); ++i) {
    // Appended piecewise: `"lit" + std::string&&` trips GCC 12's bogus -Wrestrict.
    if (i) body_ += ' ';
    body_ += num(pts[i].x);
    body_ += ',';
    body_ += num(pts[i].y);
  }
  body_ += "\"/>\n";
}

void SvgSurface::dot(Point c, double radius, Rgb color) {
  body_ += "<circle cx=\"" + num(c.x) + "\" cy=\"" + num(c.y) + "\" r=\"" + num(radius) +
           "\" fill=\"" + hex(color) + "\"/>\n";
}

void SvgSurface::text(Point at, std::string_view s, const TextStyle& st) {
  const char* anchor = st.anchor == Anchor::start    ? "start"
                       : st.anchor == Anchor::middle ? "middle"
                                                     : "end";
  // Shift to the baseline by hand: dominant-baseline is ignored by several renderers.
  double shift = st.size * 0.35;
  std::string pos = st.vertical ? "x=\"0\" y=\"0\" transform=\"translate(" + num(at.x + shift) +
                                      "," + num(at.y) + ") rotate(-90)\""
                                : "x=\"" + num(at.x) + "\" y=\"" + num(at.y + shift) + "\"";
  body_ += "<text " + pos + " font-size=\"" + num(st.size) + "\" fill=\"" + hex(st.color) +
           "\" text-anchor=\"" + anchor + "\"" + (st.bold ? " font-weight=\"bold\"" : "") + ">" +
           xml_escape(s) + "</text>\n";
}

double SvgSurface::text_width(std::string_view s, double size) const {
  return 0.6 * size * static_cast<double>(s.size());  // a sans-serif average, for layout only
}

void SvgSurface::push_clip(const Rect& r) {
  std::string id = "clip" + std::to_string(++clips_);
  body_ += "<clipPath id=\"" + id + "\"><rect x=\"" + num(r.x) + "\" y=\"" + num(r.y) +
           "\" width=\"" + num(r.w) + "\" height=\"" + num(r.h) +
           "\"/></clipPath>\n<g clip-path=\"url(#" + id + ")\">\n";
}

void SvgSurface::pop_clip() {
  body_ += "</g>\n";
}

void SvgSurface::begin_series(std::string_view label) {
  body_ += "<g class=\"series\" data-label=\"" + xml_escape(label) + "\">\n";
}

void SvgSurface::end_series() {
  body_ += "</g>\n";
}

std::string SvgSurface::finish() {
  return body_ + "</svg>\n";
}

}  // namespace slipstream::plot
