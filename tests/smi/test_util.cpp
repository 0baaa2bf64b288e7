#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace slipstream::smi_test {

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/slipstream-smi-test-XXXXXX";
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

stats::RunRecord make_record(int pid) {
  stats::RunRecord r;
  std::memset(&r, 0, sizeof r);
  r.magic = stats::kMagic;
  r.layout_version = stats::kLayoutVersion;
  r.record_size = sizeof r;
  r.pid = pid;
  r.uid = static_cast<uint32_t>(::geteuid());
  r.state = stats::RunState::running;
  r.loss = std::nan("");
  r.eta_s = -1;
  set_text(r.run_name, "hand-made");
  return r;
}

void write_file(const std::string& path, const void* data, size_t size) {
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  bool ok = size == 0 || ::write(fd, data, size) == static_cast<ssize_t>(size);
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write " + path);
}

void write_record(const std::string& path, const stats::RunRecord& record) {
  write_file(path, &record, sizeof record);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

int dead_pid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return static_cast<int>(child);
}

LiveChild::LiveChild() {
  pid_ = ::fork();
  if (pid_ == 0) {
    for (;;) ::pause();
  }
}

LiveChild::~LiveChild() {
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

}  // namespace slipstream::smi_test
