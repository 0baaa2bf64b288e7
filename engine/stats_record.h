// The per-run statistics record that a running pipeline publishes and slipstream-smi reads.
//
// Layout (kLayoutVersion): one file per run, `<dir>/slipstream-<uid>-<pid>.stats`, where <dir> is
// $SLIPSTREAM_STATS_DIR or /dev/shm. Mode 0600: only the owner can read it. The file holds
// exactly one RunRecord (fixed size, little-endian, no pointers), mapped shared by the writer
// and updated a few times a second under a sequence lock: the writer makes `sequence` odd,
// writes, then makes it even again; a reader copies the record and keeps the copy only when
// `sequence` was even and unchanged across the copy. Any change to these structs bumps
// kLayoutVersion; readers refuse other versions with a message naming both.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace slipstream::stats {

inline constexpr uint32_t kMagic = 0x53504C53;  // "SLPS" read little-endian
inline constexpr uint32_t kLayoutVersion = 3;
inline constexpr int kMaxStages = 64;
inline constexpr int kMaxPools = 4;

enum class RunState : uint32_t { starting = 0, running = 1, finishing = 2, done = 3, failed = 4 };

// Counters for one stage. Totals are cumulative since the run started; the *_recent fields
// are computed by the publisher over its last ~1 s window so a one-shot reader sees rates.
struct StageCounters {
  char name[48];               // stage name from the graph (NUL-terminated)
  char kind[48];               // stage kind
  uint64_t items_in;           // items started
  uint64_t items_out;          // items finished (emitted downstream)
  uint64_t busy_ns;            // time inside the stage's body, summed over its workers
  uint64_t wait_input_ns;      // time a worker slot sat idle with nothing queued
  uint64_t blocked_output_ns;  // time finished work waited for downstream capacity
  uint32_t queue_depth;        // items queued in front of the stage now
  uint32_t queue_capacity;     // bound on that queue (0 = unbounded)
  uint32_t concurrency;        // worker slots (1 = serial)
  uint32_t flags;              // kStageTrainable | kStageSource | ...
  double items_per_s_recent;
  double busy_frac_recent;            // busy time / (wall time * concurrency), 0..1
  double wait_input_frac_recent;      // 0..1
  double blocked_output_frac_recent;  // 0..1
  double mean_latency_ms_recent;      // mean body time per item
};
inline constexpr uint32_t kStageSource = 1u << 0;
inline constexpr uint32_t kStageTrainable = 1u << 1;
inline constexpr uint32_t kStageLoss = 1u << 2;
inline constexpr uint32_t kStageDevice = 1u << 3;  // runs on the accelerator

struct PoolCounters {
  char name[32];  // "device:cuda:0", "pinned", "host"
  uint64_t in_use_bytes;
  uint64_t reserved_bytes;
  uint64_t peak_bytes;
  uint64_t allocations;
  uint64_t failures;
};

struct RunRecord {
  uint32_t magic;
  uint32_t layout_version;
  uint32_t record_size;  // sizeof(RunRecord) as written
  uint32_t sequence;     // seqlock; accessed through std::atomic_ref
  int32_t pid;
  uint32_t uid;
  RunState state;
  uint32_t num_stages;
  uint32_t num_pools;
  uint32_t reserved0;
  char run_name[128];
  char preset[64];
  char device[32];  // "cpu", "cuda:0"
  char run_dir[256];
  uint64_t start_unix_ns;
  uint64_t update_unix_ns;
  uint64_t step;
  uint64_t total_steps;  // 0 when unknown
  uint64_t samples;
  double loss;           // latest training loss (NaN before the first)
  double steps_per_s;    // recent
  double samples_per_s;  // recent
  double eta_s;          // seconds to total_steps at the recent rate; negative when unknown
  // run.cuda_graph: training batches recorded, and those replayed from a CUDA graph (both 0
  // when graph mode is off).
  uint64_t graph_batches;
  uint64_t graph_replayed;
  // The share of the recent wall time the trainable section waited for its next batch (the
  // console's "data wait"); NaN before the first step.
  double data_wait_frac_recent;
  uint64_t host_rss_bytes;         // the process's resident memory
  uint64_t device_reserved_bytes;  // device memory the run's pools hold (0 without a GPU)
  double validation_loss;          // the latest validation loss; NaN before the first
  double best_validation_loss;     // the run's lowest so far (a resume's too); NaN before the first
  StageCounters stages[kMaxStages];
  PoolCounters pools[kMaxPools];
};
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);
static_assert(std::is_trivially_copyable_v<RunRecord>);

// Writer side: creates (mode 0600) and maps the run's record file; removes it on destruction.
class RecordWriter {
 public:
  // dir empty -> default_dir(). Throws std::runtime_error naming the path on failure.
  explicit RecordWriter(const std::string& dir = {});
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Runs fn(record) between the seqlock's odd and even marks. One writer: call it from one
  // thread at a time. Text fields cut inside a multi-byte UTF-8 character lose that partial
  // character before the record is published.
  template <class Fn>
  void update(Fn&& fn) {
    begin_write();
    fn(*record_);
    end_write();
  }
  const std::string& path() const { return path_; }

 private:
  void begin_write();
  void end_write();
  RunRecord* record_ = nullptr;
  std::string path_;
  int fd_ = -1;
};

// Reader side.
std::string default_dir();  // $SLIPSTREAM_STATS_DIR or /dev/shm
std::string record_path(const std::string& dir, uint32_t uid, int pid);

struct ReadResult {
  std::optional<RunRecord> record;  // set on success
  std::string error;                // set on failure: names the file and what is wrong
};
// Reads one record file: checks size, magic, layout version (naming both versions when they
// differ), num_stages/num_pools bounds and NUL termination; retries a torn read a few times.
ReadResult read_record(const std::string& path);

struct FoundRecord {
  std::string path;
  ReadResult result;
};
// Every record of the calling user in dir. Records whose pid no longer exists, or now belongs to
// a process that started after the run did (a reused pid), are removed (stale) and not
// returned. Other users' files are never opened.
std::vector<FoundRecord> find_records(const std::string& dir = {});

}  // namespace slipstream::stats
