#include "engine/stop_signals.h"

#include <array>
#include <atomic>
#include <csignal>
#include <cstring>

namespace slipstream {

namespace {

constexpr std::array<int, 6> kStopSignals = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGXCPU, SIGALRM};

std::atomic<int> g_received{0};
std::array<void (*)(int), kStopSignals.size()> g_previous{};

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  g_received.compare_exchange_strong(none, sig);
}

}  // namespace

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
