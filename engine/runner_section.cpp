// The trainable section of a run: a training batch's forward, backward and update stages (as a
// CUDA graph when run.cuda_graph is on), the host running ahead of a device by one batch, the
// read-backs a batch's stages asked for, and the step's bookkeeping once its batches are done.
#include "engine/runner_impl.h"

namespace slipstream {

using namespace runner_detail;

// Stage k's backward for batch b, then (when a stage listens, e.g. allreduce) the announcement
// that its parameters' gradients are final.
void Runner::Impl::backward_stage(size_t k, Batch& b) {
  as_stage(k, b.index, [&] { graph->stage(k).backward(b, graph->context(k)); });
  if (run.gradient_listeners.empty()) return;
  if (stage_params.size() != n()) {
    stage_params.assign(n(), {});
    for (size_t j = 0; j < n(); ++j) stage_params[j] = graph->stage(j).parameters();
  }
  if (!stage_params[k].empty())
    as_stage(k, b.index, [&] { graph->context(k).gradients_ready(stage_params[k]); });
}

void Runner::Impl::section(Batch& b) {
  enter_section(b);
  section_stages(b);
}

// A training batch's section, as a CUDA graph when run.cuda_graph is on (engine/step_graphs.h):
// the stages' work recorded, then replayed, captured or issued.
void Runner::Impl::training_section(Batch& b) {
  if (!step_graphs || !step_graphs->enabled()) {
    if (step_graphs) step_graphs->ran_without_graph();
    return section(b);
  }
  enter_section(b);  // the wait for the batch's copies comes before the step's work, as itself
  capture::StepRecorder rec(run.exec->stream());
  // Isolated: a thread that waits inside a stage takes no other task, whose launches would
  // join this step's.
  tbb::this_task_arena::isolate([&] { section_stages(b); });
  finish_recorded(rec, run.step + 1, b.index);
}

// The recorded work replayed, captured or issued (step_graphs->finish); a failed operation
// named with its stage; graph mode turning itself off said once.
void Runner::Impl::finish_recorded(capture::StepRecorder& rec, uint64_t step, uint64_t batch) {
  try {
    step_graphs->finish(rec, step);
  } catch (const capture::IssueError& e) {
    if (e.stage() < 0 || static_cast<size_t>(e.stage()) >= n()) throw;
    const auto& ps = plan().stages[static_cast<size_t>(e.stage())];
    throw StageError(ps.name, ps.schema->kind(), batch, e.what());
  }
  if (!step_graphs->enabled() && !graph_off_reported) {
    graph_off_reported = true;
    log_line("cuda graph: " + step_graphs->off_reason());
  }
}

void Runner::Impl::section_stages(Batch& b) {
  size_t begin = plan().section_begin;
  bool has_loss = false;
  for (size_t k = begin; k < n(); ++k) {
    const auto& ps = plan().stages[k];
    if (ps.after_loss) continue;
    has_loss = has_loss || ps.schema->stage_role() == StageRole::loss;
    timed(k, b.index, [&] { graph->stage(k).forward(b, graph->context(k)); });
  }
  if (has_loss && run.training) {
    for (size_t k = n(); k-- > begin;) {
      const auto& ps = plan().stages[k];
      if (ps.after_loss || !ps.schema->is_differentiable()) continue;
      timed(k, b.index, [&] { backward_stage(k, b); });
    }
  }
  for (size_t k = begin; k < n(); ++k)
    if (plan().stages[k].after_loss)
      timed(k, b.index, [&] { graph->stage(k).forward(b, graph->context(k)); });
}

void Runner::Impl::train_batch(std::shared_ptr<Batch> b, uint64_t data_wait_ns) {
  if (pending && !may_run_past()) finish_pending();
  if (run.stop_requested) return;  // the step just finished was the last
  training_section(*b);
  const uint64_t group = run.exec ? run.exec->close_read_backs() : 0;
  if (pending) {
    if (micro_in_step + 1 == run.micro_batches_per_step) ++steps_ended_ahead;
    finish_pending();
  }
  pending = Pending{std::move(b), data_wait_ns, group};
  if (!run_ahead()) finish_pending();
}

// Whether the step the pending batch completes may end after the next batch is enqueued.
bool Runner::Impl::may_run_past() {
  if (run.stop_requested) return false;
  if (micro_in_step + 1 < run.micro_batches_per_step) return true;  // mid-step: no step end
  const uint64_t s = run.step + 1;
  const auto every = [&](const char* key) {
    const int64_t e = plan().run.integer(key);
    return e > 0 && s % static_cast<uint64_t>(e) == 0;
  };
  const int64_t limit = plan().run.integer("steps");
  if (every("log_every") || every("validate_every") ||
      (limit > 0 && s >= static_cast<uint64_t>(limit)))
    return false;
  for (size_t k = plan().section_begin; k < n(); ++k)
    if (graph->stage(k).step_end_reads_device(s)) return false;
  return true;
}

void Runner::Impl::finish_pending() {
  Pending p = std::move(*pending);
  pending.reset();
  complete_read_backs(*p.batch, p.read_backs);
  for (size_t k = plan().section_begin; k < n(); ++k) counters[k]->items_out++;
  after_step(*p.batch, p.data_wait_ns);
}

// The host's wait for a batch on a device: what the stages asked to read back (the loss's
// sums, the optimizer's outcome) arrives, and their reports run — after the batch's whole
// work is enqueued, so the device never idles while the host issues the rest of a step.
// `group`: the batch's read-backs (0: everything asked so far).
void Runner::Impl::complete_read_backs(const Batch& b, uint64_t group) {
  if (!run.exec) return;
  try {
    const auto each = [&](int k, const std::function<void()>& report) {
      if (k < 0 || static_cast<size_t>(k) >= n()) return report();
      as_stage(static_cast<size_t>(k), b.index, report);
    };
    if (group)
      run.exec->complete_read_backs_through(group, each);
    else
      run.exec->complete_read_backs(each);
  } catch (const StageError&) {
    throw;
  } catch (const std::exception& e) {
    throw std::runtime_error("batch " + std::to_string(b.index) +
                             ": the device's work on it failed: " + e.what());
  }
}

// Under gradient accumulation only every micro_batches_per_step-th batch completes a step; the
// batches before it count their samples and waits, and any non-finite value among them marks
// the step.
// `data_wait_ns`: how long the section waited for the batch (from the end of its work on the
// one before).
void Runner::Impl::after_step(const Batch& b, uint64_t data_wait_ns) {
  samples += b.samples;
  interval_samples += b.samples;
  interval_section_wait_ns += data_wait_ns;
  step_section_wait_ns += data_wait_ns;
  section_wait_total_ns += data_wait_ns;
  if (++micro_in_step < run.micro_batches_per_step) {
    if (tty) progress_line();
    return;
  }
  micro_in_step = 0;
  // The loss slipstream-smi and the progress line show is the step's they count (the loss stage
  // reports it during the step, before the step is counted).
  last_loss.store(batch_loss.load());
  run.step++;
  steps_this_process++;
  interval_steps++;
  if (opt.on_step) opt.on_step(run.step, step_section_wait_ns);
  step_section_wait_ns = 0;
  if (step_nonfinite) {
    if (run.nonfinite_streak++ == 0) streak_first_step = run.step;
  } else {
    run.nonfinite_streak = 0;
  }
  step_nonfinite = false;
  const auto max_bad = static_cast<uint64_t>(plan().run.integer("max_nonfinite_steps"));
  if (max_bad > 0 && run.nonfinite_streak >= max_bad) {
    std::string why =
        "training diverged: the loss (or gradient) was not finite for " +
        std::to_string(run.nonfinite_streak.load()) + " consecutive steps (" +
        std::to_string(streak_first_step) + " to " + std::to_string(run.step) + "); " +
        (streak_first_step <= 1 ? std::string("it was so from the first step")
         : run.writes_outputs() && !latest_checkpoint(run.run_dir)
             ? std::string("the run wrote no checkpoint before it")
             : "no checkpoint was written since step " + std::to_string(streak_first_step - 1)) +
        ". Lower the learning rate, or set run.max_nonfinite_steps=0 to go on";
    if (run.writes_outputs())
      if (const auto newest = latest_checkpoint(run.run_dir)) {
        std::string lr = "STAGE.lr";  // the optimizer's, by the name its graph gives it
        for (const PlannedStage& s : plan().stages)
          if (s.schema->stage_role() == StageRole::update && s.schema->find_param("lr"))
            lr = s.name + ".lr";
        why += "; the newest checkpoint, " + *newest + ", resumes from before it (--resume " +
               run.run_dir + " --set " + lr + "=...)";
      }
    write_train_row();
    end_reason = "diverged";
    throw std::runtime_error(why);
  }
  int64_t log_every = plan().run.integer("log_every");
  int64_t steps_limit = plan().run.integer("steps");
  bool last = steps_limit > 0 && run.step >= static_cast<uint64_t>(steps_limit);
  if (run.step % static_cast<uint64_t>(log_every) == 0 || last) {
    write_train_row();
  } else if (tty) {
    progress_line();
  }
  int64_t every = plan().run.integer("validate_every");
  if (every > 0 && run.step % static_cast<uint64_t>(every) == 0) validation_pass(b.index);
  for (size_t k = plan().section_begin; k < n(); ++k)
    if (graph->stage(k).step_end_reads_device(run.step)) {
      gather_spread_state();
      break;
    }
  for (size_t k = plan().section_begin; k < n(); ++k)
    timed(k, b.index, [&] { graph->stage(k).step_end(b, graph->context(k)); });
  keep_run_dir_locked();  // a checkpoint or row may have made the directory again
  if (last) {
    run.stop_requested = true;
    if (end_reason.empty()) end_reason = "steps";
  }
}

// State spread over the ranks comes whole to rank 0 where a checkpoint may follow: the stages'
// (Stage::gather_state) and ZeRO-1's optimizer state (engine/optimizer_shard.h). Every rank
// calls this at the same points: before the step ends of a step some stage reads the device at
// (the checkpoint steps), in each validation pass, and at the end of a run that was not
// interrupted.
void Runner::Impl::gather_spread_state(bool stages) {
  if (stages && run.world_size > 1 && run.reduce_over_ranks && stages_gathered_step != run.step) {
    for (size_t k = plan().section_begin; k < n(); ++k)
      graph->stage(k).gather_state(graph->context(k));
    stages_gathered_step = run.step;
  }
  OptimizerShard* shard = run.optimizer_shard.get();
  if (!shard || !shard->gather_state || shard->gathered_step == run.step) return;
  shard->gather_state();
  shard->gathered_step = run.step;
}

}  // namespace slipstream
