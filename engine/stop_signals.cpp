#include "engine/stop_signals.h"

#include <array>
#include <atomic>
#include <csignal>
#include <cstring>

#include <unistd.h>

namespace slipstream {

namespace {

constexpr std::array<int, 6> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGXCPU, SIGALRM};

std::atomic<int> g_received{0};
std::array<void (*)(int), kStopSignals.size()> g_previous{};

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_received.compare_exchange_strong(none, sig);
}

// StartupSignals' paths, copied out where the handler reads them without allocating: the files,
// then the directory last.
constexpr size_t kStartupPaths = 8, kPathBytes = 4096;
std::array<std::array<char, kPathBytes>, kStartupPaths> g_startup_paths{};
std::atomic<size_t> g_startup_count{0};
// What the handler says on stderr: the directory removed, or kept (setup wrote more there).
std::array<std::array<char, kPathBytes + 128>, 2> g_startup_note{};
std::array<size_t, 2> g_startup_note_bytes{};
std::array<void (*)(int), kStopSignals.size()> g_startup_previous{};

extern "C" void on_startup_signal(int sig) {
  const size_t n = g_startup_count.load();
  for (size_t i = 0; i + 1 < n; ++i) ::unlink(g_startup_paths[i].data());
  const bool removed = n > 0 && ::rmdir(g_startup_paths[n - 1].data()) == 0;
  const size_t k = removed ? 0 : 1;
  if (g_startup_note_bytes[k] > 0 &&
      ::write(STDERR_FILENO, g_startup_note[k].data(), g_startup_note_bytes[k]) < 0) {
    // nothing more to do: the process ends either way
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

StartupSignals::StartupSignals(const std::string& dir, const std::vector<std::string>& files) {
  size_t n = 0;
  auto keep = [&](const std::string& path) {
    if (n < kStartupPaths && path.size() < kPathBytes) {
      std::memcpy(g_startup_paths[n].data(), path.c_str(), path.size() + 1);
      ++n;
    }
  };
  for (const auto& f : files)
    if (n + 1 < kStartupPaths) keep(dir + "/" + f);
  keep(dir);
  g_startup_count = dir.size() < kPathBytes ? n : 0;  // no directory to remove: files alone stay
  const std::string said[2] = {
      "stopped by a signal while the run set up: nothing was trained, " + dir + " removed\n",
      "stopped by a signal while the run set up: nothing was trained; " + dir +
          " kept (setup wrote more there)\n"};
  for (size_t k = 0; k < 2; ++k) {
    g_startup_note_bytes[k] = said[k].size() < g_startup_note[k].size() ? said[k].size() : 0;
    std::memcpy(g_startup_note[k].data(), said[k].data(), g_startup_note_bytes[k]);
  }
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    g_startup_previous[i] = std::signal(kStopSignals[i], on_startup_signal);
}

StartupSignals::~StartupSignals() {
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    std::signal(kStopSignals[i], g_startup_previous[i]);
  g_startup_count = 0;
}

StopSignals::StopSignals() {
  g_received = 0;
  for (size_t i = 0; i < kStopSignals.size(); ++i)
    g_previous[i] = std::signal(kStopSignals[i], on_stop_signal);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < kStopSignals.size(); ++i) std::signal(kStopSignals[i], g_previous[i]);
}

PipeSignalIgnored::PipeSignalIgnored() : previous_(std::signal(SIGPIPE, SIG_IGN)) {}

PipeSignalIgnored::~PipeSignalIgnored() {
  std::signal(SIGPIPE, previous_);
}

int StopSignals::received() {
  return g_received.load();
}

int StopSignals::take() {
  return g_received.exchange(0);
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGALRM:
      return "SIGALRM";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return "signal " + std::to_string(sig);
  }
}

void raise_stop_signal_for_testing(int sig) {
  on_stop_signal(sig);
}

}  // namespace slipstream
