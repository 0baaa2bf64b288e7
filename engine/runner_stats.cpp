// The stats record slipstream-smi reads (engine/stats_record.h), published a few times a
// second from its own thread, which also ends a run stuck after a stop signal.
#include "engine/runner_impl.h"

namespace fs = std::filesystem;

namespace slipstream {

using namespace runner_detail;

// ---- stats record ----
void Runner::Impl::publish(stats::RunState state) {
  if (!record) return;
  if (!steps_began) {
    // Setup (`starting`, or how it ended): alive, and what it holds so far; no step, rate or
    // stage figures yet (the stages are being set up on the run's thread).
    const uint64_t rss = resident_bytes();
    record->update([&](stats::RunRecord& r) {
      r.state = state;
      r.update_unix_ns = unix_ns();
      r.host_rss_bytes = rss;
      r.step = std::max<uint64_t>(run.step, resume_step);  // a resume's from its start
      r.steps_per_s = NAN;                                 // no rate before steps ([N/A])
      r.samples_per_s = NAN;
    });
    return;
  }
  uint64_t t = now_ns();
  double dt = prev_pub_ns ? static_cast<double>(t - prev_pub_ns) * 1e-9 : 0;
  if (dt > 0) {
    double sr = static_cast<double>(run.step - prev_pub_step) / dt;
    double xr = static_cast<double>(samples.load() - prev_pub_samples) / dt;
    steps_rate = !rates_measured ? sr : 0.7 * steps_rate + 0.3 * sr;
    samples_rate = !rates_measured ? xr : 0.7 * samples_rate + 0.3 * xr;
    rates_measured = true;
  }
  prev_pub_step = run.step;
  prev_pub_samples = samples.load();
  const uint64_t waited = section_wait_total_ns.load();
  if (dt > 0 && run.step > 0) {
    const double w = std::min(1.0, static_cast<double>(waited - prev_pub_wait_ns) * 1e-9 / dt);
    wait_frac = std::isnan(wait_frac) ? w : 0.7 * wait_frac + 0.3 * w;
  }
  prev_pub_wait_ns = waited;
  const uint64_t rss = resident_bytes();
  double elapsed = static_cast<double>(t - start_ns);
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  record->update([&](stats::RunRecord& r) {
    r.state = state;
    r.update_unix_ns = unix_ns();
    r.step = run.step;
    r.total_steps = run.total_steps;
    r.samples = samples.load();
    r.loss = last_loss.load();
    // Before two publications there is no rate to show ([N/A]), not a rate of 0.
    r.steps_per_s = rates_measured ? steps_rate : NAN;
    r.samples_per_s = rates_measured ? samples_rate : NAN;
    if (step_graphs) {
      const StepGraphs::Counts g = step_graphs->counts();
      r.graph_batches = g.replayed + g.captured + g.issued + g.uncaptured;
      r.graph_replayed = g.replayed;
    }
    r.eta_s = (run.total_steps && steps_rate > 0)
                  ? static_cast<double>(run.total_steps - std::min(run.total_steps, run.step)) /
                        steps_rate
                  : -1;
    r.num_stages = static_cast<uint32_t>(std::min<size_t>(n(), stats::kMaxStages));
    for (size_t k = 0; k < r.num_stages; ++k) {
      auto& c = *counters[k];
      auto& s = r.stages[k];
      const auto& ps = plan().stages[k];
      int slots = ps.concurrency == 0 ? hw : ps.concurrency;
      const uint64_t done = c.busy_ns.load(), blocked = c.blocked_ns.load(),
                     items = c.items_out.load();
      // With the bodies running now: a stage inside a long item is busy, not waiting.
      const uint64_t busy = done + c.open_ns(t, static_cast<uint64_t>(std::max(0.0, elapsed)));
      s.items_in = c.items_in.load();
      s.items_out = items;
      s.busy_ns = busy;
      s.blocked_output_ns = blocked;
      double capacity = elapsed * slots;
      s.wait_input_ns =
          static_cast<uint64_t>(std::max(0.0, capacity - static_cast<double>(busy + blocked)));
      uint64_t q = c.enqueued.load() - std::min(c.enqueued.load(), c.started.load());
      s.queue_depth = static_cast<uint32_t>(q);
      s.queue_capacity = static_cast<uint32_t>(plan().run.integer("max_in_flight"));
      s.concurrency = static_cast<uint32_t>(slots);
      s.flags = (ps.schema->stage_role() == StageRole::source ? stats::kStageSource : 0) |
                (ps.schema->is_trainable() ? stats::kStageTrainable : 0) |
                (ps.schema->stage_role() == StageRole::loss ? stats::kStageLoss : 0) |
                (run.device.is_cuda() && ps.in_section ? stats::kStageDevice : 0);
      if (dt > 0) {
        double window = dt * 1e9 * slots;
        // (A running body's time is an estimate that can step back a little; never below 0.)
        double db = static_cast<double>(busy - std::min(busy, c.prev_busy)),
               dbl = static_cast<double>(blocked - c.prev_blocked);
        uint64_t di = items - c.prev_items;
        // Smoothed like the run's rates: over one publish interval a stage's count is a whole
        // number of batches, which would make its rate jump between multiples of 1/dt.
        const double rate = static_cast<double>(di) / dt;
        s.items_per_s_recent = c.prev_rate_set ? 0.7 * s.items_per_s_recent + 0.3 * rate : rate;
        c.prev_rate_set = true;
        s.busy_frac_recent = std::min(1.0, db / window);
        s.blocked_output_frac_recent = std::min(1.0, dbl / window);
        s.wait_input_frac_recent =
            std::max(0.0, 1.0 - s.busy_frac_recent - s.blocked_output_frac_recent);
        s.mean_latency_ms_recent =  // of the items that ended in the window
            di ? static_cast<double>(done - c.prev_done) * 1e-6 / static_cast<double>(di)
               : s.mean_latency_ms_recent;
      }
      c.prev_busy = busy;
      c.prev_done = done;
      c.prev_blocked = blocked;
      c.prev_items = items;
    }
    r.data_wait_frac_recent = wait_frac;
    r.host_rss_bytes = rss;
    r.validation_loss = last_validation_loss.load();
    r.best_validation_loss = best_validation_loss.load();
    auto pools = Pools::all();
    r.device_reserved_bytes = 0;
    for (auto* pool : pools)
      if (!pool->name().starts_with("host"))
        r.device_reserved_bytes += pool->stats().reserved_bytes;
    r.num_pools = static_cast<uint32_t>(std::min<size_t>(pools.size(), stats::kMaxPools));
    for (size_t i = 0; i < r.num_pools; ++i) {
      PoolStats ps = pools[i]->stats();
      auto& p = r.pools[i];
      copy_name(p.name, sizeof p.name, pools[i]->name());
      p.in_use_bytes = ps.in_use_bytes;
      p.reserved_bytes = ps.reserved_bytes;
      p.peak_bytes = ps.peak_bytes;
      p.allocations = ps.allocations;
      p.failures = ps.failures;
    }
  });
  prev_pub_ns = t;
}

void Runner::Impl::start_publisher() {
  if (opt.publish_stats) {
    try {
      record = std::make_unique<stats::RecordWriter>();
    } catch (const std::exception& e) {
      log_line(std::string("warning: no stats record for slipstream-smi: ") + e.what());
    }
  }
  if (record) {
    record->update([&](stats::RunRecord& r) {
      copy_name(r.run_name, sizeof r.run_name, plan().run.string("name"));
      copy_name(r.preset, sizeof r.preset, plan().config.preset);
      copy_name(r.device, sizeof r.device, run.device.str());
      // Absolute: smi is read from anywhere (a resume's directory is as given on its command line).
      std::error_code ec;
      const fs::path dir = run.run_dir.empty() ? fs::path() : fs::absolute(run.run_dir, ec);
      copy_name(r.run_dir, sizeof r.run_dir, ec ? run.run_dir : dir.lexically_normal().string());
      r.start_unix_ns = start_unix;
      r.loss = NAN;
      r.eta_s = -1;
      for (size_t k = 0; k < std::min<size_t>(n(), stats::kMaxStages); ++k) {
        copy_name(r.stages[k].name, sizeof r.stages[k].name, plan().stages[k].name);
        copy_name(r.stages[k].kind, sizeof r.stages[k].kind, plan().stages[k].schema->kind());
      }
    });
  }
  auto interval = std::chrono::milliseconds(plan().run.integer("stats_interval_ms"));
  const int64_t stop_timeout_s = plan().run.integer("stop_timeout_s");
  publisher = std::thread([this, interval, stop_timeout_s] {
    std::unique_lock lock(pub_mu);
    std::optional<std::chrono::steady_clock::time_point> signalled;
    while (!pub_cv.wait_for(lock, interval, [this] { return pub_stop; })) {
      if (opt.handle_sigint && StopSignals::received() != 0) {
        run.interrupted = true;
        run.stop_requested = true;
        if (!signalled) signalled = std::chrono::steady_clock::now();
        if (stop_timeout_s > 0 &&
            std::chrono::steady_clock::now() - *signalled > std::chrono::seconds(stop_timeout_s))
          exit_stuck_after_signal(stop_timeout_s);
      }
      publish(finishing     ? stats::RunState::finishing
              : steps_began ? stats::RunState::running
                            : stats::RunState::starting);
    }
  });
}

// A stop signal was not followed by the end of the step within run.stop_timeout_s: the step is
// stuck (a library spinning on a failed allocation, a hung collective). Its checkpoint would
// never come; the process ends now, saying which checkpoint stays the newest.
void Runner::Impl::exit_stuck_after_signal(int64_t seconds) {
  const int sig = StopSignals::received();
  std::string newest;
  if (!run.run_dir.empty())
    if (auto c = latest_checkpoint(run.run_dir)) newest = *c;
  const std::string line =
      "error: " + signal_name(sig) + " was received " + std::to_string(seconds) +
      " s ago and step " + std::to_string(run.step.load() + 1) +
      " has not finished (stuck; run.stop_timeout_s): exiting without a checkpoint of it; " +
      (newest.empty() ? std::string("the run has no checkpoint")
                      : "the newest checkpoint is " + newest) +
      "\n";
  if (console) console->note(line.substr(0, line.size() - 1));
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  std::_Exit(128 + sig);
}

void Runner::Impl::stop_publisher(stats::RunState final_state) {
  {
    std::lock_guard lock(pub_mu);
    pub_stop = true;
  }
  pub_cv.notify_all();
  if (publisher.joinable()) publisher.join();
  publish(final_state);
}

}  // namespace slipstream
