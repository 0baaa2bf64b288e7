#include "engine/metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

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

size_t MetricsLog::drop_rows_after(const std::string& path, uint64_t step) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return 0;
  std::ifstream in(path);
  std::vector<std::string> kept;
  size_t dropped = 0;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    bool past = j.is_object() && j.contains("step") && j["step"].is_number_unsigned() &&
                j["step"].get<uint64_t>() > step;
    // A line that does not parse is a row torn by a kill mid-write.
    if (!j.is_object() || past) {
      ++dropped;
      continue;
    }
    kept.push_back(line);
  }
  if (dropped == 0) return 0;
  in.close();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& k : kept) out << k << "\n";
    out.flush();
    if (!out)
      throw std::runtime_error(tmp + ": cannot write (while dropping rows after step " +
                               std::to_string(step) + ")");
  }
  fs::rename(tmp, path);
  return dropped;
}

}  // namespace slipstream
