// The metrics book of a run: train rows (averaged over log_every steps and the ranks),
// validation rows, metrics.jsonl and the events file, and the console lines that show them.
#include "engine/runner_impl.h"

namespace fs = std::filesystem;

namespace slipstream {

using namespace runner_detail;

// A run of several ranks (run.reduce_over_ranks set): every rank's (value × weight, weight) sums
// and `extra` numbers added up into every rank's copy. The ranks that measured something hold
// the same metric names; a rank that measured nothing (no validation games of its own) takes
// them from the others. `what` names the reduction in a timeout.
void Runner::Impl::sum_over_ranks(std::map<std::string, std::pair<double, double>>& sums,
                                  std::span<double> extra, const std::string& what) {
  if (run.world_size <= 1 || !run.reduce_over_ranks) return;
  const auto& reduce = run.reduce_over_ranks;
  std::string names;
  for (auto& [name, sw] : sums) names += name + '\n';
  uint32_t h = 2166136261u;
  for (char c : names) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  // [longest names, largest hash, -smallest hash over the ranks that measured something,
  // whether a rank measured nothing]
  const bool measured = !sums.empty();
  double head[4] = {static_cast<double>(names.size()), measured ? double(h) : -1.0,
                    measured ? -double(h) : -1e18, measured ? 0.0 : 1.0};
  reduce(head, RankReduce::max, what);
  if (head[0] > 0 && head[1] != -head[2])
    throw std::runtime_error(what + ": the ranks recorded different metrics");
  if (head[0] > 0 && head[3] > 0) {  // the names, from the ranks that have them
    std::vector<double> bytes(static_cast<size_t>(head[0]), 0.0);
    for (size_t b = 0; b < names.size(); ++b) bytes[b] = static_cast<unsigned char>(names[b]);
    reduce(bytes, RankReduce::max, what);
    std::string all;
    for (double b : bytes) all += static_cast<char>(static_cast<int>(b));
    if (!measured)
      for (size_t a = 0, e; (e = all.find('\n', a)) != std::string::npos; a = e + 1)
        sums[all.substr(a, e - a)] = {0.0, 0.0};
  }
  // [extra..., (sum, weight) per name]
  std::vector<double> v(extra.begin(), extra.end());
  for (auto& [name, sw] : sums) {
    v.push_back(sw.first);
    v.push_back(sw.second);
  }
  reduce(v, RankReduce::sum, what);
  std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(extra.size()), extra.begin());
  size_t i = extra.size();
  for (auto& [name, sw] : sums) {
    sw = {v[i], v[i + 1]};
    i += 2;
  }
}

void Runner::Impl::log_line(const std::string& s, bool every_rank) {
  std::lock_guard lock(log_mu);  // stages log from their threads too (StageContext::log)
  // The other ranks' log is quiet; what every rank says goes to their stdout.
  std::ostream& out = every_rank && log == &quiet ? std::cout : *log;
  if (tty) out << "\r\033[K";
  out << s << "\n" << std::flush;
}

void Runner::Impl::write_metrics_row(const char* split, const std::map<std::string, double>& values,
                                     double sps, double wait_pct, const nlohmann::json& extra) {
  if (!metrics_file.is_open() || metrics_file_failed) return;
  nlohmann::json row;
  row["step"] = run.step.load();
  row["split"] = split;
  row["time"] = static_cast<double>(unix_ns()) * 1e-9;
  for (const auto& [k, v] : values)
    row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  if (sps >= 0) row["samples_per_s"] = sps;
  if (wait_pct >= 0) row["data_wait_pct"] = wait_pct;
  for (const auto& [k, v] : extra.items()) row[k] = v;
  if (!metrics_file.append(row.dump())) {
    metrics_file_failed = true;
    record_failure(metrics_file.error());
    return;
  }
  if (metrics_file.took_over_gone())
    log_line("warning: " + metrics_file.path() +
             " was gone (deleted or moved while the run ran): a new one takes the rows from step " +
             std::to_string(run.step.load()) + "; the rows before are not in it");
  // After the events file failed, metrics.jsonl still takes the rows (the end row says why).
  if (!events_file.is_open() || !metrics_failure.empty()) return;
  auto scalars = row_scalars(split, row, values);
  if (scalars.empty()) return;  // an end row: nothing to plot
  if (!events_file.write_scalars(static_cast<int64_t>(run.step.load()), row["time"].get<double>(),
                                 scalars))
    record_failure(events_file.error());
}

// Training on without a record of it would lose the run's history silently: stop the way
// SIGINT does (the step finishes, stages save) and fail at the end.
void Runner::Impl::record_failure(const std::string& why) {
  if (!metrics_failure.empty()) return;
  metrics_failure = why;
  log_line("error: " + metrics_failure + "; stopping the run");
  run.stop_requested = true;
}

// A row's numbers as TensorBoard scalars tagged "<split>/<key>" (train/loss, validation/loss).
// A value the row holds as null (NaN, Inf) goes as itself: TensorBoard plots those.
std::vector<tensorboard::Scalar> Runner::Impl::row_scalars(
    const std::string& split, const nlohmann::json& row,
    const std::map<std::string, double>& values) {
  std::vector<tensorboard::Scalar> out;
  for (const auto& [k, v] : row.items()) {
    if (k == "step" || k == "time") continue;
    if (v.is_number()) {
      out.push_back({split + "/" + k, v.get<double>()});
    } else if (v.is_null()) {
      if (auto it = values.find(k); it != values.end())
        out.push_back({split + "/" + k, it->second});
    }
  }
  return out;
}

// The train row for the steps since the last one; `steps_averaged` says how many (a resumed
// run's first window, the last window and a diverged run's may be shorter than log_every).
// With several ranks, the figures of the global batch: every rank's sums added up (samples/s
// too; the data wait is this rank's).
void Runner::Impl::write_train_row() {
  std::map<std::string, std::pair<double, double>> sums;
  {
    std::lock_guard lock(metrics_mu);
    sums.swap(interval);
  }
  double samples_all = static_cast<double>(interval_samples);
  sum_over_ranks(sums, std::span<double>(&samples_all, 1),
                 "the train metrics of step " + std::to_string(run.step));
  std::map<std::string, double> avg;
  for (auto& [k, v] : sums)
    if (v.second > 0) avg[k] = v.first / v.second;
  double secs = static_cast<double>(now_ns() - interval_start_ns) * 1e-9;
  double sps = secs > 0 ? samples_all / secs : 0;
  double wait = secs > 0 ? 100.0 * static_cast<double>(interval_section_wait_ns) * 1e-9 / secs : 0;
  last_train = avg;
  write_metrics_row("train", avg, sps, wait, {{"steps_averaged", interval_steps}});
  char head[128];
  std::snprintf(head, sizeof head, "step %llu", static_cast<unsigned long long>(run.step));
  std::string line = head;
  if (run.total_steps) line += "/" + std::to_string(run.total_steps);
  char tail[96];
  std::snprintf(tail, sizeof tail, " | %.1f samples/s | data wait %.0f%%", sps, wait);
  log_line(line + " |" + format_metrics(avg, 6) + tail);
  if (cost_note_pending && interval_steps > 0 && secs > 0) {
    cost_note_pending = false;
    const double per_step = secs / static_cast<double>(interval_steps);
    std::string note = "note: on this CPU a step of this run takes " + duration_text(per_step);
    if (run.total_steps > run.step)
      note += "; the remaining " + std::to_string(run.total_steps - run.step) +
              " steps take about " +
              duration_text(per_step * static_cast<double>(run.total_steps - run.step));
    log_line(note);
  }
  interval_start_ns = now_ns();
  interval_samples = interval_steps = interval_section_wait_ns = 0;
}

// "loss" first, then the metrics without a '/' (not one equal to the loss: it would only repeat
// it), then what the stages' schemas ask to show (StageSchema::console_metric/_family).
std::string Runner::Impl::format_metrics(const std::map<std::string, double>& m,
                                         size_t max_items) const {
  std::string s;
  size_t shown = 0;
  auto add = [&](const std::string& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s %.4g", k.c_str(), v);
    s += buf;
    ++shown;
  };
  const auto loss = m.find("loss");
  if (loss != m.end()) add("loss", loss->second);
  for (const auto& [k, v] : m) {
    const bool repeats_loss = loss != m.end() && v == loss->second;
    if (k != "loss" && !repeats_loss && shown < max_items && k.find('/') == std::string::npos)
      add(k, v);
  }
  for (const auto& stage : plan().stages)
    for (const auto& c : stage.schema->console_metrics()) {
      if (!c.family) {
        if (auto it = m.find(c.name); it != m.end()) add(c.label, it->second);
        continue;
      }
      double sum = 0, lo = INFINITY;
      int n = 0;
      for (const auto& [k, v] : m)
        if (k.starts_with(c.name)) sum += v, lo = std::min(lo, v), ++n;
      if (n == 0) continue;
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.3f (min %.3f)", c.label.c_str(), sum / n, lo);
      s += buf;
    }
  return s;
}

// After each step: divergence, metrics row, progress line, validation, early stopping, the
// stages' step_end (checkpoints) and the step limit. Rows come before the checkpoint of the
// same step, so a kill in between costs at most rows that the resumed run writes again.
// On a terminal, between train rows: a bar with the step, rate, elapsed and remaining time (as
// tqdm shows them) and the latest loss, rewritten in place at most 10 times a second.
void Runner::Impl::progress_line() {
  const uint64_t t = now_ns();
  if (t - last_progress_ns < 100'000'000) return;
  last_progress_ns = t;
  const double elapsed = static_cast<double>(t - start_ns) * 1e-9;
  const double rate = elapsed > 0 ? static_cast<double>(steps_this_process) / elapsed : 0;
  std::string s = "\r\033[Kstep " + std::to_string(run.step);
  if (run.total_steps) {
    const double f = static_cast<double>(run.step) / static_cast<double>(run.total_steps);
    char pct[16];
    std::snprintf(pct, sizeof pct, " %3.0f%%", 100 * std::min(1.0, f));
    s += "/" + std::to_string(run.total_steps) + pct + " |" + bar_text(f, 20) + "|";
  }
  if (run.micro_batches_per_step > 1)
    s += " batch " + std::to_string(micro_in_step) + "/" +
         std::to_string(run.micro_batches_per_step);
  char r[48];
  std::snprintf(r, sizeof r, " %.2f steps/s", rate);
  s += r;
  s += " " + clock_text(elapsed);
  if (run.total_steps > run.step && rate > 0)
    s += "<" + clock_text(static_cast<double>(run.total_steps - run.step) / rate);
  const double l = last_loss.load();
  if (std::isfinite(l)) {
    char b[32];
    std::snprintf(b, sizeof b, " loss %.4g", l);
    s += b;
  }
  *log << s << std::flush;
}

}  // namespace slipstream
