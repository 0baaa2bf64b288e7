#include "engine/runner.h"
#include "engine/atomic_max.h"

#include "engine/runner_impl.h"

namespace fs = std::filesystem;

namespace slipstream {

using namespace runner_detail;

StageError::StageError(std::string stage, std::string kind, uint64_t batch, const std::string& what)
    : std::runtime_error("stage '" + stage + "' (" + kind + "), batch " + std::to_string(batch) +
                         ": " + what),
      stage_(std::move(stage)),
      batch_(batch) {}

// Pulls one batch out of head stage k (source or rebatcher), recursively.
bool Runner::Impl::pull(std::vector<Stage*>& stages, std::vector<StageContext*>& ctxs,
                        std::vector<uint64_t>& next, size_t k, Batch& out, bool count) {
  if (out.slots.size() != plan().slots.size()) out.slots.resize(plan().slots.size());
  out.index = next[k];
  bool ok = false;
  uint64_t t0 = now_ns(), nested = 0;
  try {
    if (plan().stages[k].schema->stage_role() == StageRole::source) {
      // A rebatcher's time holds its pulls from upstream until it ends: only a source's body
      // is counted while it runs.
      const OpenBody open(count ? counters[k].get() : nullptr, t0);
      ok = stages[k]->produce(out, *ctxs[k]);
    } else {
      std::function<bool(Batch&)> up = [&](Batch& in) {
        uint64_t u0 = now_ns();
        bool r = pull(stages, ctxs, next, k - 1, in, count);
        nested += now_ns() - u0;
        return r;
      };
      ok = stages[k]->rebatch(out, up, *ctxs[k]);
    }
  } catch (const StageError&) {
    throw;
  } catch (...) {
    const auto& ps = plan().stages[k];
    throw StageError(ps.name, ps.schema->kind(), out.index, what_of_current_exception());
  }
  if (ok) next[k]++;
  if (count) {
    counters[k]->busy_ns += now_ns() - t0 - nested;
    counters[k]->items_in++;
    if (ok) counters[k]->items_out++;
  }
  return ok;
}

void Runner::Impl::metric(std::string_view name, double value, MetricKind kind, double weight) {
  std::lock_guard lock(metrics_mu);
  auto& m = in_validation ? validation : interval;
  auto& e = m[std::string(name)];
  if (kind == MetricKind::last) {
    e = {value, 1.0};
  } else if (weight > 0) {  // a value measured over nothing adds nothing
    e.first += value * weight;
    e.second += weight;
  }
  if (in_validation) return;
  if (name == "loss") batch_loss.store(value);
  if ((name == "loss" && !std::isfinite(value)) || name == "nonfinite_grad_steps")
    step_nonfinite = true;
}

Runner::Runner(GraphPlan plan, RunOptions options) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.opt = std::move(options);
  LaunchInfo launch = launch_info();
  I.run.rank = I.opt.single_process ? 0 : launch.rank;
  I.run.world_size = I.opt.single_process ? 1 : launch.world_size;
  if (I.opt.log) I.log = I.opt.log;
  // In a multi-process run only rank 0 reports progress; the others would repeat it.
  if (!I.opt.log && launch.rank != 0) I.log = &I.quiet;
  I.tty = I.opt.live_progress.value_or(I.log == &std::cout && isatty(STDOUT_FILENO));
  const Params& rp = plan.run;
  DeviceChoice dc = choose_device(rp.string("device"), launch.local_rank);
  I.run.device = dc.device;
  I.run.precision = rp.string("precision") == "bf16" ? Precision::bf16 : Precision::fp32;
  I.run.bf16_copies = rp.boolean("bf16_copies");
  I.run.seed = static_cast<uint64_t>(rp.integer("seed"));
  I.run.epochs = rp.integer("epochs");
  I.run.max_in_flight = static_cast<uint64_t>(rp.integer("max_in_flight"));
  I.run.total_steps = static_cast<uint64_t>(rp.integer("steps"));
  I.run.log_sink = [this](const std::string& stage, const std::string& line, bool every_rank) {
    impl_->log_line(stage + ": " + line, every_rank);
  };
  I.run.metric_sink = [this](std::string_view name, double v, MetricKind kind, double weight) {
    impl_->metric(name, v, kind, weight);
  };
  if (dc.device.is_cuda()) Pools::enable_pinned_host(true);
  I.device_reason = dc.reason;
  for (const std::string& note : I.opt.notes) I.device_reason += "\n" + note;
  // An allocation that fails names the knob: the graph's batch size.
  for (const auto& [k, p] : batch_size_params(plan)) {
    const PlannedStage& s = plan.stages[k];
    if (s.params.integer(p->name) == kAutoBatchSize)
      throw std::invalid_argument(s.name + "." + p->name +
                                  ": auto is resolved before the run is built "
                                  "(resolve_auto_batch, engine/auto_batch.h)");
    Pools::set_oom_hint("lower " + s.name + "." + p->name + " (now " +
                        std::to_string(s.params.integer(p->name)) + ")" +
                        (dc.device.is_cuda() ? ", or set it to auto" : ""));
  }
  I.run.exec = std::make_shared<ExecContext>(dc.device, dc.emulate_cuda);
  const std::string cuda_graph = rp.string("cuda_graph");
  if (cuda_graph == "on" && !I.run.exec->device_ops())
    throw std::runtime_error(
        "run.cuda_graph: on needs a CUDA device (or device: emulated); this run is on the CPU");
  if (cuda_graph == "on" || (cuda_graph == "auto" && dc.device.is_cuda())) {
    I.step_graphs = std::make_unique<StepGraphs>(*I.run.exec, [&I](int k) {
      const bool known = I.graph && k >= 0 && static_cast<size_t>(k) < I.graph->size();
      return known ? "stage " + I.graph->plan().stages[static_cast<size_t>(k)].name
                   : "stage " + std::to_string(k);
    });
    I.device_reason +=
        "\ncuda graph: on (a training step's or a stream frame's work is captured once it "
        "recurs, then replayed; "
        "run.cuda_graph=off turns it off)";
  }
  if (I.opt.time_operations_after_batches && !I.step_graphs)
    throw std::invalid_argument(
        "timing the step's operations reads time stamps in its CUDA graph: it needs a CUDA "
        "device (or device: emulated) with run.cuda_graph on (auto is on only on a CUDA "
        "device); this run " +
        std::string(I.run.exec->device_ops() ? "has it off" : "is on the CPU"));
  if (I.opt.time_operations_after_batches)
    I.step_graphs->time_operations(*I.opt.time_operations_after_batches);
  I.graph = std::make_unique<Graph>(std::move(plan), I.run);
  for (size_t k = 0; k < I.graph->size(); ++k)
    I.counters.push_back(std::make_unique<LiveCounters>());
}

Runner::~Runner() = default;

Graph& Runner::graph() {
  return *impl_->graph;
}

RunState& Runner::state() {
  return impl_->run;
}

uint64_t Runner::max_in_flight_seen() const {
  return impl_->max_in_flight_seen.load();
}

void Runner::request_stop(bool as_interrupt) {
  if (as_interrupt) impl_->run.interrupted = true;
  impl_->run.stop_requested = true;
}

Runner::Counters Runner::counters(size_t stage) const {
  const auto& c = *impl_->counters.at(stage);
  Counters out;
  out.items_in = c.items_in.load();
  out.items_out = c.items_out.load();
  out.busy_ns = c.busy_ns.load();
  out.blocked_output_ns = c.blocked_ns.load();
  uint64_t e = c.enqueued.load(), s = c.started.load();
  out.queue_depth = static_cast<uint32_t>(e - std::min(e, s));
  out.max_queue_depth = c.max_queue.load();
  return out;
}

RunResult Runner::run() {
  return impl_->execute();
}

RunResult Runner::Impl::execute() {
  try {
    RunResult r = execute_steps();
    // Stopped by a signal before its first step (just after its setup): nothing to resume.
    if (r.interrupted && steps_this_process == 0 && made_run_dir) {
      steps_began = false;  // (the publisher is stopped)
      remove_unstarted_run_dir("was stopped");
      r.run_dir.clear();
    }
    console.reset();
    relocks.clear();
    dir_lock.reset();
    return r;
  } catch (const std::exception& e) {
    startup_signals.reset();  // a failed setup: the signals as before the run
    // The caller reports the error on the terminal; the run's console.log keeps it too.
    if (console) console->note(std::string("error: ") + e.what());
    remove_unstarted_run_dir();
    console.reset();
    relocks.clear();
    dir_lock.reset();
    throw;
  }
}

RunResult Runner::Impl::execute_steps() {
  RunResult result;
  // Before anything is written: a limit that would hang the run instead of failing it.
  const AddressSpaceCheck address_space = check_address_space_limit();
  if (!address_space.refusal.empty()) throw std::runtime_error(address_space.refusal);
  std::optional<tbb::global_control> threads;
  if (int64_t t = plan().run.integer("threads"); t > 0)
    threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(t));
  // Before the first line: a reader that goes away (`| head -1`) must not end the run.
  std::optional<PipeSignalIgnored> pipe_ignored;
  if (opt.handle_sigint) pipe_ignored.emplace();
  // A stop signal while a fresh run sets up takes its directory with it (engine/stop_signals.h):
  // installed before the directory is made, armed by make_run_dir as soon as it is.
  if (opt.handle_sigint) startup_signals.emplace();
  make_run_dir();
  result.run_dir = run.run_dir;
  if (run.writes_outputs() && !console)
    console.emplace((fs::path(run.run_dir) / "console.log").string());
  *log << "device: " << device_reason << "\n";
  if (!address_space.note.empty()) log_line(address_space.note);
  if (plan().config.sized_for == "gpu" && !run.device.is_cuda()) {
    log_line("note: '" + plan().config.preset +
             "' is sized for a GPU and runs on the CPU here; the first train row says what its "
             "steps cost (cpu_quick is sized for a CPU)");
    cost_note_pending = true;
  }
  if (run.precision == Precision::bf16 && !run.exec->device_ops()) {
    const std::string what = cpu_bf16_description();
    log_line("note: precision bf16 on the CPU: " +
             (what.empty() ? std::string("the GEMMs' operands are rounded to bf16") : what));
  }
  // slipstream-smi sees the run from here: `starting` through setup (a dataset's decoding may
  // take minutes), then its steps.
  start_unix = unix_ns();
  start_publisher();
  bool started = false;
  try {
    started = start_steps(result);
  } catch (...) {
    stop_publisher(stats::RunState::failed);
    record.reset();
    throw;
  }
  if (!started) {
    startup_signals.reset();
    stop_publisher(stats::RunState::done);
    record.reset();
    return result;
  }

  // SIGTERM and the others too (engine/stop_signals.h): schedulers send them before killing a
  // job, and the step deserves its checkpoint. They take over from the start-up handlers with
  // no moment between.
  std::optional<StopSignals> stop_signals;
  if (opt.handle_sigint) stop_signals.emplace();
  startup_signals.reset();
  start_ns = now_ns();
  interval_start_ns = start_ns;
  steps_began = true;  // after start_ns: the publisher reads it once this says so

  std::vector<Stage*> stages;
  std::vector<StageContext*> ctxs;
  for (size_t k = 0; k < n(); ++k)
    stages.push_back(&graph->stage(k)), ctxs.push_back(&graph->context(k));

  const uint64_t t_start = now_ns();
  std::exception_ptr failure = run_flow_graph(stages, ctxs);
  int stop_signal = opt.handle_sigint ? StopSignals::take() : 0;
  if (stop_signal != 0) run.interrupted = true;
  if (tty) *log << "\n";

  finishing = true;
  failure = end_steps(failure, stop_signal, stages, ctxs);
  stop_publisher(failure ? stats::RunState::failed : stats::RunState::done);
  record.reset();  // the run is over: its record goes away (slipstream-smi shows live runs)
  stop_signals.reset();
  if (failure) std::rethrow_exception(failure);
  if (data_ended_before) {
    result.final_step = run.step;
    result.already_complete = true;
    return result;
  }

  fill_result(result, stop_signal, t_start);
  return result;
}

// The flow graph of the steps (docs/architecture.md, "How a graph runs"): the pulled head,
// the limiter, the data transforms, the serial trainable section. Returns what failed.
std::exception_ptr Runner::Impl::run_flow_graph(std::vector<Stage*>& stages,
                                                std::vector<StageContext*>& ctxs) {
  const size_t head_end = static_cast<size_t>(plan().head_end);
  tbb::flow::graph g;
  const size_t max_in_flight = static_cast<size_t>(plan().run.integer("max_in_flight"));
  // RunOptions::resident_batches: the batches as they reached the section, kept by its thread.
  std::vector<std::shared_ptr<const Batch>> resident;
  std::atomic<bool> resident_full{false};
  size_t first_after_head = head_end < n() ? head_end : n();
  tbb::flow::input_node<Msg> source(g, [&](tbb::flow_control& fc) -> Msg {
    uint64_t t = now_ns();
    if (head_last_return_ns) counters[head_end - 1]->blocked_ns += t - head_last_return_ns;
    if (run.stop_requested || (opt.handle_sigint && StopSignals::received() != 0)) {
      fc.stop();
      return {};
    }
    if (resident_full.load()) {  // the step alone: a resident batch again, nothing loaded
      auto b = std::make_shared<Batch>(*resident[head_order % resident.size()]);
      if (first_after_head < n()) counters[first_after_head]->enqueued++;
      head_last_return_ns = now_ns();
      return Msg{head_order++, std::move(b), true};
    }
    auto b = std::make_shared<Batch>();
    if (!pull(stages, ctxs, head_next, head_end - 1, *b, true)) {
      fc.stop();
      return {};
    }
    if (first_after_head < n()) counters[first_after_head]->enqueued++;
    head_last_return_ns = now_ns();
    return Msg{head_order++, std::move(b)};
  });
  tbb::flow::limiter_node<Msg> limiter(g, max_in_flight);
  tbb::flow::make_edge(source, limiter);
  // Counts batches the limiter admitted (the source may hold one more, produced and waiting).
  tbb::flow::function_node<Msg, Msg> admit(g, tbb::flow::unlimited, [&](Msg m) -> Msg {
    raise_to(max_in_flight_seen, static_cast<uint64_t>(++in_flight));
    return m;
  });
  tbb::flow::make_edge(limiter, admit);

  // Keep nodes alive for the graph's lifetime.
  std::vector<std::unique_ptr<tbb::flow::graph_node>> nodes;
  tbb::flow::sender<Msg>* prev = &admit;
  for (size_t k = head_end; k < static_cast<size_t>(plan().section_begin); ++k) {
    int conc = plan().stages[k].concurrency;
    size_t limit =
        conc == 0 ? static_cast<size_t>(tbb::flow::unlimited) : static_cast<size_t>(conc);
    auto node =
        std::make_unique<tbb::flow::function_node<Msg, Msg>>(g, limit, [&, k](Msg m) -> Msg {
          note_queue(k);
          if (!m.resident)
            timed(k, m.batch->index, [&] { stages[k]->forward(*m.batch, *ctxs[k]); });
          counters[k]->items_out++;
          if (k + 1 < n()) counters[k + 1]->enqueued++;
          return m;
        });
    tbb::flow::make_edge(*prev, *node);
    prev = node.get();
    nodes.push_back(std::move(node));
    if (conc != 1) {
      auto seq =
          std::make_unique<tbb::flow::sequencer_node<Msg>>(g, [](const Msg& m) { return m.order; });
      tbb::flow::make_edge(*prev, *seq);
      prev = seq.get();
      nodes.push_back(std::move(seq));
    }
  }
  // The section: serial, in source order.
  auto order_guard =
      std::make_unique<tbb::flow::sequencer_node<Msg>>(g, [](const Msg& m) { return m.order; });
  tbb::flow::make_edge(*prev, *order_guard);
  size_t sb = static_cast<size_t>(plan().section_begin);
  tbb::flow::function_node<Msg, tbb::flow::continue_msg> section_node(
      g, tbb::flow::serial, [&](Msg m) -> tbb::flow::continue_msg {
        if (sb < n()) note_queue(sb);
        for (size_t k = sb + 1; k < n(); ++k) counters[k]->items_in++;  // one batch through all
        const uint64_t t0 = now_ns();
        const uint64_t waited = last_section_end_ns ? t0 - last_section_end_ns : 0;
        if (opt.resident_batches > 0 && !m.resident && resident.size() < opt.resident_batches) {
          resident.push_back(std::make_shared<const Batch>(*m.batch));  // before outputs land
          if (resident.size() == opt.resident_batches) resident_full = true;
        }
        // A stop lets the step in progress finish; batches still queued behind it do not train.
        if (!run.stop_requested) train_batch(m.batch, waited);
        // Waiting for data starts now: validation and checkpoints above are not waits.
        last_section_end_ns = now_ns();
        --in_flight;
        m.batch.reset();  // release tensors before the limiter admits another batch
        return {};
      });
  tbb::flow::make_edge(*order_guard, section_node);
  tbb::flow::make_edge(section_node, limiter.decrementer());

  std::exception_ptr failure;
  try {
    source.activate();
    g.wait_for_all();
    if (pending) finish_pending();  // the batch the host ran ahead with (a stop, the data's end)
  } catch (...) {
    failure = std::current_exception();
    g.cancel();
    try {
      g.wait_for_all();
    } catch (...) {
    }
  }
  return failure;
}

// After the last step: a last validation where one is due, the optimizer's spread state, each
// stage's finish() (the last checkpoint), and the end row saying why the run ended. Returns
// what failed: `failure`, or a failure of these.
std::exception_ptr Runner::Impl::end_steps(std::exception_ptr failure, int stop_signal,
                                           std::vector<Stage*>& stages,
                                           std::vector<StageContext*>& ctxs) {
  // The steps since the last train row get theirs (a signal or the data's end between two
  // log_every rows lost them). With several ranks only at the data's end: the row's sums are
  // collective, and ranks that were interrupted may not all be here.
  if (!failure && metrics_failure.empty() && interval_steps > 0 &&
      (run.world_size == 1 || !run.interrupted)) {
    try {
      write_train_row();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  // A run that ends between validations (the step limit, the data) still reports where it
  // ended, before finish() writes the last checkpoint. Not after SIGINT/SIGTERM: that is a
  // request to stop now.
  if (!failure && !run.interrupted && metrics_failure.empty() && steps_this_process > 0 &&
      plan().run.integer("validate_every") > 0 && last_validated_step != run.step) {
    try {
      validation_pass(run.step);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!failure && !run.interrupted) {
    try {
      gather_spread_state(/*stages=*/false);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (!failure) {
    for (size_t k = 0; k < n(); ++k) {
      try {
        stages[k]->finish(*ctxs[k]);
      } catch (const std::exception& e) {
        const auto& ps = plan().stages[k];
        failure =
            std::make_exception_ptr(StageError(ps.name, ps.schema->kind(), run.step, e.what()));
        break;
      }
    }
  }
  if (!metrics_failure.empty() && !failure)
    failure = std::make_exception_ptr(std::runtime_error(
        metrics_failure + "; the run stopped at step " + std::to_string(run.step)));
  // The last row says why the run ended.
  if (end_reason.empty()) {
    if (failure)
      end_reason = "error";
    else if (run.interrupted)
      end_reason = stop_signal ? "interrupted (" + signal_name(stop_signal) + ")" : "interrupted";
    else if (early_stopped)
      end_reason = "early stop";
    else
      end_reason = "data end";
  }
  // A resume of a run whose data had already ended (its last end row says so): nothing
  // happened, and no second end row says otherwise. A run that ended otherwise (a signal in its
  // last step, run.steps) gets its data end row now.
  if (!failure && end_reason == "data end" && steps_this_process == 0 && !opt.resume_dir.empty() &&
      MetricsLog::last_end_reason((fs::path(opt.resume_dir) / "metrics.jsonl").string()) ==
          "data end") {
    data_ended_before = true;
    log_line("nothing to do: the run's data ended at step " + std::to_string(run.step) +
             " (run.epochs = " + std::to_string(run.epochs) + "); raise run.epochs to train on");
    return failure;
  }
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      write_metrics_row("end", {}, -1, -1, {{"reason", end_reason}, {"error", e.what()}});
    }
  } else {
    write_metrics_row("end", {}, -1, -1, {{"reason", end_reason}});
  }
  return failure;
}

// What the run did, for the caller, and the line that says so on every rank.
void Runner::Impl::fill_result(RunResult& result, int stop_signal, uint64_t t_start) {
  result.steps = steps_this_process;
  result.steps_ended_ahead = steps_ended_ahead;
  if (step_graphs) {
    const StepGraphs::Counts c = step_graphs->counts();
    result.cuda_graph = true;
    result.graph_steps = {c.replayed, c.captured, c.issued, c.uncaptured, c.ops};
    result.graph_off_reason = step_graphs->off_reason();
    result.graph_difference = step_graphs->difference();
    result.operation_times = operation_times();
  }
  result.final_step = run.step;
  result.samples = samples.load();
  result.interrupted = run.interrupted.load();
  result.stop_signal = stop_signal;
  result.end_reason = end_reason;
  result.early_stopped = early_stopped;
  result.seconds = static_cast<double>(now_ns() - t_start) * 1e-9;
  result.last_train_metrics = last_train;
  result.last_validation_metrics = last_validation;
  char summary[224];
  // A resume: the run's steps, then what this process did (its samples and time are its own).
  char resumed[64] = "";
  if (!opt.resume_dir.empty())
    std::snprintf(resumed, sizeof resumed, "; this resume %llu steps,",
                  static_cast<unsigned long long>(result.steps));
  std::snprintf(summary, sizeof summary, ": %llu steps%s %llu samples%s in %.3g s",
                static_cast<unsigned long long>(result.final_step), resumed[0] ? resumed : ",",
                static_cast<unsigned long long>(result.samples),
                run.world_size > 1 ? " on this rank" : "", result.seconds);
  if (result.cuda_graph) log_line(graph_steps_summary(result));
  // Every rank says how it ended (the progress lines are rank 0's alone).
  std::ostream& out = log == &quiet ? std::cout : *log;
  // Several ranks: each line says whose it is.
  if (run.world_size > 1) out << "rank " << run.rank << ": ";
  out << ((result.interrupted ? "interrupted" + (stop_signal && stop_signal != SIGINT
                                                     ? " (" + signal_name(stop_signal) + ")"
                                                     : std::string())
           : early_stopped    ? std::string("stopped early")
                              : std::string("done")) +
          summary + (run.run_dir.empty() || run.rank != 0 ? std::string() : " -> " + run.run_dir))
      << "\n"
      << std::flush;
}

// StepGraphs' operation times with their stages' names, the last timed graph read first.
OperationTimes Runner::Impl::operation_times() {
  if (!step_graphs || !step_graphs->timing_operations()) return {};
  try {
    step_graphs->collect_times();
  } catch (const std::exception& e) {  // a failed run's device: its error is on its way
    log_line(std::string("operation times: the last timed graph unread: ") + e.what());
  }
  OperationTimes t = step_graphs->operation_times();
  for (OperationTime& op : t.ops)
    if (op.stage >= 0 && static_cast<size_t>(op.stage) < n())
      op.stage_name = plan().stages[static_cast<size_t>(op.stage)].name;
  return t;
}

std::string graph_steps_summary(const RunResult& r) {
  if (!r.cuda_graph) return "";
  const auto& g = r.graph_steps;
  const uint64_t all = g.replayed + g.captured + g.issued + g.uncaptured;
  std::string s = "cuda graph: " + std::to_string(g.replayed) + " of " + std::to_string(all) +
                  " training batches replayed (" + std::to_string(g.captured) + " captured, " +
                  std::to_string(g.issued) + " issued op by op, " + std::to_string(g.uncaptured) +
                  " uncaptured)";
  if (g.ops > 0) s += ", " + std::to_string(g.ops) + " operations a batch";
  if (!r.graph_off_reason.empty())
    s += "; " + r.graph_off_reason;
  else if (2 * g.replayed < all && !r.graph_difference.empty())
    s += "; steps seen for the first time differ first at " + r.graph_difference;
  return s;
}

}  // namespace slipstream
