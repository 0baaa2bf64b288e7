#include "engine/run_info.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "engine/atomic_file.h"
#include "engine/build_info.h"

namespace fs = std::filesystem;

namespace slipstream {

std::string time_text(const char* format, bool utc) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  if (utc)
    gmtime_r(&t, &tm);
  else
    localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

void append_run_info(const std::string& run_dir, const Invocation& inv) {
  const fs::path path = fs::path(run_dir) / "run.json";
  nlohmann::json doc = nlohmann::json::object();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("invocations") || !doc["invocations"].is_array()) {
      fs::rename(path, fs::path(run_dir) / "run.json.bad", ec);
      doc = nlohmann::json::object();
    }
  }
  if (!doc.contains("invocations")) doc["invocations"] = nlohmann::json::array();
  nlohmann::json e;
  e["command"] = inv.command;
  e["cwd"] = fs::current_path(ec).string();
  e["host"] = host_name();
  e["time"] = time_text("%Y-%m-%dT%H:%M:%SZ", true);
  e["version"] = std::string(version());
  e["commit"] = std::string(git_commit());
  e["device"] = inv.device;
  e["resumed_from"] =
      inv.resumed_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(inv.resumed_from);
  doc["invocations"].push_back(std::move(e));
  write_file_atomically(path.string(), doc.dump(2) + "\n");
}

}  // namespace slipstream
