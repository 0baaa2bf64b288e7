#include "engine/stats_record.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace slipstream::stats {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

uint64_t unix_now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Closes a descriptor on scope exit so every early return in the reader stays leak-free.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

bool nul_terminated(const char* s, size_t n) {
  return std::memchr(s, '\0', n) != nullptr;
}

// A name cut to fit its field can end inside a multi-byte UTF-8 character; such a partial
// character is dropped so the published text stays valid UTF-8 (smi prints it as JSON).
void trim_partial_utf8(char* s, size_t n) {
  const size_t len = strnlen(s, n);
  if (len == n) return;  // not NUL-terminated: readers refuse the record anyway
  size_t tail = 0;       // continuation bytes at the end
  while (tail < 3 && tail < len && (static_cast<uint8_t>(s[len - 1 - tail]) & 0xC0) == 0x80) ++tail;
  if (tail == len) return;
  const size_t lead = len - 1 - tail;
  const auto b = static_cast<uint8_t>(s[lead]);
  const size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
  if (need > tail + 1) std::memset(s + lead, 0, len - lead);
}

template <size_t N>
void trim_partial_utf8(char (&s)[N]) {
  trim_partial_utf8(s, N);
}

// pread that retries EINTR and short reads; false on EOF before n bytes or an error.
bool pread_all(int fd, void* buf, size_t n, off_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += r;
  }
  return true;
}

// Checks a copied record for the things a reader depends on: bounds and NUL-terminated text.
std::string validate(const RunRecord& r) {
  if (r.record_size != sizeof(RunRecord))
    return "record_size field " + std::to_string(r.record_size) + " != expected " +
           std::to_string(sizeof(RunRecord));
  if (r.num_stages > static_cast<uint32_t>(kMaxStages))
    return "num_stages " + std::to_string(r.num_stages) + " exceeds the maximum " +
           std::to_string(kMaxStages);
  if (r.num_pools > static_cast<uint32_t>(kMaxPools))
    return "num_pools " + std::to_string(r.num_pools) + " exceeds the maximum " +
           std::to_string(kMaxPools);
  if (static_cast<uint32_t>(r.state) > static_cast<uint32_t>(RunState::failed))
    return "run state " + std::to_string(static_cast<uint32_t>(r.state)) + " is not a known state";
  if (!nul_terminated(r.run_name, sizeof r.run_name)) return "run_name is not NUL-terminated";
  if (!nul_terminated(r.preset, sizeof r.preset)) return "preset is not NUL-terminated";
  if (!nul_terminated(r.device, sizeof r.device)) return "device is not NUL-terminated";
  if (!nul_terminated(r.run_dir, sizeof r.run_dir)) return "run_dir is not NUL-terminated";
  for (uint32_t i = 0; i < r.num_stages; ++i) {
    const StageCounters& s = r.stages[i];
    if (!nul_terminated(s.name, sizeof s.name) || !nul_terminated(s.kind, sizeof s.kind))
      return "stage " + std::to_string(i) + " name or kind is not NUL-terminated";
  }
  for (uint32_t i = 0; i < r.num_pools; ++i) {
    if (!nul_terminated(r.pools[i].name, sizeof r.pools[i].name))
      return "pool " + std::to_string(i) + " name is not NUL-terminated";
  }
  return {};
}

// Reads the record behind an open descriptor; `path` only names the file in messages.
ReadResult read_record_fd(int fd, const std::string& path) {
  ReadResult out;
  auto fail = [&](const std::string& what) {
    out.error = path + ": " + what;
    return out;
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail("cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return fail("not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);

  // Header first, so a record of another layout (and so another size) is named as such.
  struct Header {
    uint32_t magic, layout_version, record_size;
  } h{};
  static_assert(offsetof(RunRecord, magic) == 0 && offsetof(RunRecord, layout_version) == 4 &&
                offsetof(RunRecord, record_size) == 8);
  if (size < sizeof h || !pread_all(fd, &h, sizeof h, 0))
    return fail("truncated: " + std::to_string(size) + " bytes, not a slipstream stats record");
  if (h.magic != kMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08X", h.magic);
    return fail(std::string("not a slipstream stats record (magic ") + hex + ")");
  }
  if (h.layout_version != kLayoutVersion)
    return fail("stats record layout version " + std::to_string(h.layout_version) +
                ", this slipstream-smi reads version " + std::to_string(kLayoutVersion) +
                "; use the slipstream-smi of the same build");
  if (size != sizeof(RunRecord))
    return fail(std::string(size < sizeof(RunRecord) ? "truncated" : "oversized") + ": " +
                std::to_string(size) + " bytes, a version " + std::to_string(kLayoutVersion) +
                " record is " + std::to_string(sizeof(RunRecord)) + " bytes");

  // Seqlock read: sequence, record, sequence again; keep the copy when both reads agree and
  // are even. pread never faults (unlike a mapping of a file someone truncates), and the
  // acquire fences keep the three reads in order.
  constexpr off_t kSeqOffset = offsetof(RunRecord, sequence);
  constexpr int kAttempts = 50;
  RunRecord copy;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    uint32_t before = 0, after = 0;
    if (!pread_all(fd, &before, sizeof before, kSeqOffset))
      return fail("read failed: " + errno_text(errno));
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((before & 1u) == 0) {
      if (!pread_all(fd, &copy, sizeof copy, 0)) return fail("truncated while reading");
      std::atomic_thread_fence(std::memory_order_acquire);
      if (!pread_all(fd, &after, sizeof after, kSeqOffset))
        return fail("read failed: " + errno_text(errno));
      if (before == after) {
        copy.sequence = before;
        if (std::string why = validate(copy); !why.empty()) return fail(why);
        out.record = copy;
        return out;
      }
    }
    // A writer is mid-update; updates take microseconds.
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return fail("record kept changing under the reader (" + std::to_string(kAttempts) +
              " torn reads); the writer may have died mid-update");
}

// Parses "slipstream-<uid>-<pid>.stats"; false for any other name.
bool parse_record_name(std::string_view name, uint32_t& uid, int& pid) {
  constexpr std::string_view kPrefix = "slipstream-", kSuffix = ".stats";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix))
    return false;
  std::string_view mid = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  auto dash = mid.find('-');
  if (dash == std::string_view::npos) return false;
  auto parse = [](std::string_view digits, uint64_t max, uint64_t& value) {
    if (digits.empty() || digits.size() > 10) return false;
    value = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    return value <= max;
  };
  uint64_t u = 0, p = 0;
  if (!parse(mid.substr(0, dash), UINT32_MAX, u) || !parse(mid.substr(dash + 1), INT32_MAX, p) ||
      p == 0)
    return false;
  uid = static_cast<uint32_t>(u);
  pid = static_cast<int>(p);
  return true;
}

}  // namespace

std::string default_dir() {
  const char* env = std::getenv("SLIPSTREAM_STATS_DIR");
  return env && *env ? std::string(env) : std::string("/dev/shm");
}

std::string record_path(const std::string& dir, uint32_t uid, int pid) {
  std::string path = dir;
  if (path.empty() || path.back() != '/') path += '/';
  return path + "slipstream-" + std::to_string(uid) + "-" + std::to_string(pid) + ".stats";
}

RecordWriter::RecordWriter(const std::string& dir) {
  const std::string d = dir.empty() ? default_dir() : dir;
  path_ = record_path(d, static_cast<uint32_t>(::geteuid()), static_cast<int>(::getpid()));
  // Build the record under a temporary name and rename it into place, so a reader never sees
  // a half-initialised file; O_EXCL|O_NOFOLLOW refuse anything planted at that name.
  const std::string tmp = path_ + ".tmp";
  ::unlink(tmp.c_str());
  fd_ = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd_ < 0) throw std::runtime_error(tmp + ": cannot create stats record: " + errno_text(errno));
  auto fail = [&](const std::string& what) {
    int err = errno;
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp.c_str());
    throw std::runtime_error(tmp + ": " + what + ": " + errno_text(err));
  };
  // The umask may have cleared bits of 0600 but never adds any; fchmod makes it exact.
  if (::fchmod(fd_, 0600) != 0) fail("fchmod");
  if (::ftruncate(fd_, sizeof(RunRecord)) != 0) fail("ftruncate");

  RunRecord init;
  std::memset(&init, 0, sizeof init);
  init.magic = kMagic;
  init.layout_version = kLayoutVersion;
  init.record_size = sizeof(RunRecord);
  init.pid = static_cast<int32_t>(::getpid());
  init.uid = static_cast<uint32_t>(::geteuid());
  init.state = RunState::starting;
  init.start_unix_ns = init.update_unix_ns = unix_now_ns();
  init.loss = std::nan("");
  init.eta_s = -1.0;
  init.data_wait_frac_recent = std::nan("");
  init.validation_loss = std::nan("");
  init.best_validation_loss = std::nan("");
  if (::pwrite(fd_, &init, sizeof init, 0) != static_cast<ssize_t>(sizeof init)) fail("write");

  void* map = ::mmap(nullptr, sizeof(RunRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (map == MAP_FAILED) fail("mmap");
  record_ = static_cast<RunRecord*>(map);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::munmap(record_, sizeof(RunRecord));
    record_ = nullptr;
    errno = err;
    fail("rename to " + path_);
  }
}

RecordWriter::~RecordWriter() {
  if (record_) {
    // A forked child inherits the writer; only the process the record names removes the file.
    if (record_->pid == static_cast<int32_t>(::getpid())) ::unlink(path_.c_str());
    ::munmap(record_, sizeof(RunRecord));
  }
  if (fd_ >= 0) ::close(fd_);
}

void RecordWriter::begin_write() {
  std::atomic_ref<uint32_t> seq(record_->sequence);
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // Orders the odd mark before the data stores that follow: a reader that sees any new data
  // and then fences also sees the odd (or a later) sequence and discards its copy.
  std::atomic_thread_fence(std::memory_order_release);
}

void RecordWriter::end_write() {
  RunRecord& r = *record_;
  trim_partial_utf8(r.run_name);
  trim_partial_utf8(r.preset);
  trim_partial_utf8(r.device);
  trim_partial_utf8(r.run_dir);
  for (auto& st : r.stages) {
    trim_partial_utf8(st.name);
    trim_partial_utf8(st.kind);
  }
  for (auto& p : r.pools) trim_partial_utf8(p.name);
  std::atomic_ref<uint32_t> seq(record_->sequence);
  // Release: every data store of this update is visible before the even mark is.
  seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

ReadResult read_record(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {std::nullopt, path + ": cannot open: " + errno_text(errno)};
  FdCloser closer{fd};
  return read_record_fd(fd, path);
}

namespace {

// When process `pid` started, in Unix seconds (/proc/PID/stat's starttime after /proc/stat's
// btime); 0 when unknown.
double process_start_unix_s(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (!p) return 0;
  // Fields after the name: state (3rd) ... starttime (22nd).
  unsigned long long start_ticks = 0;
  int field = 2;
  for (const char* q = p + 1; *q && field < 22; ++q)
    if (*q == ' ' && ++field == 22) start_ticks = std::strtoull(q + 1, nullptr, 10);
  FILE* st = std::fopen("/proc/stat", "r");
  if (!st) return 0;
  unsigned long long btime = 0;
  char line[256];
  while (std::fgets(line, sizeof line, st))
    if (std::sscanf(line, "btime %llu", &btime) == 1) break;
  std::fclose(st);
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (!btime || hz <= 0) return 0;
  return static_cast<double>(btime) + static_cast<double>(start_ticks) / static_cast<double>(hz);
}

}  // namespace

std::vector<FoundRecord> find_records(const std::string& dir_in) {
  const std::string dir = dir_in.empty() ? default_dir() : dir_in;
  std::vector<FoundRecord> found;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return found;
  const auto me = static_cast<uint32_t>(::geteuid());
  std::vector<std::pair<int, std::string>> candidates;
  while (dirent* e = ::readdir(d)) {
    uint32_t uid = 0;
    int pid = 0;
    // Other users' records are skipped by name, before any open.
    if (parse_record_name(e->d_name, uid, pid) && uid == me)
      candidates.emplace_back(pid, e->d_name);
  }
  ::closedir(d);
  std::sort(candidates.begin(), candidates.end());

  for (const auto& [pid, name] : candidates) {
    std::string path = record_path(dir, me, pid);
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;  // vanished (run ended) or a symlink: not a record of ours
    FdCloser closer{fd};
    struct stat st {};
    // Named like ours but owned by someone else (planted in a shared dir): never read it.
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    // ESRCH: no such process. EPERM: the pid now belongs to another user, so it is not the
    // run (ours always accept our signals). Either way the writer is gone without cleaning up
    // (crash, SIGKILL). Remove the file, but only if the name still refers to the file we
    // checked, not a new run that reused the pid.
    auto remove_stale = [&] {
      struct stat now {};
      if (::lstat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev)
        ::unlink(path.c_str());
    };
    if (::kill(pid, 0) != 0 && (errno == ESRCH || errno == EPERM)) {
      remove_stale();
      continue;
    }
    ReadResult r = read_record_fd(fd, path);
    // A process that started after the run did holds a reused pid: the run is gone. (The run's
    // start is stamped after its setup, so its own process always started before it.)
    if (r.record && r.record->start_unix_ns != 0) {
      const double started = process_start_unix_s(pid);
      if (started > static_cast<double>(r.record->start_unix_ns) * 1e-9 + 2.0) {
        remove_stale();
        continue;
      }
    }
    if (r.record && r.record->pid != pid) {
      r.error = path + ": record names pid " + std::to_string(r.record->pid) +
                ", the file name pid " + std::to_string(pid);
      r.record.reset();
    }
    found.push_back({std::move(path), std::move(r)});
  }
  return found;
}

}  // namespace slipstream::stats
