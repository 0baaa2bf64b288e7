// TensorBoard event files: `events.out.tfevents.<unix seconds>.<host>` in a run directory, the
// name TensorBoard looks for (`tensorboard --logdir runs`). Records are TFRecord-framed Event
// protos (engine/tensorboard/event.proto); the first says the file version, then one per
// metrics row holds the row's numbers as scalars. Like metrics.jsonl (engine/metrics_log.h), each
// record is written whole with one checked write(2), so a live run's file is always readable and
// a full disk is reported at the record it hits instead of leaving a torn file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::tensorboard {

struct Scalar {
  std::string tag;  // e.g. "train/loss"
  double value;     // stored as a float, as TensorBoard's scalars are; NaN and Inf are kept
};

class EventFileWriter {
 public:
  EventFileWriter() = default;
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  ~EventFileWriter();

  // The file name TensorBoard expects.
  static std::string file_name(uint64_t unix_seconds, const std::string& host);

  // Creates a new events file in `dir`, never reusing one: a resumed run starting within the
  // same second as an earlier process gets `.1`, `.2`, ... after the name (which sorts after
  // it, the order TensorBoard reads a directory's files in). Throws naming the path on failure.
  void open_in(const std::string& dir);
  // Opens `path` (created, or truncated) and writes the file-version record; throws naming the
  // path on failure.
  void open(const std::string& path);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

  // One Event at `step` whose Summary holds `scalars`. On failure returns false and keeps the
  // reason in error(); the file then holds no part of the record.
  bool write_scalars(int64_t step, double wall_time, const std::vector<Scalar>& scalars);
  // A SessionLog START at `step`, the start of a process's training. TensorBoard takes every
  // START after a run's first for a restart and drops what came before it at steps >= `step`:
  // what a resumed run writes again. false and error() on failure.
  bool write_session_start(int64_t step, double wall_time);
  const std::string& error() const { return error_; }

  // TFRecord framing of one record: length, masked CRC-32C of the length, data, masked CRC-32C
  // of the data (little-endian).
  static std::string frame(const std::string& data);

 private:
  void adopt(int fd, const std::string& path);  // writes the file-version record
  bool write_record(const std::string& data);

  int fd_ = -1;
  std::string path_, error_;
};

}  // namespace slipstream::tensorboard
