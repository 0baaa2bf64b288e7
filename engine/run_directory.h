// A run directory's safety rules (the layout is in README/docs/architecture.md):
// - one writer at a time: a run or resume holds an advisory lock on RUN/.lock for its life, and
//   a second process is refused with the holder's PID; a run whose directory is moved or removed
//   while it trains locks the one made again at its place;
// - a fresh directory is made with mkdir, which fails when the name exists, so two runs started in
//   the same second get two directories;
// - config.yaml is replaced whole (engine/atomic_file.h), the previous one kept;
// - nothing a resume finds past its checkpoint is deleted: checkpoints and metrics rows after it
//   are moved aside into RUN/set-aside/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream {

class DirectoryLock {
 public:
  // Takes the lock on `dir`/.lock (created if missing) without waiting. Throws when another
  // process holds it: "<dir>: in use by process <pid> on <host> ..., then <what> again"; `writer`
  // says what the holder writes there (a run's rows and checkpoints by default).
  DirectoryLock(const std::string& dir, const std::string& what,
                const std::string& writer = "its rows and checkpoints");
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

  // Whether `dir`/.lock is still the file this lock holds: false once the directory was moved or
  // removed (a directory made again at its place holds no lock until one is taken there).
  bool held_at_path() const;

 private:
  std::string path_;
  int fd_ = -1;
};

// Whether a process holds `dir`'s lock now (a run or resume writing there), without taking it.
bool directory_in_use(const std::string& dir);
// When a process holds `dir`'s lock now: DirectoryLock's refusal, naming the holder (for a
// resume, "resume it"); empty otherwise.
std::string in_use_refusal(const std::string& dir);

// The local time as "20261121-103000": run directories and set-aside folders are named with it.
std::string run_time_stamp();

// Creates `base`, or `base-2`, `base-3`, ... when taken (parents created); returns the one made.
std::string create_fresh_directory(const std::string& base);

// config.yaml := `text` when its settings (comments aside) differ, keeping the old file as
// config.previous.yaml; both replaced whole. Returns whether it changed.
bool update_config_yaml(const std::string& run_dir, const std::string& text);

// What set_aside_past moved.
struct SetAside {
  std::string dir;  // RUN/set-aside/after-step-N-<time>; empty when nothing was past the step
  std::vector<std::string> checkpoints;
  size_t rows = 0;  // metrics.jsonl lines (rows past the step, and a torn last line)
  std::string summary() const;
};
// Moves what a run wrote after `step` out of its way: checkpoints/step-M and best-step-M with
// M > step, and metrics.jsonl's rows past the step. Nothing is deleted.
SetAside set_aside_past(const std::string& run_dir, uint64_t step);

}  // namespace slipstream
