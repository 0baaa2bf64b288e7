// `slipstream plot RUN_DIR [RUN_DIR...]`: loss, accuracy and learning-rate curves from
// metrics.jsonl, one colour per run, drawn with cairo as SVG (default), PNG or PDF.
#include <CLI/CLI.hpp>

#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "tools/slipstream/commands.h"
#if SLIPSTREAM_HAS_PLOT
#include "tools/slipstream/plot_chart.h"
#include "tools/slipstream/plot_render.h"
#endif

namespace fs = std::filesystem;

namespace slipstream::cli {

#if SLIPSTREAM_HAS_PLOT
namespace {

struct PlotArgs {
  std::vector<std::string> runs;
  std::string out;
  std::string format;
  std::vector<std::string> metrics;
  std::string size;  // "WxH"
  bool linear = false;
  double smooth = 0;
};

struct RunPaths {
  fs::path metrics, dir;
};

RunPaths locate(const std::string& arg) {
  fs::path run = fs::path(arg).lexically_normal();
  if (run.has_parent_path() && run.filename().empty()) run = run.parent_path();  // "dir/"
  // Accept the metrics file itself as well as its run directory.
  bool is_file = fs::is_regular_file(run);
  return {is_file ? run : run / "metrics.jsonl", is_file ? run.parent_path() : run};
}

// The run directory's own name ("." names the current directory).
std::string dir_name(const fs::path& dir) {
  // A bare name's parent is "": the current directory (absolute("") throws).
  fs::path abs = fs::absolute(dir.empty() ? fs::path(".") : dir).lexically_normal();
  if (abs.filename().empty()) abs = abs.parent_path();
  return abs.filename().empty() ? abs.string() : abs.filename().string();
}

void run_plot(const PlotArgs& a) {
  using namespace slipstream::plot;
  if (!(a.smooth >= 0 && a.smooth < 1))
    throw PlotError("--smooth " + std::to_string(a.smooth) +
                    ": expected a weight in [0, 1), e.g. 0.9 (0 = off)");
  std::optional<Format> flag_format;
  if (!a.format.empty() && !(flag_format = parse_format(a.format)))
    throw PlotError("--format " + a.format + ": expected svg, png or pdf");

  std::vector<RunPaths> paths;
  for (const auto& r : a.runs) paths.push_back(locate(r));
  fs::path out;
  Format format = flag_format.value_or(Format::svg);
  if (a.out.empty()) {
    // One run: next to its metrics. Several: here, as none of them owns the picture.
    out = (paths.size() == 1 ? paths.front().dir : fs::path()) / "curves";
    out += extension(format);
  } else {
    out = a.out;
    std::optional<Format> by_name = format_of(out);
    if (!by_name && !flag_format)
      throw PlotError("--out " + out.string() + ": the file name must end in .svg, .png or .pdf");
    if (by_name && flag_format && *by_name != *flag_format)
      throw PlotError("--out " + out.string() + " does not match --format " + a.format);
    format = by_name.value_or(format);
  }

  ChartOptions opt;
  for (const auto& m : a.metrics) {
    // "--metrics ," (an empty list) takes the argument after it: an option there is no key.
    if (m.starts_with("-"))
      throw PlotError("--metrics: '" + m +
                      "' is an option, not a metric key (give the keys right after --metrics, "
                      "comma-separated)");
    if (!m.empty()) opt.metrics.push_back(m);  // "--metrics loss," leaves an empty entry
  }
  if (!a.metrics.empty() && opt.metrics.empty())
    throw PlotError("--metrics: no metric key given (e.g. --metrics loss,acc/*)");
  opt.log_loss = !a.linear;
  opt.smooth = a.smooth;

  std::vector<Run> runs;
  std::map<std::string, int> name_count;
  for (const auto& p : paths) ++name_count[dir_name(p.dir)];
  size_t rows = 0;
  for (const auto& p : paths) {
    MetricsLog log = load_metrics(p.metrics);
    std::string skipped = skipped_summary(p.metrics, log);
    if (!skipped.empty()) std::cerr << skipped << "\n";
    std::string name = dir_name(p.dir);
    // Two runs called "latest" under different parents still need different legend entries.
    if (name_count[name] > 1) name = dir_name(p.dir.parent_path()) + "/" + name;
    rows += log.rows.size();
    runs.push_back({name, std::move(log)});
  }
  for (const auto& m : unmatched_metrics(runs, opt.metrics))
    std::cerr << "warning: no data for metric '" << m << "'\n";
  // A run whose every loss is null (it diverged) has no loss curve: said, not left out unsaid.
  if (opt.metrics.empty())
    for (const auto& r : runs) {
      bool keyed = false, finite = false;
      for (const auto& row : r.log.rows)
        if (auto it = row.values.find("loss"); it != row.values.end()) {
          keyed = true;
          finite = finite || std::isfinite(it->second);
        }
      if (keyed && !finite)
        std::cerr << "warning: " << r.name
                  << ": no row's loss is finite (the run diverged?): no loss curve of it\n";
    }
  Figure fig;
  try {
    fig = build_figure(runs, opt);
  } catch (const PlotError& e) {
    // Name the file when there is only one to blame.
    if (paths.size() == 1) throw PlotError(paths.front().metrics.string() + ": " + e.what());
    throw;
  }

  int width = kDefaultWidth, height = default_height(fig);
  if (!a.size.empty()) {
    char x = 0;
    std::istringstream in(a.size);
    if (!(in >> width >> x >> height) || x != 'x' || !in.eof() || width < 200 || height < 150 ||
        width > 10000 || height > 10000)
      throw PlotError("--size " + a.size + ": expected WIDTHxHEIGHT, 200x150 to 10000x10000");
  }
  Layout layout = write_figure(fig, out, format, width, height);

  size_t curves = 0;
  for (const auto& sec : fig.sections)
    for (const auto& row : sec.rows)
      for (const auto& ax : row) curves += ax.series.size();
  size_t panels = layout.axes.size();
  std::cout << "wrote " << out.string() << " (" << width << "x" << height << " "
            << (extension(format) + 1) << ", " << panels << " panel" << (panels == 1 ? "" : "s")
            << ", " << curves << " curves from " << runs.size() << " run"
            << (runs.size() == 1 ? "" : "s") << ", " << rows << " rows)\n";
}

}  // namespace

void add_plot_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plot", "Draw loss/accuracy/lr curves from runs' metrics.jsonl (SVG, PNG or PDF)");
  auto args = std::make_shared<PlotArgs>();
  cmd->add_option("run_dir", args->runs,
                  "run directories (or their metrics.jsonl); several are overlaid, one colour "
                  "per run")
      ->required();
  cmd->add_option("--out,-o", args->out,
                  "output file; .svg, .png or .pdf picks the format (default RUN_DIR/curves.svg, "
                  "or ./curves.svg for several runs)");
  cmd->add_option("--format", args->format,
                  "svg, png or pdf: the format of the default output file, or of an --out "
                  "without one of those extensions");
  cmd->add_option("--metrics", args->metrics,
                  "comma-separated metric keys; 'acc/*' matches a prefix (default: loss, nll "
                  "where it differs from loss, acc/*, lr; each with its baseline/ key)")
      ->delimiter(',')
      ->allow_extra_args(false);  // one list per --metrics, so run directories may follow
  cmd->add_option("--size", args->size,
                  "image size WIDTHxHEIGHT (default 960 wide, 250 px per panel, 180 per grid row)");
  cmd->add_flag("--linear", args->linear, "loss on a linear y axis (default: log)");
  cmd->add_option("--smooth", args->smooth,
                  "EMA weight in [0, 1) for training curves, as TensorBoard's slider; the raw "
                  "curve stays, faint (default 0: off)");
  cmd->callback([args] {
    try {
      run_plot(*args);
    } catch (const std::exception& e) {
      std::cerr << "slipstream plot: " << e.what() << "\n";
      set_exit_code(kExitFailure);
    }
  });
}

#else
// A build configured with -DSLIPSTREAM_PLOT=OFF (a machine without cairo): the command says so.
void add_plot_commands(CLI::App& app) {
  auto* cmd = app.add_subcommand("plot", "Draw curves from metrics.jsonl (not in this build)");
  cmd->allow_extras();
  cmd->callback([] {
    std::cerr << "slipstream plot: this build has no plotting (configured with "
                 "-DSLIPSTREAM_PLOT=OFF, or without cairo); install libcairo2-dev and rebuild, "
                 "or plot metrics.jsonl / the TensorBoard events file elsewhere\n";
    set_exit_code(kExitFailure);
  });
}
#endif

}  // namespace slipstream::cli
