// libFuzzer target for the stats record reader (what slipstream-smi runs on every file in the
// stats dir): any file contents must be read as a valid record or rejected with an error,
// never crash or read out of bounds; a record it accepts must satisfy what readers rely on.
//
// Seed: `stats_record_fuzz -write_seed=DIR` writes a record made by the real RecordWriter
// (with stages and pools filled in) into DIR, then exits.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "engine/stats_record.h"

namespace {

using namespace slipstream::stats;

void check(bool ok) {
  if (!ok) std::abort();
}

std::string& temp_dir() {
  static std::string dir;
  return dir;
}

void write_file(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  check(fd >= 0);
  check(::write(fd, data, size) == static_cast<ssize_t>(size));
  ::close(fd);
}

void check_accepted(const ReadResult& r) {
  check(r.record.has_value() != !r.error.empty());
  if (!r.record) return;
  const RunRecord& rec = *r.record;
  check(rec.magic == kMagic && rec.layout_version == kLayoutVersion);
  check(rec.record_size == sizeof(RunRecord));
  check(rec.num_stages <= kMaxStages && rec.num_pools <= kMaxPools);
  check(static_cast<uint32_t>(rec.state) <= static_cast<uint32_t>(RunState::failed));
  // Readers print these with %s / strlen: each must end inside its field.
  check(::strnlen(rec.run_name, sizeof rec.run_name) < sizeof rec.run_name);
  check(::strnlen(rec.preset, sizeof rec.preset) < sizeof rec.preset);
  check(::strnlen(rec.device, sizeof rec.device) < sizeof rec.device);
  check(::strnlen(rec.run_dir, sizeof rec.run_dir) < sizeof rec.run_dir);
  for (uint32_t i = 0; i < rec.num_stages; ++i) {
    check(::strnlen(rec.stages[i].name, sizeof rec.stages[i].name) < sizeof rec.stages[i].name);
    check(::strnlen(rec.stages[i].kind, sizeof rec.stages[i].kind) < sizeof rec.stages[i].kind);
  }
  for (uint32_t i = 0; i < rec.num_pools; ++i)
    check(::strnlen(rec.pools[i].name, sizeof rec.pools[i].name) < sizeof rec.pools[i].name);
}

int write_seed(const std::string& dir) {
  RecordWriter w(dir);
  w.update([](RunRecord& r) {
    r.state = RunState::running;
    std::snprintf(r.run_name, sizeof r.run_name, "fuzz-seed");
    std::snprintf(r.preset, sizeof r.preset, "cpu_quick");
    std::snprintf(r.device, sizeof r.device, "cpu");
    std::snprintf(r.run_dir, sizeof r.run_dir, "runs/fuzz-seed");
    r.step = 10;
    r.total_steps = 100;
    r.loss = 1.5;
    r.num_stages = 3;
    const char* names[] = {"replays", "core", "loss"};
    for (uint32_t i = 0; i < r.num_stages; ++i) {
      std::snprintf(r.stages[i].name, sizeof r.stages[i].name, "%s", names[i]);
      std::snprintf(r.stages[i].kind, sizeof r.stages[i].kind, "kind%u", i);
      r.stages[i].items_in = r.stages[i].items_out = 10;
      r.stages[i].concurrency = 1;
    }
    r.num_pools = 1;
    std::snprintf(r.pools[0].name, sizeof r.pools[0].name, "host");
  });
  // Copy out the bytes: the writer removes its file when it goes away.
  const ReadResult r = read_record(w.path());
  check(r.record.has_value());
  write_file(dir + "/seed.stats", &*r.record, sizeof *r.record);
  std::fprintf(stderr, "wrote %s/seed.stats (%zu bytes)\n", dir.c_str(), sizeof(RunRecord));
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = (*argv)[i];
    if (arg.starts_with("-write_seed=")) std::exit(write_seed(std::string(arg.substr(12))));
  }
  // $TMPDIR, e.g. /dev/shm: every iteration writes the file twice.
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/stats_record_fuzz.XXXXXX";
  check(::mkdtemp(dir.data()) != nullptr);
  temp_dir() = dir;
  // Planted non-files at a record's name are refused without blocking or following them.
  const std::string fifo = temp_dir() + "/fifo", link = temp_dir() + "/link";
  check(::mkfifo(fifo.c_str(), 0600) == 0);
  check(!read_record(fifo).error.empty());
  check(::symlink("/etc/passwd", link.c_str()) == 0);
  check(!read_record(link).error.empty());
  check(!read_record(temp_dir()).error.empty());
  check(!read_record(temp_dir() + "/missing").error.empty());
  // A record left mid-update (odd sequence) is refused after the retries, not returned.
  RunRecord torn;
  std::memset(&torn, 0, sizeof torn);
  torn.magic = kMagic;
  torn.layout_version = kLayoutVersion;
  torn.record_size = sizeof torn;
  torn.sequence = 1;
  write_file(temp_dir() + "/torn.stats", &torn, sizeof torn);
  check(!read_record(temp_dir() + "/torn.stats").record.has_value());
  torn.sequence = 2;
  write_file(temp_dir() + "/torn.stats", &torn, sizeof torn);
  check(read_record(temp_dir() + "/torn.stats").record.has_value());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = temp_dir() + "/record.stats";
  // The bytes as they are: mostly wrong sizes, rejected by the header and size checks. An
  // exact-size input goes through the fitted path only: an odd sequence costs the reader's
  // 50 retries (5 ms), covered once in LLVMFuzzerInitialize.
  if (size != sizeof(RunRecord)) {
    write_file(path, data, size);
    check_accepted(read_record(path));
  }
  // The same bytes fitted to a record's size (cut or zero-padded) with magic and version
  // planted, so every input reaches the field validation behind the header checks.
  RunRecord fitted;
  std::memset(&fitted, 0, sizeof fitted);
  std::memcpy(&fitted, data, std::min(size, sizeof fitted));
  fitted.magic = kMagic;
  fitted.layout_version = kLayoutVersion;
  fitted.sequence &= ~1u;
  write_file(path, &fitted, sizeof fitted);
  check_accepted(read_record(path));
  return 0;
}
