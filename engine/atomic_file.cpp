#include "engine/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

namespace slipstream {

namespace {

[[noreturn]] void fail_errno(const std::string& path, const std::string& what) {
  const int err = errno;
  throw std::runtime_error(path + ": " + what + ": " + errno_text(err));
}

// Unique among processes and threads: two writers of one target never share a temporary file.
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." +
         std::to_string(rd());
}

// The file a write replaces: a symlink's target (the link stays a link, its target is replaced),
// refused when that is not a regular file — a rename over a device (/dev/null) or FIFO would
// replace it with a file.
std::string replaced_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(path);
  // Link by link (a target that does not exist yet is created where the last link points).
  for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  const fs::file_status st = fs::status(p, ec);
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw std::runtime_error(path + ": not a regular file (" +
                             (fs::is_directory(st) ? "a folder" : "a device, FIFO or socket") +
                             "): it is written by replacing it whole; give a file's path");
  return p.string();
}

}  // namespace

std::string errno_text(int err) {
  return std::strerror(err);
}

AtomicFile::AtomicFile(std::string path) : path_(replaced_file(path)), tmp_(temp_name(path_)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_errno(path_, "cannot create the temporary file " + tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno(path_, "cannot write");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail_errno(path_, "cannot write (fsync)");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno(path_, "cannot write (close)");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_errno(path_, "cannot replace it");
  committed_ = true;
  // The rename is durable only once the directory entry is on disk.
  sync_parent_directory(path_);
}

void sync_parent_directory(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail_errno(path, "cannot open its directory to fsync it");
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) fail_errno(path, "cannot fsync its directory");
}

void write_file_atomically(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace slipstream
