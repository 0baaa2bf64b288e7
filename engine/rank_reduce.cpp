#include "engine/rank_reduce.h"

#include <atomic>

namespace slipstream {

namespace {
std::atomic<RankReduceFn (*)()> g_make{nullptr};
}  // namespace

void register_rank_reduce(RankReduceFn (*make)()) {
  g_make = make;
}

RankReduceFn make_rank_reduce() {
  auto make = g_make.load();
  return make ? make() : RankReduceFn{};
}

}  // namespace slipstream
