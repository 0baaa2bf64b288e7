// libFuzzer target for the .slp parser: any input must yield a game or a ParseError, never a
// crash, hang or out-of-bounds read; a parsed game must be self-consistent and survive the
// inspection functions and a write/parse round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "stages/melee/slp/game.h"
#include "stages/melee/slp/inspect.h"
#include "stages/melee/slp/parser.h"
#include "stages/melee/slp/writer.h"

namespace {

using namespace slipstream::slp;

void check(bool ok) {
  if (!ok) std::abort();
}

void check_consistent(const Game& g) {
  const size_t n = g.frames.size();
  visit_frame_columns(g.frames, [&](const std::string&, const auto& col) {
    check(col.empty() || col.size() == n);
  });
  for (const auto& r : g.frames.items.row) check(r < n);
  for (size_t i = 1; i < g.frames.items.size(); ++i)
    check(g.frames.items.row[i - 1] <= g.frames.items.row[i]);
}

void exercise(const Game& g) {
  check_consistent(g);
  (void)dump_json(replay_info_json(g));
  if (g.frames.size() > 0) {
    (void)dump_json(replay_dump_json(g, 0));
    (void)dump_json(replay_dump_json(g, g.frames.size() - 1));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  for (const Rollbacks mode : {Rollbacks::kKeepAll, Rollbacks::kLastCopy}) {
    ParseOptions options;
    options.rollbacks = mode;
    Game game;
    try {
      game = parse_slp(bytes, "fuzz", options);
    } catch (const ParseError&) {
      return 0;
    }
    exercise(game);
    if (mode == Rollbacks::kKeepAll) {
      // What we write must parse back with the same rows.
      const std::vector<uint8_t> written = write_slp(game);
      const Game again = parse_slp(written, "fuzz-rewritten");
      check(again.frames.frame == game.frames.frame);
      check(again.info.error.empty());
    }
  }
  return 0;
}
