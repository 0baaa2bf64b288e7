// Locating the shared real replays (/work/shared/replays next to the source tree) and comparing
// columnar games.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "stages/melee/slp/game.h"

namespace slipstream::slp::testing {

inline std::filesystem::path replay_dir() {
  return std::filesystem::path(SLIPSTREAM_SOURCE_DIR) / ".." / "shared" / "replays";
}

inline std::filesystem::path replay(const std::string& relative) {
  return replay_dir() / relative;
}

inline std::vector<std::filesystem::path> all_replays() {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::is_directory(replay_dir())) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(replay_dir()))
    if (e.path().extension() == ".slp") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

#define SLP_REQUIRE_REPLAYS()                                                                   \
  do {                                                                                          \
    if (!std::filesystem::is_directory(::slipstream::slp::testing::replay_dir()))               \
      GTEST_SKIP() << "real replays not found at " << ::slipstream::slp::testing::replay_dir(); \
  } while (0)

// Every column of a view as (name, bytes), in a fixed order.
inline std::vector<std::pair<std::string, std::vector<uint8_t>>> column_bytes(const GameView& g) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  auto add = [&](const std::string& name, const auto& col) {
    const auto* p = reinterpret_cast<const uint8_t*>(col.data());
    out.emplace_back(name, std::vector<uint8_t>(p, p + col.size_bytes()));
  };
  visit_frame_columns(g.frames, add);
  visit_item_columns(g.frames.items,
                     [&](const std::string& n, const auto& col) { add("items." + n, col); });
  return out;
}

// Expects two views to hold the same columns, byte for byte.
inline void expect_same_columns(const GameView& a, const GameView& b, const std::string& what) {
  const auto ca = column_bytes(a), cb = column_bytes(b);
  ASSERT_EQ(ca.size(), cb.size()) << what;
  for (size_t i = 0; i < ca.size(); ++i) {
    ASSERT_EQ(ca[i].first, cb[i].first) << what;
    EXPECT_TRUE(ca[i].second == cb[i].second) << what << ": column " << ca[i].first << " differs";
  }
}

}  // namespace slipstream::slp::testing
