// Forward-only passes through the graph: validation during training, scoring a checkpoint
// (Runner::evaluate), a stream frame by frame (Runner::stream and the caller-fed stream), and a
// single gradient step for tests and tools.
#include "engine/runner_impl.h"

namespace fs = std::filesystem;

namespace slipstream {

using namespace runner_detail;

void Runner::Impl::ensure_eval_copies() {
  if (!eval_stages.empty()) return;
  for (int k = 0; k < plan().section_begin; ++k) {
    eval_stages.push_back(StageRegistry::create(plan().stages[k].schema->kind()));
    auto ctx = std::make_unique<StageContext>(graph->context(k));
    ctx->split_ = StageContext::Split::validation;
    eval_contexts.push_back(std::move(ctx));
  }
  for (size_t k = 0; k < eval_stages.size(); ++k) eval_stages[k]->setup(*eval_contexts[k]);
}

std::map<std::string, double> Runner::Impl::validate() {
  ensure_eval_copies();
  std::vector<Stage*> st;
  std::vector<StageContext*> cx;
  for (size_t k = 0; k < eval_stages.size(); ++k)
    st.push_back(eval_stages[k].get()), cx.push_back(eval_contexts[k].get());
  for (size_t k = 0; k < n(); ++k) graph->stage(k).validation_begin(graph->context(k));
  const std::string label = "validation @ step " + std::to_string(run.step);
  const int64_t batches = plan().run.integer("validate_batches");
  if (run.world_size <= 1 || !run.reduce_over_ranks)
    return forward_pass(st, cx, batches, label).metrics;

  // Several ranks: rank r evaluates batches r, r + world, ... of the one validation set (or,
  // when each rank's source holds its own share, its own first batches/world), and the sums
  // are added up: the figures of one process evaluating them all, in a world-th of the time.
  const auto world = static_cast<uint64_t>(run.world_size);
  Pass pass =
      run.validation_per_rank
          ? forward_pass(st, cx, batches / run.world_size + (batches % run.world_size != 0), label)
          : forward_pass(st, cx, batches, label, nullptr, static_cast<uint64_t>(run.rank), world);
  sum_over_ranks(pass.sums, {}, label);
  std::map<std::string, double> metrics;
  for (auto& [name, sw] : pass.sums)
    if (sw.second > 0) metrics[name] = sw.first / sw.second;
  return metrics;
}

// A pulled batch through the data transforms of `st` and the section's forward up to the loss
// (`with_loss`: through it too, never past it). Returns the nanoseconds the section's stages
// before the loss took: the model's answer, without scoring it. On a stream with run.cuda_graph
// on, the section's work for the frame is recorded and replayed as a CUDA graph, as a training
// step's is (engine/step_graphs.h): a bot's frame is a few hundred small launches. `answer`
// (stream_next's) runs as the last stage before the loss, so its launches and read-backs are
// part of that recorded work: a policy's draws replay with the frame's graph.
uint64_t Runner::Impl::forward_one(std::vector<Stage*>& st, std::vector<StageContext*>& cx,
                                   Batch& b, bool with_loss, const StreamAnswer& answer) {
  for (size_t k = static_cast<size_t>(plan().head_end); k < st.size(); ++k)
    as_stage(k, b.index, [&] { st[k]->forward(b, *cx[k]); });
  enter_section(b);
  const uint64_t t0 = now_ns();
  uint64_t answer_ns = 0;
  auto stages = [&] {
    bool answered = false;
    size_t last = n();  // the last stage that answered
    auto answer_done = [&] {
      answered = true;
      answer_ns = now_ns() - t0;
      if (answer && last < n()) as_stage(last, b.index, [&] { answer(b); });
    };
    for (size_t k = plan().section_begin; k < n(); ++k) {
      if (plan().stages[k].after_loss) continue;
      if (!answered && plan().stages[k].schema->stage_role() == StageRole::loss) {
        answer_done();
        if (!with_loss) return;
      }
      as_stage(k, b.index, [&] { graph->stage(k).forward(b, graph->context(k)); });
      if (!answered) last = k;
    }
    if (!answered) answer_done();  // a section without a loss
  };
  if (run.streaming && step_graphs && step_graphs->enabled()) {
    capture::StepRecorder rec(run.exec->stream());
    tbb::this_task_arena::isolate(stages);  // no other task's launches join the frame's
    finish_recorded(rec, ++stream_frames);
    answer_ns = now_ns() - t0;  // the recorded work is enqueued here, not as the stages ran
  } else {
    if (run.streaming && step_graphs) step_graphs->ran_without_graph();
    stages();
  }
  complete_read_backs(b);
  return answer_ns ? answer_ns : now_ns() - t0;
}

// Up to `batches` batches from the start of the data stages `st` (head and data transforms,
// split validation) through the section's forward with training off. `label` heads the
// terminal's progress line.
// With `on_batch`, each batch is handed to it after the forward with the seconds the section's
// stages before the loss took (the model's answer, without scoring it).
// With `stride` > 1, only batches first, first + stride, ... below `batches`.
Runner::Impl::Pass Runner::Impl::forward_pass(std::vector<Stage*>& st,
                                              std::vector<StageContext*>& cx, int64_t batches,
                                              const std::string& label,
                                              const StreamCallback* on_batch, uint64_t first,
                                              uint64_t stride) {
  Pass pass;
  size_t head_end = static_cast<size_t>(plan().head_end);
  std::vector<uint64_t> next(head_end, 0);
  for (size_t k = 0; k < head_end; ++k) st[k]->seek(0, *cx[k]);
  {
    std::lock_guard lock(metrics_mu);
    validation.clear();
    in_validation = true;
  }
  run.training = false;
  try {
    for (auto i = static_cast<int64_t>(first); i < batches; i += static_cast<int64_t>(stride)) {
      if (stride != 1) {  // each head stage to batch i
        uint64_t idx = static_cast<uint64_t>(i);
        for (size_t k = head_end; k-- > 0;) {
          next[k] = idx;
          st[k]->seek(idx, *cx[k]);
          idx = st[k]->upstream_seek_index(idx);
        }
      }
      if (tty) {
        *log << "\r\033[K" << label << ": batch " << i + 1;
        if (batches != std::numeric_limits<int64_t>::max()) *log << "/" << batches;  // not "all"
        *log << std::flush;
      }
      Batch b = graph->new_batch();
      if (!pull(st, cx, next, head_end - 1, b, false)) break;
      const uint64_t answer_ns = forward_one(st, cx, b, true);
      if (on_batch) (*on_batch)(b, static_cast<double>(answer_ns) * 1e-9);
      ++pass.batches;
      pass.samples += b.samples;
    }
  } catch (...) {
    run.training = true;
    in_validation = false;
    throw;
  }
  run.training = true;
  {
    std::lock_guard lock(metrics_mu);
    in_validation = false;
    for (auto& [k, v] : validation)
      if (v.second > 0) pass.metrics[k] = v.first / v.second;
    pass.sums.insert(validation.begin(), validation.end());
  }
  return pass;
}

// A validation pass at run.step: its row, the stages' validation_end (best checkpoints), early
// stopping.
void Runner::Impl::validation_pass(uint64_t batch_index) {
  auto v = validate();
  last_validation = v;
  last_validated_step = run.step;
  if (v.empty()) {
    // Nothing scored (every window masked: its games left out as unreadable since the split):
    // said as that, with a row that says it, not a bare line and a row without figures.
    write_metrics_row("validation", v, -1, -1, {{"note", "no validation window was scored"}});
    log_line("validation @ step " + std::to_string(run.step) +
             ": no validation window was scored (its games could not be read: see the warnings "
             "above)");
  } else {
    write_metrics_row("validation", v, -1, -1);
    log_line("validation @ step " + std::to_string(run.step) + ":" + format_metrics(v, 6));
  }
  gather_spread_state();
  // Early stopping's books first: the best checkpoint validation_end writes carries them as
  // they stand after this validation (a resume from it counts on as the run did).
  const int64_t patience = plan().run.integer("early_stop_patience");
  auto it = v.find("loss");
  bool stop_early = false;
  if (it != v.end()) {
    last_validation_loss = it->second;
    if (it->second < run.best_validation_loss) {
      run.best_validation_loss = it->second;
      best_validation_loss = it->second;
      run.validations_without_improvement = 0;
    } else if (patience > 0 && ++run.validations_without_improvement >= patience) {
      stop_early = true;
    }
  }
  for (size_t k = 0; k < n(); ++k)
    timed(k, batch_index, [&] { graph->stage(k).validation_end(v, graph->context(k)); });
  if (stop_early) {
    log_line("early stop: validation loss has not improved for " + std::to_string(patience) +
             " validations");
    early_stopped = true;
    run.stop_requested = true;
  }
}

EvalResult Runner::evaluate(const std::string& checkpoint, const StreamCallback& on_batch) {
  return impl_->evaluate(checkpoint, on_batch ? &on_batch : nullptr, false);
}

EvalResult Runner::stream(const std::string& checkpoint, const StreamCallback& on_batch) {
  return impl_->evaluate(checkpoint, &on_batch, true);
}

EvalResult Runner::Impl::evaluate(const std::string& checkpoint, const StreamCallback* on_batch,
                                  bool streaming) {
  std::optional<tbb::global_control> threads;
  if (int64_t t = plan().run.integer("threads"); t > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(t));
  *log << "device: " << device_reason << "\n";
  const CheckpointInfo info = open_checkpoint(checkpoint, streaming);
  const size_t sb = static_cast<size_t>(plan().section_begin);
  std::vector<Stage*> st;
  std::vector<StageContext*> cx;
  for (size_t k = 0; k < sb; ++k) st.push_back(&graph->stage(k)), cx.push_back(&graph->context(k));
  const uint64_t t0 = now_ns();
  Pass pass = forward_pass(st, cx, std::numeric_limits<int64_t>::max(),
                           streaming ? "stream" : "eval", on_batch);
  if (tty) *log << "\r\033[K" << std::flush;
  EvalResult r;
  r.metrics = std::move(pass.metrics);
  r.seconds = static_cast<double>(now_ns() - t0) * 1e-9;
  r.step = info.step;
  r.batches = pass.batches;
  r.samples = pass.samples;
  if (streaming && step_graphs) {
    const StepGraphs::Counts c = step_graphs->counts();
    r.graph_steps = {c.replayed, c.captured, c.issued, c.uncaptured, c.ops};
    r.graph_off_reason = step_graphs->off_reason();
    r.operation_times = operation_times();
  }
  return r;
}

CheckpointInfo Runner::Impl::open_checkpoint(const std::string& checkpoint, bool streaming) {
  run.run_dir.clear();  // writes nothing: no split lists, no checkpoints, no best copies
  // The data stages serve their validation split: every window, in the validation order.
  const size_t sb = static_cast<size_t>(plan().section_begin);
  for (size_t k = 0; k < sb; ++k) graph->context(k).split_ = StageContext::Split::validation;
  if (streaming) {
    // Every stage the batches go through must say what it does with positions.
    for (size_t k = static_cast<size_t>(plan().head_end); k < n(); ++k) {
      const auto& ps = plan().stages[k];
      if (ps.after_loss || ps.schema->streaming_kind() != Streaming::none) continue;
      throw std::runtime_error("stage '" + ps.name + "' (" + ps.schema->kind() +
                               ") cannot run on a stream of frames: its schema does not say "
                               "whether it mixes positions (StageSchema::streaming)");
    }
    run.streaming = true;
  }
  graph->setup();
  // The data stages' state is a position in the training data; the section's (weights, an
  // optimizer's EMA, a loss's statistics) is the model being scored.
  const CheckpointInfo info = load_checkpoint(graph->plan(), checkpoint, sb);
  run.step = info.step;
  for (size_t k = 0; k < n(); ++k)
    as_stage(k, 0, [&] { graph->stage(k).validation_begin(graph->context(k)); });
  if (streaming) begin_stream();
  run.training = false;
  return info;
}

void Runner::Impl::begin_stream() {
  for (size_t k = 0; k < n(); ++k)
    as_stage(k, 0, [&] { graph->stage(k).stream_begin(graph->context(k)); });
}

Graph& Runner::setup_only() {
  impl_->run.run_dir.clear();
  impl_->graph->setup();
  return *impl_->graph;
}

std::map<std::string, double> Runner::gradient_step(const std::string& checkpoint, Batch& out) {
  auto& I = *impl_;
  I.run.run_dir.clear();
  I.graph->setup();
  if (!checkpoint.empty()) {
    load_weights(I.graph->plan(), checkpoint);
    for (size_t k = 0; k < I.n(); ++k)
      I.as_stage(k, 0, [&] { I.graph->stage(k).parameters_replaced(I.graph->context(k)); });
  }
  const size_t sb = static_cast<size_t>(I.plan().section_begin);
  std::vector<Stage*> st;
  std::vector<StageContext*> cx;
  for (size_t k = 0; k < sb; ++k)
    st.push_back(&I.graph->stage(k)), cx.push_back(&I.graph->context(k));
  std::vector<uint64_t> next(static_cast<size_t>(I.plan().head_end), 0);
  out = I.graph->new_batch();
  if (!I.pull(st, cx, next, next.size() - 1, out, false))
    throw std::runtime_error("the graph's data has no batch");
  {
    std::lock_guard lock(I.metrics_mu);
    I.interval.clear();
  }
  // The section as a training step runs it, minus the update stages after the loss.
  I.forward_one(st, cx, out, true);
  for (size_t k = I.n(); k-- > sb;) {
    const auto& ps = I.plan().stages[k];
    if (ps.after_loss || !ps.schema->is_differentiable()) continue;
    I.backward_stage(k, out);
  }
  std::map<std::string, double> metrics;
  std::lock_guard lock(I.metrics_mu);
  for (auto& [name, v] : I.interval)
    if (v.second > 0) metrics[name] = v.first / v.second;
  return metrics;
}

uint64_t Runner::stream_open(const std::string& checkpoint) {
  auto& I = *impl_;
  if (I.fed) throw std::logic_error("Runner::stream_open: the stream is already open");
  const uint64_t step = I.open_checkpoint(checkpoint, true).step;
  const size_t sb = static_cast<size_t>(I.plan().section_begin);
  for (size_t k = 0; k < sb; ++k) {
    I.fed_stages.push_back(&I.graph->stage(k));
    I.fed_contexts.push_back(&I.graph->context(k));
  }
  I.fed_next.assign(static_cast<size_t>(I.plan().head_end), 0);
  for (size_t k = 0; k < I.fed_next.size(); ++k)
    I.as_stage(k, 0, [&] { I.fed_stages[k]->seek(0, *I.fed_contexts[k]); });
  I.fed = true;
  return step;
}

bool Runner::stream_next(Batch& out, const StreamAnswer& answer) {
  auto& I = *impl_;
  if (!I.fed) throw std::logic_error("Runner::stream_next before stream_open");
  out = I.graph->new_batch();
  if (!I.pull(I.fed_stages, I.fed_contexts, I.fed_next, I.fed_next.size() - 1, out, false))
    return false;
  try {
    I.forward_one(I.fed_stages, I.fed_contexts, out, false, answer);
  } catch (...) {
    // No report of this frame may run at a later frame's end, into memory the caller has let go.
    if (I.run.exec) I.run.exec->abandon_read_backs();
    throw;
  }
  return true;
}

void Runner::stream_restart() {
  auto& I = *impl_;
  if (!I.fed) throw std::logic_error("Runner::stream_restart before stream_open");
  I.begin_stream();
}

void Runner::stream_restart_row(int64_t row) {
  auto& I = *impl_;
  if (!I.fed) throw std::logic_error("Runner::stream_restart_row before stream_open");
  for (size_t k = 0; k < I.n(); ++k)
    I.as_stage(k, 0, [&] { I.graph->stage(k).stream_reset_row(row, I.graph->context(k)); });
}

}  // namespace slipstream
