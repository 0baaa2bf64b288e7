// Runs a command line through the shell and captures its exit status and output (stdout+stderr).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace slipstream::testing {

struct CliOutput {
  int status = -1;   // exit status; -1 when killed by a signal
  std::string text;  // stdout and stderr, interleaved
};

inline CliOutput run_command(const std::string& command) {
  CliOutput out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.text.append(buf.data(), n);
  int st = pclose(p);
  out.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

}  // namespace slipstream::testing
