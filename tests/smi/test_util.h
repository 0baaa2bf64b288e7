// Helpers shared by the slipstream-smi tests: temp dirs, hand-made record files, dead pids.
#pragma once

#include <string>

#include "engine/stats_record.h"

namespace slipstream::smi_test {

// A fresh directory under $TMPDIR (or /tmp), removed with its files on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A valid, fully initialised record for pid (our uid), with no stages.
stats::RunRecord make_record(int pid);
// Writes bytes to path (mode 0600), replacing it.
void write_file(const std::string& path, const void* data, size_t size);
void write_record(const std::string& path, const stats::RunRecord& record);
std::string read_file(const std::string& path);
bool file_exists(const std::string& path);
// The pid of a child that has exited and been reaped: no process has it (until reuse).
int dead_pid();
// A child process of ours that lives (paused) until destruction: a pid that is surely alive
// and surely ours, for records that must not be taken as stale.
class LiveChild {
 public:
  LiveChild();
  ~LiveChild();
  LiveChild(const LiveChild&) = delete;
  LiveChild& operator=(const LiveChild&) = delete;
  int pid() const { return pid_; }

 private:
  int pid_;
};

// Copies s into a fixed char array, NUL-terminated.
template <size_t N>
void set_text(char (&dst)[N], const std::string& s) {
  size_t n = s.size() < N - 1 ? s.size() : N - 1;
  s.copy(dst, n);
  dst[n] = '\0';
}

}  // namespace slipstream::smi_test
