// CLI glue for the Slippi replay library: `replay info`, `replay dump`, `synth` and
// `corpus build` (with --features, the loader's feature corpus). The work happens in
// stages/melee/slp; this file only wires options.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/command_registry.h"
#include "stages/melee/feature_corpus.h"
#include "stages/melee/slp/corpus.h"
#include "stages/melee/slp/inspect.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/synth.h"

namespace slipstream::slp {
namespace {

[[noreturn]] void fail(const std::string& message, int code = 1) {
  std::cerr << message << "\n";
  throw CLI::RuntimeError(code);
}

void setup_replay(CLI::App& parent) {
  CLI::App* replay = parent.add_subcommand("replay", "Inspect Slippi replay (.slp) files");
  replay->require_subcommand(1);

  struct InfoArgs {
    bool json = false;
    std::vector<std::string> files;
  };
  auto info_args = std::make_shared<InfoArgs>();
  CLI::App* info = replay->add_subcommand("info", "Summarise replays (exit 1 if any has an error)");
  info->add_flag("--json", info_args->json, "Print one JSON array");
  info->add_option("files", info_args->files, "Replay files, or folders (walked for .slp files)")
      ->required();
  info->callback([info_args] {
    nlohmann::json all = nlohmann::json::array();
    bool any_error = false;
    // Folders are walked as the loader walks them; what it would skip in them is said once.
    const std::vector<std::filesystem::path> inputs(info_args->files.begin(),
                                                    info_args->files.end());
    const ReplayScan scan = scan_replays(inputs);
    for (const SkippedPath& s : scan.skipped)
      std::cerr << s.path.string() << ": skipped (" << s.reason << ")\n";
    if (scan.files.empty() && scan.skipped.empty())
      fail("no .slp files in " + [&] {
        std::string given;
        for (const auto& f : info_args->files) given += (given.empty() ? "" : ", ") + f;
        return given;
      }());
    for (const std::filesystem::path& file : scan.files) {
      nlohmann::json j = replay_info_json(file);
      any_error |= replay_info_has_error(j);
      if (info_args->json)
        all.push_back(std::move(j));
      else
        std::cout << replay_info_text(j);
    }
    if (info_args->json) std::cout << dump_json(all) << "\n";
    if (any_error) throw CLI::RuntimeError(1);
  });

  struct DumpArgs {
    std::string file;
    size_t frame_index = 0;
    std::optional<int> port;
    bool json = false;
  };
  auto dump_args = std::make_shared<DumpArgs>();
  CLI::App* dump = replay->add_subcommand("dump", "Print every field of one recorded frame");
  dump->add_option("file", dump_args->file, "Replay file")->required();
  dump->add_option("--frame-index", dump_args->frame_index,
                   "Row as recorded (0 = first, rollbacks included)")
      ->required()
      ->check(CLI::Range(size_t{0}, size_t{1} << 32));
  dump->add_option("--port", dump_args->port, "Only this port (1-4)")->check(CLI::Range(1, 4));
  dump->add_flag("--json", dump_args->json, "Print JSON");
  dump->callback([dump_args] {
    try {
      const Game game = parse_slp_file(dump_args->file);
      const nlohmann::json j = replay_dump_json(game, dump_args->frame_index, dump_args->port);
      std::cout << (dump_args->json ? dump_json(j) + "\n" : replay_dump_text(j));
    } catch (const std::exception& e) {
      fail(e.what());
    }
  });
}

void setup_synth(CLI::App& parent) {
  struct SynthArgs {
    int games = 1;
    std::string out;
    uint64_t seed = 1;
    int frames = 3600;
  };
  auto args = std::make_shared<SynthArgs>();
  CLI::App* synth = parent.add_subcommand("synth", "Write synthetic two-player .slp games");
  synth->add_option("--games", args->games, "Number of games")
      ->required()
      ->check(CLI::Range(1, 10'000'000));
  synth->add_option("--out", args->out, "Output directory")->required();
  synth->add_option("--seed", args->seed, "Seed (games are deterministic from it)");
  // An hour of play a game at most: a file's frames are built in memory before it is written.
  synth->add_option("--frames", args->frames, "Frames per game at most (an hour: 216000)")
      ->check(CLI::Range(1, 216000));
  synth->callback([args] {
    try {
      const auto paths = write_synthetic_games(args->out, args->games, args->seed, args->frames);
      std::cout << "wrote " << paths.size() << (paths.size() == 1 ? " game" : " games") << " to "
                << args->out << "\n";
    } catch (const std::exception& e) {
      fail(e.what());
    }
  });
}

void setup_corpus(CLI::App& parent) {
  CLI::App* corpus = parent.add_subcommand("corpus", "Columnar replay corpus caches");
  corpus->require_subcommand(1);
  struct BuildArgs {
    std::string out;
    bool zstd = false;
    bool keep_rollbacks = false;
    bool features = false;
    std::string fields = "slippi";
    int threads = 0;
    std::vector<std::string> paths;
  };
  auto args = std::make_shared<BuildArgs>();
  CLI::App* build = corpus->add_subcommand("build", "Parse replays into a corpus directory");
  build->add_option("--out", args->out, "Corpus directory")->required();
  build->add_flag("--zstd", args->zstd,
                  "Compress each game's slice of each column with zstd (read one game at a time)");
  build->add_flag("--keep-rollbacks", args->keep_rollbacks,
                  "Keep every recorded copy of rolled-back frames");
  CLI::Option* features =
      build->add_flag("--features", args->features,
                      "Store the loader's extracted features instead of the parsed columns (a "
                      "feature corpus: runs open its index and read each game's features on "
                      "demand)");
  build
      ->add_option("--fields", args->fields,
                   "With --features: how the numeric features read the replay (the loader's "
                   "fields parameter)")
      ->check(CLI::IsMember({"slippi", "libmelee"}))
      ->needs(features);
  build->add_option("--threads", args->threads, "With --features: threads (0: all cores)")
      ->check(CLI::Range(0, 4096))
      ->needs(features);
  build
      ->add_option("paths", args->paths,
                   "Replay files or directories (with --features also globs, and game corpora)")
      ->required();
  build->callback([args] {
    if (args->features) {
      if (args->zstd) fail("--features stores each game as a zstd frame already; drop --zstd", 2);
      try {
        melee::FeatureCorpusOptions options;
        options.rollback =
            args->keep_rollbacks ? melee::RollbackMode::all : melee::RollbackMode::last;
        options.fields = args->fields == "libmelee" ? melee::FieldReading::libmelee
                                                    : melee::FieldReading::slippi;
        options.threads = args->threads;
        const melee::FeatureBuildReport r =
            melee::build_feature_corpus(args->paths, args->out, options);
        std::cout << "feature corpus " << args->out << ": " << r.games << " games, " << r.frames
                  << " frames, " << r.skipped << " skipped, " << r.source_bytes
                  << " bytes of replays in, " << r.feature_bytes << " bytes of features stored in "
                  << r.stored_bytes << " bytes\n";
        for (const std::string& e : r.skipped_examples) std::cout << "  skipped " << e << "\n";
      } catch (const std::exception& e) {
        fail(e.what());
      }
      return;
    }
    try {
      std::vector<std::filesystem::path> inputs(args->paths.begin(), args->paths.end());
      CorpusOptions options;
      options.zstd = args->zstd;
      options.rollbacks = args->keep_rollbacks ? Rollbacks::kKeepAll : Rollbacks::kLastCopy;
      const CorpusBuildReport r = build_corpus(inputs, args->out, options);
      std::cout << "corpus " << args->out << ": " << r.games << " games (" << r.damaged
                << " damaged), " << r.frames << " frames, " << r.skipped << " skipped, "
                << r.input_bytes << " bytes in, " << r.output_bytes << " bytes of columns\n";
      for (const std::string& e : r.examples) std::cout << "  " << e << "\n";
      if (r.skipped + r.damaged > r.examples.size())
        std::cout << "  ... (manifest.json lists every skipped input)\n";
    } catch (const std::exception& e) {
      fail(e.what());
    }
  });
}

}  // namespace
}  // namespace slipstream::slp

SLIPSTREAM_REGISTER_COMMAND(replay, "replay", slipstream::slp::setup_replay);
SLIPSTREAM_REGISTER_COMMAND(synth, "synth", slipstream::slp::setup_synth);
SLIPSTREAM_REGISTER_COMMAND(corpus, "corpus", slipstream::slp::setup_corpus);
