// The replay loader's inputs: see replay_inputs.h.
#include "stages/melee/replay_inputs.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "stages/melee/feature_corpus.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/synth.h"

namespace fs = std::filesystem;

namespace slipstream::melee {

bool is_corpus(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "manifest.json", ec);
}

namespace {

// Corpora inside a folder given as a path are not read (a folder gives its .slp files): each is
// named, with how to read it, rather than left out unsaid.
void note_nested_corpora(const fs::path& folder, std::vector<std::string>& ignored) {
  std::error_code ec;
  fs::recursive_directory_iterator it(folder, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_directory(ec) || it->is_symlink(ec)) continue;
    const bool features = is_feature_corpus(it->path());
    if (!features && !is_corpus(it->path())) continue;
    ignored.push_back(it->path().string() + ": a " + (features ? "feature " : "") +
                      "corpus inside " + folder.string() +
                      ", which gives its .slp files only, is not read; name it in "
                      "replays.paths to read it");
    it.disable_recursion_pending();
  }
}

}  // namespace

Inputs resolve_inputs(const std::vector<std::string>& paths) {
  Inputs in;
  for (const std::string& p : paths) {
    std::vector<fs::path> expanded;
    const bool pattern = p.find_first_of("*?[") != std::string::npos;
    if (pattern) {
      glob_t g{};
      if (glob(p.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i) expanded.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      if (expanded.empty()) in.missing.push_back(p);
    } else {
      expanded.emplace_back(p);
    }
    for (const fs::path& e : expanded) {
      std::error_code ec;
      if (fs::is_directory(e, ec)) {
        // Both kinds built into one folder: the newer is read, and the report says so (the
        // feature corpus was read whatever the game corpus built after it held).
        bool features = is_feature_corpus(e);
        if (features && is_corpus(e)) {
          const auto game_time = fs::last_write_time(e / "manifest.json", ec);
          const auto feature_time = fs::last_write_time(e / kFeatureManifestName, ec);
          features = !ec && feature_time >= game_time;
          in.ignored.push_back(e.string() + " holds a feature corpus (" + kFeatureManifestName +
                               ") and a game corpus (manifest.json): the newer, the " +
                               (features ? "feature" : "game") +
                               " corpus, is read; remove the other's files or build into "
                               "separate folders");
        }
        if (features) {
          in.feature_corpora.push_back(e);
        } else if (is_corpus(e)) {
          in.corpora.push_back(e);
          // A corpus folder is read through its manifest: replays put beside it are not in it.
          size_t beside = 0;
          for (const auto& f : fs::directory_iterator(e, ec))
            beside += f.path().extension() == ".slp";
          if (beside)
            in.ignored.push_back(
                e.string() + ": " + std::to_string(beside) +
                " .slp file(s) beside its manifest.json are not in the corpus and are not read; "
                "rebuild it with `slipstream corpus build` to include them");
        } else {
          const fs::path dirs[] = {e};
          slp::ReplayScan scan = slp::scan_replays(dirs);
          note_nested_corpora(e, in.ignored);
          in.files.insert(in.files.end(), scan.files.begin(), scan.files.end());
          for (const slp::SkippedPath& s : scan.skipped)
            in.unreadable.push_back(s.path.string() + " (" + s.reason + ")");
        }
      } else if (fs::is_regular_file(e, ec)) {
        // A glob may sweep in READMEs; a file named explicitly is taken as a replay.
        if (!pattern || e.extension() == ".slp") in.files.push_back(e);
      } else if (fs::exists(e, ec)) {
        // A FIFO or device would block or never end: never opened, only reported.
        if (!pattern || e.extension() == ".slp")
          in.unreadable.push_back(e.string() + " (not a regular file)");
      } else if (!pattern) {
        in.missing.push_back(p);
      }
    }
  }
  return in;
}

std::string describe_empty_paths(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& p : paths) {
    std::error_code ec;
    std::string what;
    if (p.find_first_of("*?[") != std::string::npos)
      what = "matches no .slp file";
    else if (!fs::exists(p, ec))
      what = "not found";
    else if (fs::is_directory(p, ec))
      what = "a folder with no .slp files";
    else
      what = "not a replay file";
    out += (out.empty() ? "" : ", ") + p + " (" + what + ")";
  }
  return out;
}

namespace {

// Whether a folder holds a .slp file somewhere below it (symlinked folders not followed, as
// the loader's scan); stops at the first, so a large tree costs little here.
bool folder_holds_slp(const fs::path& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec),
       end;
       !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".slp" && !it->is_directory(ec)) return true;
  return false;
}

// Whether path `p` gives the loader anything: a corpus, a file named, a folder with a .slp
// file below it, or a glob that matches one of those.
bool holds_replays(const std::string& p) {
  std::error_code ec;
  if (p.find_first_of("*?[") != std::string::npos) return !holds_nothing(resolve_inputs({p}));
  if (!fs::is_directory(p, ec)) return fs::exists(p, ec);
  return is_corpus(p) || is_feature_corpus(p) || folder_holds_slp(p);
}

}  // namespace

std::string check_paths_hold_replays(const std::string& param,
                                     const std::vector<std::string>& paths) {
  // Only when none of them holds a replay: one empty folder among others (an inbox not filled
  // yet) is not a mistake to stop a run for.
  std::vector<std::string> given;
  for (const std::string& p : paths) {
    std::error_code ec;
    const bool glob = p.find_first_of("*?[") != std::string::npos;
    if (p.empty() || (!glob && !fs::exists(p, ec))) continue;  // must_exist's to name
    if (holds_replays(p)) return {};
    given.push_back(p);
  }
  if (given.empty()) return {};
  return "parameter '" + param + "': no replays in " + describe_empty_paths(given) +
         "; point it at .slp files, folders, globs or a corpus";
}

namespace {

size_t count_slp(const fs::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".slp") ++n;
  return n;
}

}  // namespace

// Returns the directory holding `games` synthetic games for `seed`, writing them when absent.
// Several processes (the ranks of one run) may get here at once: a lock file beside the set
// lets one write it (aside, then renamed into place) while the others wait and then read it.
fs::path synthetic_games(const fs::path& root, uint64_t seed, int64_t games, bool& generated) {
  const std::string name = std::to_string(seed) + "-" + std::to_string(games);
  const fs::path dir = root / name;
  auto complete = [&] {
    std::error_code ec;
    return fs::is_directory(dir, ec) && count_slp(dir) == static_cast<size_t>(games);
  };
  generated = false;
  if (complete()) return dir;
  fs::create_directories(root);
  const fs::path lock_path = root / (name + ".lock");
  const int lock = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0)
    throw std::runtime_error("cannot create " + lock_path.string() + ": " + std::strerror(errno));
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the flock
  } unlock{lock};
  while (::flock(lock, LOCK_EX) != 0)
    if (errno != EINTR)
      throw std::runtime_error("cannot lock " + lock_path.string() + ": " + std::strerror(errno));
  if (complete()) return dir;  // another process wrote it while this one waited
  std::error_code ec;
  fs::remove_all(dir, ec);  // a damaged set: ours only ever appear whole
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  slp::write_synthetic_games(tmp, static_cast<int>(games), seed, slp::SynthOptions{}.frames);
  fs::rename(tmp, dir);
  generated = true;
  return dir;
}

}  // namespace slipstream::melee
