// metrics.jsonl: one JSON object per line, appended by rank 0 of a run. Every row is written
// whole with one write(2) and checked, so a full disk is reported at the row it hits instead of
// leaving a torn file while training goes on.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace slipstream {

class MetricsLog {
 public:
  MetricsLog() = default;
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  ~MetricsLog();

  // Opens `path` for appending (created if missing); throws naming the path on failure.
  void open(const std::string& path);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Appends `line` and a newline. On failure returns false and keeps the reason in error();
  // the file then holds no part of the row.
  // A file deleted or replaced at `path` since it was opened (the run directory removed while
  // the run ran) is opened again first, its folder made again, so the rows from then on are
  // kept; took_over_gone() then says so once.
  bool append(const std::string& line);
  const std::string& error() const { return error_; }
  bool took_over_gone() { return std::exchange(reopened_, false); }

  // A resumed run continues from a checkpoint at `step`: the rows up to it stay (`kept`, the
  // file's new text), rows past it (written before a kill, or by the later part of a rewound
  // run) and a torn last line go (`past`, one line each). Reads only; nothing when `path` is not
  // a regular file.
  struct Split {
    std::string kept;
    std::vector<std::string> past;
  };
  static Split split_at_step(const std::string& path, uint64_t step);
  // The `reason` of the file's last `end` row ("" when it has none, or no such file).
  static std::string last_end_reason(const std::string& path);

 private:
  int fd_ = -1;
  std::string path_, error_;
  bool reopened_ = false;
};

}  // namespace slipstream
