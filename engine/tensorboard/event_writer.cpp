#include "engine/tensorboard/event_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "engine/crc32c.h"
#include "tensorboard/event.pb.h"

namespace slipstream::tensorboard {

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

EventFileWriter::~EventFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

std::string EventFileWriter::file_name(uint64_t unix_seconds, const std::string& host) {
  return "events.out.tfevents." + std::to_string(unix_seconds) + "." + host;
}

std::string EventFileWriter::frame(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, crc32c_mask(crc32c(out.data(), 8)), 4);
  out += data;
  put_le(out, crc32c_mask(crc32c(data.data(), data.size())), 4);
  return out;
}

void EventFileWriter::adopt(int fd, const std::string& path) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  path_ = path;
  error_.clear();
  tfevents::Event ev;
  ev.set_wall_time(static_cast<double>(std::time(nullptr)));
  ev.set_file_version("brain.Event:2");
  if (!write_record(ev.SerializeAsString())) throw std::runtime_error(error_);
}

void EventFileWriter::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  adopt(fd, path);
}

void EventFileWriter::open_in(const std::string& dir) {
  const auto now = static_cast<uint64_t>(std::time(nullptr));
  const std::string base = (std::filesystem::path(dir) / file_name(now, host_name())).string();
  for (int k = 0;; ++k) {
    std::string path = k == 0 ? base : base + "." + std::to_string(k);
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && k < 1000) continue;
    if (fd < 0)
      throw std::runtime_error(path + ": cannot create: " + std::string(std::strerror(errno)));
    adopt(fd, path);
    return;
  }
}

bool EventFileWriter::write_scalars(int64_t step, double wall_time,
                                    const std::vector<Scalar>& scalars) {
  tfevents::Event ev;
  ev.set_wall_time(wall_time);
  ev.set_step(step);
  auto* summary = ev.mutable_summary();
  for (const auto& s : scalars) {
    auto* v = summary->add_value();
    v->set_tag(s.tag);
    v->set_simple_value(static_cast<float>(s.value));
  }
  return write_record(ev.SerializeAsString());
}

bool EventFileWriter::write_session_start(int64_t step, double wall_time) {
  tfevents::Event ev;
  ev.set_wall_time(wall_time);
  ev.set_step(step);
  ev.mutable_session_log()->set_status(tfevents::SessionLog::START);
  return write_record(ev.SerializeAsString());
}

bool EventFileWriter::write_record(const std::string& data) {
  if (fd_ < 0) return false;
  const std::string rec = frame(data);
  const char* p = rec.data();
  size_t left = rec.size();
  off_t start = ::lseek(fd_, 0, SEEK_END);
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = path_ + ": cannot append a record: " +
               (n < 0 ? std::strerror(errno) : std::string("no progress"));
      // Take back the part that did get written, so the file ends on a whole record.
      if (start >= 0 && left < rec.size() && ::ftruncate(fd_, start) != 0)
        error_ += " (torn record)";
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace slipstream::tensorboard
