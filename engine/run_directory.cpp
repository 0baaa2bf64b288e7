#include "engine/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "engine/atomic_file.h"
#include "engine/checkpoint.h"
#include "engine/config_diff.h"
#include "engine/metrics_log.h"
#include "engine/run_info.h"

namespace fs = std::filesystem;

namespace slipstream {

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace

std::string run_time_stamp() {
  return time_text("%Y%m%d-%H%M%S", /*utc=*/false);
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what,
                             const std::string& writer)
    : path_((fs::path(dir) / ".lock").string()) {
  const std::string& path = path_;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw std::runtime_error(path + ": cannot open the lock file: " + errno_text(err));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = read_text(path);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw std::runtime_error(path + ": cannot lock: " + errno_text(err));
    throw std::runtime_error(
        dir + ": in use by " + (holder.empty() ? std::string("another process") : holder) +
        ", which is writing there; two writers would interleave " + writer +
        ". Wait for it to end" +
        (writer == "its rows and checkpoints" ? " (or stop it with SIGINT, which checkpoints)"
                                              : std::string()) +
        ", then " + what + " again");
  }
  // Who holds it, for the message above: "process <pid> on <host>".
  const std::string me = "process " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The lock holds without the note; only the refusal's message is poorer.
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

bool directory_in_use(const std::string& dir) {
  // A shared lock is refused while a writer holds its exclusive one; several readers may test.
  const int fd = ::open((fs::path(dir) / ".lock").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;  // no lock file: no writer
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

std::string in_use_refusal(const std::string& dir) {
  if (!directory_in_use(dir)) return {};
  try {
    DirectoryLock probe(dir, "resume it");
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};  // released in between: the holder ended
}

bool DirectoryLock::held_at_path() const {
  struct stat held {
  }, at_path{};
  return fd_ >= 0 && ::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 &&
         held.st_ino == at_path.st_ino && held.st_dev == at_path.st_dev;
}

std::string create_fresh_directory(const std::string& base) {
  const fs::path parent = fs::path(base).parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) throw std::runtime_error(parent.string() + ": cannot create: " + ec.message());
  }
  for (int i = 1;; ++i) {
    const std::string dir = i == 1 ? base : base + "-" + std::to_string(i);
    if (::mkdir(dir.c_str(), 0755) == 0) return dir;
    const int err = errno;
    if (err != EEXIST || i > 10000)
      throw std::runtime_error(dir + ": cannot create the run directory: " + errno_text(err));
  }
}

bool update_config_yaml(const std::string& run_dir, const std::string& text) {
  const fs::path cfg = fs::path(run_dir) / "config.yaml";
  std::ifstream in(cfg);
  if (!in) throw std::runtime_error(cfg.string() + ": cannot read: " + errno_text(errno));
  std::string old((std::istreambuf_iterator<char>(in)), {});
  // Comments differ between a first run and its resume (the source file, "as given"): only
  // settings count.
  if (config_differences(old, text, RunKeys::compare).empty()) return false;
  // The previous one first: a failure here leaves config.yaml as it was.
  write_file_atomically((fs::path(run_dir) / "config.previous.yaml").string(), old);
  // The other ranks of a resume read config.yaml as they start, maybe while this runs: a rename
  // gives them one file or the other, whole.
  write_file_atomically(cfg.string(), text);
  return true;
}

std::string SetAside::summary() const {
  if (dir.empty()) return "";
  std::string s = "moved what was past the checkpoint aside, nothing deleted: ";
  if (!checkpoints.empty()) {
    s += "checkpoints ";
    for (size_t i = 0; i < checkpoints.size(); ++i) s += (i ? ", " : "") + checkpoints[i];
    if (rows) s += " and ";
  }
  if (rows) s += std::to_string(rows) + " metrics.jsonl line(s)";
  return s + " -> " + dir;
}

SetAside set_aside_past(const std::string& run_dir, uint64_t step) {
  SetAside out;
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::vector<fs::path> past;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    uint64_t s = 0;
    if ((run_checkpoint_step(name, s)) && s > step) past.push_back(e.path());
  }
  const std::string metrics = (fs::path(run_dir) / "metrics.jsonl").string();
  const MetricsLog::Split rows = MetricsLog::split_at_step(metrics, step);
  if (past.empty() && rows.past.empty()) return out;
  out.dir = create_fresh_directory((fs::path(run_dir) / "set-aside" /
                                    ("after-step-" + std::to_string(step) + "-" + run_time_stamp()))
                                       .string());
  if (!past.empty()) {
    fs::create_directory(fs::path(out.dir) / "checkpoints", ec);
    std::sort(past.begin(), past.end());
    for (const auto& p : past) {
      const fs::path to = fs::path(out.dir) / "checkpoints" / p.filename();
      fs::rename(p, to, ec);
      if (ec)
        throw std::runtime_error(p.string() + ": cannot move it aside to " + to.string() + ": " +
                                 ec.message());
      out.checkpoints.push_back(p.filename().string());
    }
  }
  if (!rows.past.empty()) {
    // The rows reach the aside folder before they leave metrics.jsonl: a failure in between
    // leaves them twice, never nowhere.
    std::string text;
    for (const auto& r : rows.past) text += r + "\n";
    write_file_atomically((fs::path(out.dir) / "metrics.jsonl").string(), text);
    write_file_atomically(metrics, rows.kept);
    out.rows = rows.past.size();
  }
  return out;
}

}  // namespace slipstream
