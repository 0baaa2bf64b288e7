#include "engine/stop_signals.h"

#include <array>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstring>

#include <fcntl.h>
#include <sys/syscall.h>
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

// StartupSignals' directory, copied out where the handler reads it without allocating, and
// what the handler says on stderr: the directory removed, or kept (setup made a folder there).
constexpr size_t kPathBytes = 4096;
std::array<char, kPathBytes> g_startup_dir{};
std::atomic<bool> g_startup_armed{false};
std::array<std::array<char, kPathBytes + 128>, 2> g_startup_note{};
std::array<size_t, 2> g_startup_note_bytes{};
std::array<void (*)(int), kStopSignals.size()> g_startup_previous{};
bool g_startup_handed_over = false;  // StopSignals took the handlers over
std::atomic<bool> g_startup_handing_over{false};

// The entries of the directory `fd` (getdents64: no allocation), each unlinked; the directory
// is fresh, made by this run, so everything in it is the run's own. A subfolder stays.
void unlink_entries(int fd) {
  struct Entry {  // linux_dirent64
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
  };
  alignas(8) char buf[4096];
  for (int pass = 0; pass < 3; ++pass) {  // entries removed while listed may shift the rest
    ::lseek(fd, 0, SEEK_SET);
    bool removed = false;
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long at = 0; at < n;) {
        const auto* e = reinterpret_cast<const Entry*>(buf + at);
        const char* name = buf + at + offsetof(Entry, name);
        at += e->reclen;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
        removed = ::unlinkat(fd, name, 0) == 0 || removed;
      }
    }
    if (!removed) break;
  }
}

extern "C" void on_startup_signal(int sig) {
  // StopSignals is taking the handlers over: a stop to record at the step's end, as its own.
  if (g_startup_handing_over.load()) {
    on_stop_signal(sig);
    return;
  }
  if (g_startup_armed.load()) {
    const int fd = ::open(g_startup_dir.data(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      unlink_entries(fd);
      ::close(fd);
    }
    const size_t k = ::rmdir(g_startup_dir.data()) == 0 ? 0 : 1;
    if (g_startup_note_bytes[k] > 0 &&
        ::write(STDERR_FILENO, g_startup_note[k].data(), g_startup_note_bytes[k]) < 0) {
      // nothing more to do: the process ends either way
    }
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

StartupSignals::StartupSignals() {
  g_startup_armed = false;
  g_startup_handed_over = false;
  g_startup_handing_over = false;
  for (size_t i = 0; i < kStopSignals.size(); ++i) {
    g_startup_previous[i] = std::signal(kStopSignals[i], on_startup_signal);
    // SIGHUP ignored (nohup) stays ignored: a closed terminal ends nothing. Others are taken
    // even when ignored: a shell's background job ignores SIGINT, and `kill -INT` means stop.
    if (kStopSignals[i] == SIGHUP && g_startup_previous[i] == SIG_IGN) std::signal(SIGHUP, SIG_IGN);
  }
}

void StartupSignals::arm(const std::string& dir) {
  if (dir.size() >= kPathBytes) return;  // no such path: mkdir refuses it
  std::memcpy(g_startup_dir.data(), dir.c_str(), dir.size() + 1);
  const std::string said[2] = {
      "stopped by a signal while the run set up: nothing was trained, " + dir + " removed\n",
      "stopped by a signal while the run set up: nothing was trained; " + dir +
          " kept, emptied of files (setup made a folder there)\n"};
  for (size_t k = 0; k < 2; ++k) {
    g_startup_note_bytes[k] = said[k].size() < g_startup_note[k].size() ? said[k].size() : 0;
    std::memcpy(g_startup_note[k].data(), said[k].data(), g_startup_note_bytes[k]);
  }
  g_startup_armed = true;
}

StartupSignals::~StartupSignals() {
  g_startup_armed = false;
  if (!g_startup_handed_over)
    for (size_t i = 0; i < kStopSignals.size(); ++i)
      std::signal(kStopSignals[i], g_startup_previous[i]);
}

StopSignals::StopSignals() {
  g_received = 0;
  // Over StartupSignals' handlers: a signal while they are swapped one by one is recorded as
  // this class's (on_startup_signal passes it on), so none is lost between the two; the
  // dispositions restored at the end are the ones from before the start-up.
  g_startup_handing_over = true;
  for (size_t i = 0; i < kStopSignals.size(); ++i) {
    void (*previous)(int) = std::signal(kStopSignals[i], on_stop_signal);
    if (previous == on_startup_signal) {
      g_startup_handed_over = true;
      previous = g_startup_previous[i];
    }
    g_previous[i] = previous;
    // SIGHUP ignored (nohup) stays ignored, as above.
    if (kStopSignals[i] == SIGHUP && previous == SIG_IGN) std::signal(SIGHUP, SIG_IGN);
  }
  g_startup_armed = false;
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
