#include "tools/slipstream/plot_render.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numbers>

namespace slipstream::plot {

namespace {

// Matplotlib's tab10: distinguishable, and readable on white.
constexpr Rgb kPalette[] = {{0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173},
                            {0.839, 0.153, 0.157}, {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294},
                            {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498}, {0.737, 0.741, 0.133},
                            {0.090, 0.745, 0.812}};
constexpr Rgb kInk{0.13, 0.13, 0.13};
constexpr Rgb kTickText{0.27, 0.27, 0.27};
constexpr Rgb kAxis{0.55, 0.55, 0.55};
constexpr Rgb kFrame{0.72, 0.72, 0.72};
constexpr Rgb kGrid{0.88, 0.88, 0.88};
constexpr Rgb kMinorGrid{0.95, 0.95, 0.95};
constexpr Rgb kLegendInk{0.33, 0.33, 0.33};

constexpr double kPad = 14;         // page margin
constexpr double kTitleH = 30;      // title band
constexpr double kLegendRowH = 20;  // one line of legend
constexpr double kLabelBand = 22;   // the vertical section label left of the y tick labels
constexpr double kTickFont = 11, kTitleFont = 16, kLegendFont = 12, kAxesTitleFont = 12;
constexpr double kSectionFont = 13;
constexpr double kGutter = 28;      // between grid columns
constexpr double kXTickBand = 20;   // x tick labels under a plot
constexpr double kAxesTitleH = 18;  // a grid cell's title above its plot
constexpr double kStepLabelH = 22;  // "step" at the bottom
constexpr double kPanelPx = 250;    // nominal height of a full-width panel
constexpr double kGridRowPx = 180;  // nominal height of a grid row

enum class Anchor { start, middle, end };

void set_color(cairo_t* cr, Rgb c, double alpha = 1) {
  cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha);
}

void font(cairo_t* cr, double size, bool bold) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                         bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
}

double text_width(cairo_t* cr, const std::string& s, double size, bool bold = false) {
  font(cr, size, bold);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

// `y` is the text's vertical centre (of its capitals and digits); `vertical` turns it 90 degrees
// counter-clockwise about (x, y), as a y-axis label.
void text(cairo_t* cr, double x, double y, const std::string& s, double size, Rgb c,
          Anchor anchor = Anchor::start, bool bold = false, bool vertical = false) {
  double w = text_width(cr, s, size, bold);
  double dx = anchor == Anchor::start ? 0 : anchor == Anchor::middle ? -w / 2 : -w;
  cairo_save(cr);
  cairo_translate(cr, x, y);
  if (vertical) cairo_rotate(cr, -std::numbers::pi / 2);
  cairo_move_to(cr, dx, size * 0.36);
  set_color(cr, c);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

// The centre of the nearest pixel, so 1 px rules stay crisp in the PNG.
double crisp(double v) {
  return std::floor(v) + 0.5;
}

void rule(cairo_t* cr, double x0, double y0, double x1, double y1, Rgb c, double width = 1) {
  cairo_move_to(cr, x0, y0);
  cairo_line_to(cr, x1, y1);
  set_color(cr, c);
  cairo_set_line_width(cr, width);
  cairo_set_dash(cr, nullptr, 0, 0);
  cairo_stroke(cr);
}

struct Look {
  double width = 1.8, alpha = 1;
  std::vector<double> dash;
  bool markers = false;
};

Look look_of(Style s, bool smoothed) {
  switch (s) {
    case Style::baseline:
      return {1.5, 0.9, {0.1, 3.6}, false};
    case Style::train_raw:
      return {1.1, 0.25, {}, false};
    case Style::train:
      return {smoothed ? 2.0 : 1.8, 1, {}, false};
    case Style::validation:
      return {1.5, 1, {6, 3}, true};
  }
  return {};
}

void apply(cairo_t* cr, const Look& l, Rgb c) {
  set_color(cr, c, l.alpha);
  cairo_set_line_width(cr, l.width);
  cairo_set_dash(cr, l.dash.data(), static_cast<int>(l.dash.size()), 0);
  bool dots = !l.dash.empty() && l.dash[0] < 1;  // round caps turn near-empty dashes into dots
  cairo_set_line_cap(cr, dots ? CAIRO_LINE_CAP_ROUND : CAIRO_LINE_CAP_BUTT);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
}

void marker(cairo_t* cr, double x, double y, Rgb c) {
  cairo_new_sub_path(cr);
  cairo_arc(cr, x, y, 3.2, 0, 2 * std::numbers::pi);
  set_color(cr, c);
  cairo_fill_preserve(cr);
  cairo_set_dash(cr, nullptr, 0, 0);
  cairo_set_line_width(cr, 1);
  set_color(cr, {1, 1, 1});
  cairo_stroke(cr);
}

// Legend text of a style.
std::string style_label(Style s, double smooth) {
  switch (s) {
    case Style::baseline:
      return "baseline";
    case Style::train_raw:
      return "train (raw)";
    case Style::train: {
      if (smooth <= 0) return "train";
      char buf[40];
      std::snprintf(buf, sizeof buf, "train (smoothed %.3g)", smooth);
      return buf;
    }
    case Style::validation:
      return "validation";
  }
  return "";
}

struct LegendItem {
  std::string label;
  Rgb color;
  Look look;
  double width = 0;  // swatch, gap and text
};

constexpr double kSwatch = 28, kSwatchGap = 6, kItemGap = 22;

std::vector<LegendItem> legend_items(cairo_t* cr, const Figure& fig) {
  std::vector<LegendItem> items;
  bool multi = fig.runs.size() > 1;
  if (multi)
    for (size_t i = 0; i < fig.runs.size(); ++i)
      items.push_back({fig.runs[i], run_color(i), {3, 1, {}, false}});
  for (Style s : fig.styles)
    items.push_back({style_label(s, fig.smooth), multi ? kLegendInk : run_color(0),
                     look_of(s, fig.smooth > 0)});
  for (auto& it : items) it.width = kSwatch + kSwatchGap + text_width(cr, it.label, kLegendFont);
  return items;
}

// Legend items per line, wrapped to fit `avail` pixels.
std::vector<std::vector<LegendItem>> legend_lines(const std::vector<LegendItem>& items,
                                                  double avail) {
  std::vector<std::vector<LegendItem>> lines;
  double used = 0;
  for (const auto& it : items) {
    if (lines.empty() || (used + kItemGap + it.width > avail && !lines.back().empty())) {
      lines.emplace_back();
      used = -kItemGap;
    }
    lines.back().push_back(it);
    used += kItemGap + it.width;
  }
  return lines;
}

double line_width(const std::vector<LegendItem>& line) {
  double w = -kItemGap;
  for (const auto& it : line) w += kItemGap + it.width;
  return w;
}

std::string figure_title(cairo_t* cr, const Figure& fig, double avail) {
  if (!fig.title.empty()) return fig.title;
  std::string joined;
  for (const auto& r : fig.runs) joined += (joined.empty() ? "" : " vs ") + r;
  if (text_width(cr, joined, kTitleFont, true) <= avail) return joined;
  return std::to_string(fig.runs.size()) + " runs";
}

double section_weight(const Section& s) {
  if (s.columns == 1 && s.rows.size() == 1)
    return s.title == "learning rate" ? 0.8 : 1.0;  // the schedule needs less room
  return static_cast<double>(s.rows.size()) * kGridRowPx / kPanelPx;
}

double top_height(cairo_t* cr, const Figure& fig, double width) {
  auto lines = legend_lines(legend_items(cr, fig), width - 2 * kPad);
  return kPad + kTitleH + static_cast<double>(lines.size()) * kLegendRowH + 8;
}

double bottom_height() {
  return kStepLabelH + kPad - 4;
}

// A tiny surface for measuring text before the real one exists.
struct Measure {
  cairo_surface_t* s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1);
  cairo_t* cr = cairo_create(s);
  ~Measure() {
    cairo_destroy(cr);
    cairo_surface_destroy(s);
  }
};

struct YAxis {
  double lo = 0, hi = 1;
  bool log = false;
  std::vector<double> major, minor;
  double step = 1;  // linear tick step, for the labels
};

std::string y_label(const YAxis& y, double v) {
  return y.log ? format_log_tick(v) : format_tick(v, y.step);
}

YAxis y_axis(const Axes& ax, double plot_h) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : ax.series)
    for (const auto& p : s.points)
      if (std::isfinite(p.y)) lo = std::min(lo, p.y), hi = std::max(hi, p.y);
  YAxis y;
  if (ax.log_y && lo > 0) {
    y.log = true;
    double l0 = std::log10(lo), l1 = std::log10(hi);
    double pad = l1 - l0 > 1e-9 ? (l1 - l0) * 0.05 : 0.1;
    y.lo = std::pow(10, l0 - pad);
    y.hi = std::pow(10, l1 + pad);
    LogTicks t = log_ticks(y.lo, y.hi, static_cast<size_t>(plot_h / 24));
    y.major = t.major;
    y.minor = t.minor;
    return y;
  }
  if (!(hi - lo > 1e-9 * std::max(std::abs(lo), std::abs(hi)))) lo = hi = (lo + hi) / 2;
  double pad = hi > lo ? (hi - lo) * 0.05 : lo != 0 ? std::abs(lo) * 0.1 : 1;
  // A quantity that cannot go negative (loss, lr, accuracy) keeps 0 as its floor.
  y.lo = lo >= 0 ? std::max(0.0, lo - pad) : lo - pad;
  y.hi = hi + pad;
  // Ticks outside the padded range are not drawn; ask for finer steps until three are left.
  for (int target = std::max(2, static_cast<int>(plot_h / 38)); target <= 12; ++target) {
    Ticks t = nice_ticks(y.lo, y.hi, target);
    y.step = t.step;
    y.major.clear();
    double eps = (y.hi - y.lo) * 1e-9;
    for (double v : t.values)
      if (v >= y.lo - eps && v <= y.hi + eps) y.major.push_back(v);
    if (y.major.size() >= 3) break;
  }
  return y;
}

void draw_series(cairo_t* cr, const Series& s, const AxesBox& box, bool smoothed) {
  Look l = look_of(s.style, smoothed);
  Rgb c = run_color(s.run);
  apply(cr, l, c);
  size_t run_len = 0;
  std::vector<std::pair<double, double>> dots;
  auto flush = [&] {
    if (run_len >= 2) {
      cairo_stroke(cr);
    } else if (run_len == 1) {
      // A lone point between gaps would otherwise vanish.
      double x, y;
      cairo_get_current_point(cr, &x, &y);
      cairo_new_path(cr);
      if (!l.markers) dots.emplace_back(x, y);
    }
    cairo_new_path(cr);
    run_len = 0;
  };
  for (const auto& p : s.points) {
    if (!std::isfinite(p.y)) {
      flush();
      continue;
    }
    double x = box.px(p.x), y = box.py(p.y);
    (run_len++ ? cairo_line_to : cairo_move_to)(cr, x, y);
  }
  flush();
  for (auto [x, y] : dots) {
    cairo_arc(cr, x, y, l.width, 0, 2 * std::numbers::pi);
    set_color(cr, c, l.alpha);
    cairo_fill(cr);
  }
  // Evaluations are few; a marker on each says where the validation pass ran.
  size_t finite = std::count_if(s.points.begin(), s.points.end(),
                                [](const Point& p) { return std::isfinite(p.y); });
  if (l.markers && finite <= 80)
    for (const auto& p : s.points)
      if (std::isfinite(p.y)) marker(cr, box.px(p.x), box.py(p.y), c);
}

struct Cell {
  const Axes* axes;
  Rect plot;
  YAxis y;
  bool titled;
};

}  // namespace

std::optional<Format> parse_format(const std::string& name) {
  std::string n = name;
  for (auto& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!n.empty() && n.front() == '.') n.erase(0, 1);
  if (n == "png") return Format::png;
  if (n == "svg") return Format::svg;
  if (n == "pdf") return Format::pdf;
  return std::nullopt;
}

std::optional<Format> format_of(const std::filesystem::path& file) {
  std::string ext = file.extension().string();
  if (ext.empty()) return std::nullopt;
  return parse_format(ext);
}

const char* extension(Format f) {
  switch (f) {
    case Format::png:
      return ".png";
    case Format::svg:
      return ".svg";
    case Format::pdf:
      return ".pdf";
  }
  return "";
}

Rgb run_color(size_t i) {
  return kPalette[i % std::size(kPalette)];
}

double AxesBox::px(double step) const {
  return plot.x + (step - x_lo) / (x_hi - x_lo) * plot.w;
}

double AxesBox::py(double value) const {
  double f = log_y ? (std::log10(value) - std::log10(y_lo)) / (std::log10(y_hi) - std::log10(y_lo))
                   : (value - y_lo) / (y_hi - y_lo);
  return plot.y + plot.h - f * plot.h;
}

int default_height(const Figure& fig, int width) {
  Measure m;
  double weights = 0;
  for (const auto& s : fig.sections) weights += section_weight(s);
  return static_cast<int>(
      std::ceil(top_height(m.cr, fig, width) + weights * kPanelPx + bottom_height()));
}

Layout draw_figure(cairo_t* cr, const Figure& fig, double W, double H) {
  Layout layout;
  cairo_save(cr);
  cairo_rectangle(cr, 0, 0, W, H);
  set_color(cr, {1, 1, 1});
  cairo_fill(cr);

  // Title and legend across the top: outside the data, so they never cover a curve.
  std::string title = figure_title(cr, fig, W - 2 * kPad);
  text(cr, W / 2, kPad + 10, title, kTitleFont, kInk, Anchor::middle, true);
  auto lines = legend_lines(legend_items(cr, fig), W - 2 * kPad);
  double ly = kPad + kTitleH;
  layout.legend = {W, ly, 0, static_cast<double>(lines.size()) * kLegendRowH};
  for (const auto& line : lines) {
    double lw = line_width(line);
    double x = (W - lw) / 2, yc = ly + kLegendRowH / 2;
    layout.legend.x = std::min(layout.legend.x, x);
    layout.legend.w = std::max(layout.legend.w, lw);
    for (const auto& it : line) {
      apply(cr, it.look, it.color);
      cairo_move_to(cr, x, yc);
      cairo_line_to(cr, x + kSwatch, yc);
      cairo_stroke(cr);
      if (it.look.markers) marker(cr, x + kSwatch / 2, yc, it.color);
      text(cr, x + kSwatch + kSwatchGap, yc, it.label, kLegendFont, kInk);
      x += it.width + kItemGap;
    }
    ly += kLegendRowH;
  }

  // Vertical layout: the sections share what is left in proportion to their nominal heights.
  const double top = top_height(cr, fig, W), bottom = H - bottom_height();
  double weights = 0;
  for (const auto& s : fig.sections) weights += section_weight(s);
  const double unit = (bottom - top) / std::max(weights, 1e-9);

  std::vector<Cell> cells;
  struct SectionSpan {
    const Section* s;
    double y0, y1;
  };
  std::vector<SectionSpan> spans;
  double y = top;
  for (const auto& sec : fig.sections) {
    double sh = section_weight(sec) * unit;
    spans.push_back({&sec, y, y + sh});
    double rh = sh / static_cast<double>(sec.rows.size());
    bool titled = sec.rows.size() > 1 || sec.rows.front().size() > 1;
    for (size_t r = 0; r < sec.rows.size(); ++r) {
      double ry = y + rh * static_cast<double>(r) + (titled ? kAxesTitleH : 6);
      double ph = std::max(10.0, rh - (titled ? kAxesTitleH : 6) - kXTickBand - 6);
      for (const auto& ax : sec.rows[r]) cells.push_back({&ax, {0, ry, 0, ph}, {}, titled});
    }
    y += sh;
  }

  // y ticks first: the widest label sets every cell's left margin, so the plots line up.
  double label_w = 0;
  for (auto& c : cells) {
    c.y = y_axis(*c.axes, c.plot.h);
    for (double v : c.y.major)
      label_w = std::max(label_w, text_width(cr, y_label(c.y, v), kTickFont));
  }
  const double content_x = kPad + kLabelBand, content_w = W - content_x - kPad - 10;
  const double y_gutter = std::ceil(label_w) + 9;

  double xmin = INFINITY, xmax = -INFINITY;
  for (const auto& c : cells)
    for (const auto& s : c.axes->series)
      for (const auto& p : s.points) xmin = std::min(xmin, p.x), xmax = std::max(xmax, p.x);
  if (!(xmax > xmin)) xmin -= 1, xmax += 1;  // a single step still gets a width

  size_t ci = 0;
  for (const auto& span : spans) {
    const Section& sec = *span.s;
    double cw = (content_w - kGutter * static_cast<double>(sec.columns - 1)) /
                static_cast<double>(sec.columns);
    bool all_log = true;
    for (const auto& row : sec.rows) {
      for (size_t col = 0; col < row.size(); ++col, ++ci) {
        Cell& c = cells[ci];
        double cx = content_x + static_cast<double>(col) * (cw + kGutter);
        c.plot.x = cx + y_gutter;
        c.plot.w = cw - y_gutter;
        AxesBox box{c.axes->metric, c.plot, xmin, xmax, c.y.lo, c.y.hi, c.y.log};
        all_log = all_log && c.y.log;
        const Rect& p = c.plot;
        double right = p.x + p.w, base = p.y + p.h;

        Ticks xt = nice_ticks(xmin, xmax, std::max(2, static_cast<int>(p.w / 90)));
        std::vector<double> xs;
        for (double v : xt.values)
          if (v >= xmin - 1e-9 * (xmax - xmin) && v <= xmax + 1e-9 * (xmax - xmin)) xs.push_back(v);
        for (double v : c.y.minor)
          rule(cr, p.x, crisp(box.py(v)), right, crisp(box.py(v)), kMinorGrid);
        for (double v : c.y.major) rule(cr, p.x, crisp(box.py(v)), right, crisp(box.py(v)), kGrid);
        for (double v : xs) rule(cr, crisp(box.px(v)), p.y, crisp(box.px(v)), base, kGrid);

        // Curves, clipped with a little slack so markers on the range's edge stay whole.
        cairo_save(cr);
        cairo_rectangle(cr, p.x - 4, p.y - 4, p.w + 8, p.h + 8);
        cairo_clip(cr);
        for (const auto& s : c.axes->series) draw_series(cr, s, box, fig.smooth > 0);
        cairo_restore(cr);

        cairo_rectangle(cr, crisp(p.x), crisp(p.y), std::round(p.w), std::round(p.h));
        set_color(cr, kFrame);
        cairo_set_line_width(cr, 1);
        cairo_set_dash(cr, nullptr, 0, 0);
        cairo_stroke(cr);
        double last_label = -INFINITY;
        for (double v : c.y.minor)
          rule(cr, p.x - 2.5, crisp(box.py(v)), p.x, crisp(box.py(v)), kAxis);
        // Bottom to top; a label too close to the one below is left out.
        std::vector<double> majors = c.y.major;
        std::sort(majors.begin(), majors.end());
        for (double v : majors) {
          double ty = crisp(box.py(v));
          rule(cr, p.x - 4, ty, p.x, ty, kAxis);
          if (std::abs(last_label - ty) < kTickFont + 2) continue;
          text(cr, p.x - 7, ty, y_label(c.y, v), kTickFont, kTickText, Anchor::end);
          last_label = ty;
        }
        for (double v : xs) {
          double tx = crisp(box.px(v));
          rule(cr, tx, base, tx, base + 4, kAxis);
          text(cr, tx, base + 12, format_tick(v, xt.step), kTickFont, kTickText, Anchor::middle);
        }
        if (c.titled)
          text(cr, p.x + p.w / 2, p.y - 9, c.axes->title, kAxesTitleFont, kInk, Anchor::middle);
        layout.axes.push_back(box);
      }
    }
    std::string label = sec.title + (all_log ? " (log scale)" : "");
    text(cr, kPad + 7, (span.y0 + span.y1 - kXTickBand) / 2, label, kSectionFont, kInk,
         Anchor::middle, true, true);
  }
  text(cr, content_x + y_gutter + (content_w - y_gutter) / 2, H - kPad - 4, "step", 12, kInk,
       Anchor::middle, true);
  cairo_restore(cr);
  return layout;
}

namespace {

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};
using SurfacePtr = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;
using ContextPtr = std::unique_ptr<cairo_t, ContextDeleter>;

void check(cairo_status_t st, const std::filesystem::path& out) {
  if (st == CAIRO_STATUS_SUCCESS) return;
  // cairo's "error while writing to output stream" hides the cause: opening the file again
  // for appending asks the system for it (no such folder, permission denied, a full disk).
  std::string why = cairo_status_to_string(st);
  if (st == CAIRO_STATUS_WRITE_ERROR) {
    errno = 0;
    if (FILE* f = std::fopen(out.c_str(), "ab"))
      std::fclose(f);
    else if (errno != 0)
      why = std::strerror(errno);
  }
  throw PlotError("cannot write " + out.string() + ": " + why);
}

}  // namespace

Layout write_figure(const Figure& fig, const std::filesystem::path& out, Format format, int width,
                    int height) {
  const std::string path = out.string();
  SurfacePtr surface;
  double scale = 1;
  switch (format) {
    case Format::png:
      surface.reset(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height));
      break;
    case Format::svg:
      surface.reset(cairo_svg_surface_create(path.c_str(), width, height));
      cairo_svg_surface_set_document_unit(surface.get(), CAIRO_SVG_UNIT_PX);
      break;
    case Format::pdf:
      // PDF measures in points (1/72 in); 0.75 pt per pixel keeps the 96 dpi proportions.
      scale = 0.75;
      surface.reset(cairo_pdf_surface_create(path.c_str(), width * scale, height * scale));
      cairo_pdf_surface_set_metadata(surface.get(), CAIRO_PDF_METADATA_TITLE,
                                     out.stem().string().c_str());
      cairo_pdf_surface_set_metadata(surface.get(), CAIRO_PDF_METADATA_CREATOR, "slipstream plot");
      break;
  }
  check(cairo_surface_status(surface.get()), out);
  ContextPtr cr(cairo_create(surface.get()));
  cairo_scale(cr.get(), scale, scale);
  Layout layout = draw_figure(cr.get(), fig, width, height);
  check(cairo_status(cr.get()), out);
  cr.reset();
  if (format == Format::png) check(cairo_surface_write_to_png(surface.get(), path.c_str()), out);
  cairo_surface_finish(surface.get());
  check(cairo_surface_status(surface.get()), out);
  return layout;
}

}  // namespace slipstream::plot
