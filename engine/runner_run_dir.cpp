// A run's start: its directory (made fresh or resumed, engine/run_directory.h; locked for its
// life; removed when a fresh run fails before its first step), setup, the resume point or warm
// start, and each stage's start().
#include "engine/runner_impl.h"

#include "engine/crc32c.h"

namespace fs = std::filesystem;

namespace slipstream {

using namespace runner_detail;

// The run directory: a resume's is locked, and written only once the checkpoint has loaded
// into the planned graph (resume_run_dir); a fresh one is made with its config.yaml.
void Runner::Impl::make_run_dir() {
  std::string name = plan().run.string("name");
  if (name.empty()) {
    name = plan().config.preset;
    plan().run.set("name", name, {"<preset>"});
  }
  if (!opt.resume_dir.empty()) {
    run.run_dir = opt.resume_dir;
    if (run.writes_outputs()) dir_lock.emplace(run.run_dir, "resume it");
  } else if (opt.create_run_dir && run.rank == 0) {  // one run directory, written by rank 0
    const fs::path base = fs::path(plan().run.string("runs_dir")) / (name + "-" + run_time_stamp());
    run.run_dir = create_fresh_directory(base.string());
    made_run_dir = true;
    if (startup_signals) startup_signals->arm(run.run_dir);  // before the lock and config.yaml
    dir_lock.emplace(run.run_dir, "start it");
    write_file_atomically((fs::path(run.run_dir) / "config.yaml").string(),
                          resolved_config_yaml(plan()));
  }
}

// A resume whose checkpoint loaded: config.yaml says what the run now is (the previous one is
// kept as config.previous.yaml; run.json has every invocation's command line), and what the
// run wrote past the checkpoint moves aside.
void Runner::Impl::resume_run_dir(const std::string& checkpoint) {
  if (!run.writes_outputs()) return;
  // What lies past the checkpoint goes first: a kill between the two leaves the run at the
  // checkpoint with its former settings, never the new settings beside later checkpoints.
  const SetAside aside = set_aside_past(run.run_dir, run.step);
  if (!aside.dir.empty()) log_line(aside.summary());
  if (update_config_yaml(run.run_dir, resolved_config_yaml(plan())))
    log_line("config.yaml: updated with this resume's settings (was: config.previous.yaml)");
  append_run_info(run.run_dir, {opt.command_line, run.device.str(), checkpoint});
}

// A fresh run that failed before its first step leaves no directory behind.
void Runner::Impl::remove_unstarted_run_dir(const std::string& why) {
  if (!made_run_dir || steps_this_process > 0 || run.run_dir.empty()) return;
  console.reset();
  relocks.clear();
  dir_lock.reset();
  std::error_code ec;
  fs::remove_all(run.run_dir, ec);
  if (!ec) *log << "removed " << run.run_dir << ": the run " << why << " before its first step\n";
}

void Runner::Impl::keep_run_dir_locked() {
  if (!dir_lock || !run.writes_outputs()) return;
  const DirectoryLock& current = relocks.empty() ? *dir_lock : *relocks.back();
  std::error_code ec;
  if (current.held_at_path() || !fs::is_directory(run.run_dir, ec)) return;
  try {
    relocks.push_back(std::make_unique<DirectoryLock>(run.run_dir, "resume it"));
    log_line("warning: " + run.run_dir +
             " was made again (deleted or moved while the run ran): locked again, this run "
             "its one writer");
  } catch (const std::exception& e) {
    // Another process took the directory made again: two writers would interleave its rows
    // and checkpoints. This run writes nothing more there and stops.
    run.run_dir_lost = true;
    metrics_file_failed = true;
    record_failure(std::string(e.what()) +
                   "; this run writes nothing more there (its last "
                   "checkpoint is the newest it wrote)");
  }
}

// Everything before the first batch: setup (which may load a whole dataset), the resume
// point or warm start, the outputs, each stage's start(). False when a resumed run has
// nothing left to do (`result` says so).
bool Runner::Impl::start_steps(RunResult& result) {
  // Said before setup, which may load a whole dataset.
  std::optional<std::string> ckpt;
  if (!opt.resume_dir.empty()) {
    ckpt = opt.resume_checkpoint.empty() ? latest_checkpoint(opt.resume_dir)
                                         : std::optional(opt.resume_checkpoint);
    if (!ckpt) {
      const std::string best = best_checkpoints_note(opt.resume_dir);
      throw std::runtime_error(
          opt.resume_dir + ": no complete periodic checkpoint to resume from" +
          (best.empty() ? " (the run stopped before its first one); to train it from the start "
                          "in a new run directory: slipstream run --config " +
                              (fs::path(opt.resume_dir) / "config.yaml").string()
                        : best));
    }
  }
  if (ckpt) {
    uint64_t s = 0;
    const std::string name = fs::path(*ckpt).filename().string();
    if (run_checkpoint_step(name, s)) resume_step = s;
  }
  // Several ranks: how they add up numbers, before the stages' setup (the loader's may need it).
  if (run.world_size > 1) run.reduce_over_ranks = make_rank_reduce();
  if (run.world_size > 1 && run.reduce_over_ranks) check_ranks_run_one_graph();
  graph->setup();
  if (run.world_size > 1 && !run.gradients_averaged_over_ranks) {
    bool trainable = false;
    for (size_t k = 0; k < n() && !trainable; ++k)
      trainable = !graph->stage(k).parameters().empty();
    if (trainable)
      throw std::runtime_error(
          std::to_string(run.world_size) + " ranks, and nothing averages their gradients: each " +
          "rank would train a model of its own. Put an allreduce stage between the loss and the " +
          "optimizer (backend auto, mpi or nccl), or run one process");
  }
  if (run.micro_batches_per_step > 1)
    log_line("gradient accumulation: a step is one optimizer update of " +
             std::to_string(run.micro_batches_per_step) +
             " batches; run.steps, log_every, validate_every and checkpoints count updates" +
             (run.total_steps
                  ? " (" + std::to_string(run.total_steps) + " steps, " +
                        std::to_string(run.total_steps * run.micro_batches_per_step) + " batches)"
                  : std::string()));

  size_t head_end = static_cast<size_t>(plan().head_end);
  head_next.assign(head_end, 0);
  if (!ckpt && !plan().run.string("init_from").empty()) warm_start();
  if (ckpt && !resume_from(*ckpt)) {
    result.final_step = run.step;
    result.already_complete = true;
    return false;
  }
  if (run.writes_outputs()) {
    if (!ckpt) append_run_info(run.run_dir, {opt.command_line, run.device.str(), ""});
    metrics_file.open((fs::path(run.run_dir) / "metrics.jsonl").string());
    if (plan().run.boolean("tensorboard")) {
      events_file.open_in(run.run_dir);
      // Every process's file starts a session, a fresh run's too: TensorBoard's multiplexer
      // takes only a START after the first for a restart.
      if (!events_file.write_session_start(static_cast<int64_t>(run.step.load()) + 1,
                                           static_cast<double>(unix_ns()) * 1e-9))
        throw std::runtime_error(events_file.error());
    }
  }
  for (size_t k = 0; k < n(); ++k) {
    const auto& ps = plan().stages[k];
    try {
      graph->stage(k).start(graph->context(k));
    } catch (const std::exception& e) {
      throw StageError(ps.name, ps.schema->kind(), run.step, e.what());
    }
  }

  return true;
}

// The run's position from a checkpoint (weights, state, the data stages sought to its next
// batch); false when the run already reached run.steps (nothing to do).
bool Runner::Impl::resume_from(const std::string& ckpt) {
  const size_t head_end = static_cast<size_t>(plan().head_end);
  CheckpointInfo info;
  try {
    info = load_checkpoint(graph->plan(), ckpt);
  } catch (const std::exception& e) {
    // A damaged or diverged file (read_safetensors' errors begin "safetensors PATH:"; not a
    // graph that does not fit, which every checkpoint of the run would share): name the
    // checkpoint before it, which a resume can go on from.
    const std::string what = e.what();
    const std::string name = fs::path(ckpt).filename().string();
    uint64_t step = 0;
    const bool named = run_checkpoint_step(name, step);
    const bool file_level =
        what.starts_with("safetensors ") || what.find("non-finite value(s)") != std::string::npos;
    const auto earlier = named && file_level ? latest_checkpoint(run.run_dir, step) : std::nullopt;
    if (!earlier && what.find(" in the checkpoint but ") != std::string::npos)
      throw std::runtime_error(
          what + "; a resume goes on training the run's own model: drop the --set that changes " +
          "its size (the run's config.yaml has the sizes it was trained with), or train the new " +
          "size as a new run");
    if (!earlier) throw;
    throw std::runtime_error(what + "; the newest checkpoint before it is " + *earlier +
                             ": --resume " + *earlier +
                             " goes on from there (the later ones are moved aside, not deleted)");
  }
  // Each rank's windows and the global batch follow from the number of ranks: another number
  // would continue the run on other data than it was trained on.
  if (info.world_size != run.world_size) {
    auto ranks = [](int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
    throw std::runtime_error(
        ckpt + ": trained by " + ranks(info.world_size) + ", and this resume has " +
        ranks(run.world_size) +
        "; a resume needs the same number (the global batch and each rank's share of the data "
        "follow from it): resume with " +
        ranks(info.world_size) +
        ", or start a new run from these weights with --set run.init_from=" + ckpt);
  }
  run.step = info.step;
  // Batches of a step already trained (a stop between an accumulated step's batches).
  const uint64_t k = run.micro_batches_per_step;
  if (info.next_batch < info.step * k || info.next_batch - info.step * k >= k) {
    // A checkpoint of a whole step sits at batch step x (the batches a step had then).
    const bool whole = info.step > 0 && info.next_batch % info.step == 0;
    std::string setting = "accumulate";  // the parameter that says it, on its stage
    for (const PlannedStage& s : plan().stages)
      for (const ParamSpec& spec : s.schema->params())
        if (spec.micro_batches) setting = s.name + "." + spec.name;
    throw std::runtime_error(
        ckpt + ": step " + std::to_string(info.step) + " at batch " +
        std::to_string(info.next_batch) + " does not fit " + std::to_string(k) +
        " batch(es) per optimizer step: the run was trained with another gradient "
        "accumulation; resume it with the value it had" +
        (whole ? " (" + std::to_string(info.next_batch / info.step) + " batches a step: --set " +
                     setting + "=" + std::to_string(info.next_batch / info.step) + ")"
               : std::string()));
  }
  micro_in_step = info.next_batch - info.step * k;
  // Early stopping counts on from the run's books (a checkpoint written before they were saved:
  // afresh).
  run.best_validation_loss = info.best_validation_loss.value_or(INFINITY);
  run.validations_without_improvement = info.validations_without_improvement;
  if (info.best_validation_loss) best_validation_loss = *info.best_validation_loss;
  uint64_t idx = info.next_batch;
  for (size_t k = head_end; k-- > 0;) {
    head_next[k] = idx;
    graph->stage(k).seek(idx, graph->context(k));
    idx = graph->stage(k).upstream_seek_index(idx);
  }
  log_line("resumed from " + ckpt + " at step " + std::to_string(run.step));
  const auto steps_limit = static_cast<uint64_t>(plan().run.integer("steps"));
  if (steps_limit > 0 && run.step >= steps_limit) {
    log_line("nothing to do: the run already reached run.steps = " + std::to_string(steps_limit) +
             " (raise it with --set run.steps=N to go on)");
    return false;
  }
  // A run that stopped early (its last end row says so) stays stopped while its books reach the
  // patience; a larger one goes on. A rewind to a checkpoint before the stop trains as before.
  const int64_t patience = plan().run.integer("early_stop_patience");
  if (patience > 0 && run.validations_without_improvement >= patience &&
      MetricsLog::last_end_reason((fs::path(opt.resume_dir) / "metrics.jsonl").string()) ==
          "early stop") {
    log_line("nothing to do: the run stopped early, " +
             std::to_string(run.validations_without_improvement) +
             " validations without a better loss (run.early_stop_patience = " +
             std::to_string(patience) +
             "; --set run.early_stop_patience=N with a larger N, or 0, goes on)");
    return false;
  }
  // Events files are not rewritten: the resumed run starts a new one (below) whose session
  // start has TensorBoard drop the older files' steps past the checkpoint.
  resume_run_dir(ckpt);
  return true;
}

// Ranks given different graphs (a preset edited on one node, a --set on one rank's command
// line) would exchange buffers of other sizes, or train with other seeds: the error an MPI call
// then gives names nothing of the cause. Every rank's resolved graph, by its checksum, first.
void Runner::Impl::check_ranks_run_one_graph() {
  // The resolved graph without what may differ between the ranks of one run: each rank's
  // device (cuda:$LOCAL_RANK), threads, and plugin paths as each node mounts them.
  std::string text;
  {
    std::istringstream all(resolved_config_yaml(plan()));
    bool in_plugins = false;
    for (std::string line; std::getline(all, line);) {
      const size_t first = line.find_first_not_of(' ');
      const std::string_view body =
          first == std::string::npos ? "" : std::string_view(line).substr(first);
      if (line.starts_with("#")) continue;
      if (first == 0) in_plugins = line.starts_with("plugins:");
      if (in_plugins || body.starts_with("device:") || body.starts_with("threads:")) continue;
      text += line + "\n";
    }
  }
  const uint32_t sum = crc32c(text.data(), text.size());
  double low[2] = {static_cast<double>(sum), static_cast<double>(text.size())};
  double high[2] = {low[0], low[1]};
  run.reduce_over_ranks(low, RankReduce::min, "the ranks' graphs");
  run.reduce_over_ranks(high, RankReduce::max, "the ranks' graphs");
  if (low[0] != high[0] || low[1] != high[1])
    throw std::runtime_error(
        "the ranks were given different configurations (their resolved graphs differ; this "
        "rank's: " +
        std::to_string(text.size()) + " bytes, checksum " + std::to_string(sum) +
        "): a preset, graph file or --set that is not the same on every rank (run.seed, a "
        "model size, a path), or different slipstream builds. Every rank runs the same command; "
        "`slipstream validate --print` shows what a rank's command resolves to");
}

// run.init_from: a warm start, weights only (a resume has its own weights, and the first
// run's were these).
void Runner::Impl::warm_start() {
  const std::string from = plan().run.string("init_from");
  {
    const CheckpointPath where = find_checkpoint(from);
    if (!where.error.empty()) throw std::runtime_error("run.init_from: " + where.error);
    const std::string& dir = where.checkpoint;
    uint64_t from_step = 0;
    try {
      from_step = load_weights(graph->plan(), dir);
    } catch (const std::exception& e) {
      throw std::runtime_error("run.init_from: " + std::string(e.what()) +
                               " (init_from copies weights into a graph of the same stage kinds "
                               "and sizes as the run that wrote them)");
    }
    for (size_t k = 0; k < n(); ++k)
      as_stage(k, 0, [&] { graph->stage(k).parameters_replaced(graph->context(k)); });
    log_line("initialised the weights from " + dir + " (its step " + std::to_string(from_step) +
             "); optimizer state, schedule and step count start fresh");
  }
}

}  // namespace slipstream
