// `slipstream plot RUN_DIR`: loss, accuracy and learning-rate curves from metrics.jsonl, as
// SVG (default) or PNG.
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include "tools/slipstream/commands.h"
#include "tools/slipstream/plot_chart.h"
#include "tools/slipstream/plot_png.h"
#include "tools/slipstream/plot_raster.h"
#include "tools/slipstream/plot_svg.h"

namespace fs = std::filesystem;

namespace slipstream::cli {

namespace {

struct PlotArgs {
  std::string run;
  std::string out;
  std::vector<std::string> metrics;
  std::string size;  // "WxH"
};

bool ends_with(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  std::string tail = s.substr(s.size() - suffix.size());
  for (auto& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return tail == suffix;
}

void run_plot(const PlotArgs& a) {
  using namespace slipstream::plot;
  fs::path run = fs::path(a.run).lexically_normal();
  if (run.has_parent_path() && run.filename().empty()) run = run.parent_path();  // "dir/"
  // Accept the metrics file itself as well as its run directory.
  bool is_file = fs::is_regular_file(run);
  fs::path metrics = is_file ? run : run / "metrics.jsonl";
  fs::path dir = is_file ? run.parent_path() : run;

  fs::path out = a.out.empty() ? dir / "curves.svg" : fs::path(a.out);
  bool png = ends_with(out.string(), ".png");
  if (!png && !ends_with(out.string(), ".svg"))
    throw PlotError("--out " + out.string() + ": the file name must end in .svg or .png");

  std::vector<std::string> wanted;
  for (const auto& m : a.metrics)
    if (!m.empty()) wanted.push_back(m);  // "--metrics loss," leaves an empty entry
  MetricsLog log = load_metrics(metrics);
  if (log.skipped > 0)
    std::cerr << metrics.string() << ": skipped " << log.skipped << " malformed line"
              << (log.skipped == 1 ? "" : "s") << "\n";
  for (const auto& m : unmatched_metrics(log, wanted))
    std::cerr << "warning: no data for metric '" << m << "'\n";
  fs::path abs = fs::absolute(dir).lexically_normal();  // "." names the current directory
  if (abs.filename().empty()) abs = abs.parent_path();
  std::string title = abs.filename().empty() ? abs.string() : abs.filename().string();
  Chart chart = build_chart(log, wanted, title);

  int width = 960, height = default_height(chart.panels.size());
  if (!a.size.empty()) {
    char x = 0;
    std::istringstream in(a.size);
    if (!(in >> width >> x >> height) || x != 'x' || !in.eof() || width < 200 || height < 150 ||
        width > 10000 || height > 10000)
      throw PlotError("--size " + a.size + ": expected WIDTHxHEIGHT, 200x150 to 10000x10000");
  }

  std::string bytes;
  if (png) {
    RasterSurface surface(width, height);
    render_chart(chart, surface, width, height);
    bytes = encode_png(width, height, surface.rgb());
  } else {
    SvgSurface surface(width, height);
    render_chart(chart, surface, width, height);
    bytes = surface.finish();
  }
  std::ofstream f(out, std::ios::binary);
  if (!f.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !f.flush())
    throw PlotError("cannot write " + out.string());
  size_t series = 0;
  for (const auto& p : chart.panels) series += p.series.size();
  std::cout << "wrote " << out.string() << " (" << width << "x" << height << ", "
            << chart.panels.size() << " panel" << (chart.panels.size() == 1 ? "" : "s") << ", "
            << series << " curves from " << log.rows.size() << " rows)\n";
}

}  // namespace

void add_plot_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("plot", "Draw loss/accuracy/lr curves from a run's metrics.jsonl");
  auto args = std::make_shared<PlotArgs>();
  cmd->add_option("run_dir", args->run, "run directory (or its metrics.jsonl)")->required();
  cmd->add_option("--out,-o", args->out, "output file, .svg or .png (default RUN_DIR/curves.svg)");
  cmd->add_option("--metrics", args->metrics,
                  "comma-separated metric keys; 'acc/*' matches a prefix (default: loss, nll, "
                  "acc/*, lr, with their baseline/ keys)")
      ->delimiter(',');
  cmd->add_option("--size", args->size, "image size WIDTHxHEIGHT (default 960 wide, 250 px/panel)");
  cmd->callback([args] {
    try {
      run_plot(*args);
    } catch (const std::exception& e) {
      std::cerr << "slipstream plot: " << e.what() << "\n";
      set_exit_code(kExitFailure);
    }
  });
}

}  // namespace slipstream::cli
