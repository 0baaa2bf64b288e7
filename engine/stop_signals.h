// The signals that ask a run to stop at the end of its step, write a checkpoint and its last
// metrics row, and exit 130: SIGINT (Ctrl-C), SIGTERM (schedulers, before a kill), SIGHUP (the
// terminal closed; not under nohup, which ignores it), SIGUSR1 (Slurm's `--signal` warning before
// the time limit), SIGXCPU (a CPU time limit's soft warning) and SIGALRM. And SIGPIPE ignored for
// the whole run, from before its first line (PipeSignalIgnored): a reader of its output that goes
// away (`slipstream run | head`) costs the console, never the run.
#pragma once

#include <string>

namespace slipstream {

class StopSignals {
 public:
  // Installs the handlers (the previous ones are restored on destruction) and clears any signal
  // a run before this one left.
  StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals();

  // The signal received since, 0 when none. A second one keeps the first: the stop under way
  // goes on as it was (its checkpoint is not torn by another request).
  static int received();
  // received(), then cleared.
  static int take();
};

// While a run sets up, before its first step (StopSignals' time). Installed before the run
// directory is made; once arm() names a fresh one, a stop signal removes it — made by this run,
// so all in it is the run's — and ends the process as the signal would have (before arm(), and
// for a resume, the signal just ends it). A run stopped before its first step leaves no directory
// behind, and setup (decoding a dataset: minutes) cannot stop in between to do it. Only
// async-signal-safe calls (open, lseek, getdents64, unlinkat, close, rmdir, write, signal,
// raise); a folder setup made keeps the directory, emptied of files. SIGHUP ignored (nohup)
// stays ignored. StopSignals constructed while it lives takes its handlers over, no signal lost.
class StartupSignals {
 public:
  StartupSignals();
  StartupSignals(const StartupSignals&) = delete;
  StartupSignals& operator=(const StartupSignals&) = delete;
  ~StartupSignals();
  void arm(const std::string& fresh_dir);
};

// SIGPIPE ignored while it lives (the previous disposition restored after).
class PipeSignalIgnored {
 public:
  PipeSignalIgnored();
  PipeSignalIgnored(const PipeSignalIgnored&) = delete;
  PipeSignalIgnored& operator=(const PipeSignalIgnored&) = delete;
  ~PipeSignalIgnored();

 private:
  void (*previous_)(int);
};

// "SIGHUP", "SIGUSR1", ... ("signal N" for others).
std::string signal_name(int sig);

// Records `sig` as if it had been delivered (tests of stop handling without a real signal).
void raise_stop_signal_for_testing(int sig);

}  // namespace slipstream
