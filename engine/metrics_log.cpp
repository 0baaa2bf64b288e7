#include "engine/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "engine/atomic_file.h"

namespace fs = std::filesystem;

namespace slipstream {

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::open(const std::string& path) {
  if (fd_ >= 0) ::close(fd_);
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
}

bool MetricsLog::append(const std::string& line) {
  if (fd_ < 0) return false;
  struct stat open_file {
  }, at_path{};
  if (::fstat(fd_, &open_file) == 0 &&
      (::stat(path_.c_str(), &at_path) != 0 || at_path.st_ino != open_file.st_ino ||
       at_path.st_dev != open_file.st_dev)) {
    std::error_code ec;
    fs::create_directories(fs::path(path_).parent_path(), ec);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {  // rows into a file no one can read are rows lost: the run's write error
      error_ = path_ + ": gone (the run directory removed?) and cannot be made again: " +
               std::strerror(errno);
      return false;
    }
    ::close(fd_);
    fd_ = fd;
    reopened_ = true;
  }
  std::string row = line + "\n";
  const char* p = row.data();
  size_t left = row.size();
  off_t start = ::lseek(fd_, 0, SEEK_END);
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = path_ + ": cannot append a row: " +
               (n < 0 ? std::strerror(errno) : std::string("no progress"));
      // Take back the part that did get written, so the file ends on a whole row.
      if (start >= 0 && left < row.size() && ::ftruncate(fd_, start) != 0) error_ += " (torn row)";
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

std::string MetricsLog::last_end_reason(const std::string& path) {
  std::ifstream in(path);
  std::string reason;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("split", std::string()) == "end" && j.contains("reason") &&
        j["reason"].is_string())
      reason = j["reason"].get<std::string>();
  }
  return reason;
}

MetricsLog::Split MetricsLog::split_at_step(const std::string& path, uint64_t step) {
  Split out;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    bool past = j.is_object() && j.contains("step") && j["step"].is_number_unsigned() &&
                j["step"].get<uint64_t>() > step;
    // A line that does not parse is a row torn by a kill mid-write.
    if (!j.is_object() || past)
      out.past.push_back(line);
    else
      out.kept += line + "\n";
  }
  if (in.bad()) throw std::runtime_error(path + ": cannot read: " + errno_text(errno));
  return out;
}

}  // namespace slipstream
