// A scratch directory for a test, removed afterwards.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

namespace slipstream::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/slipstream-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

}  // namespace slipstream::testing
