// How the ranks of a multi-process run reduce a few numbers (metric sums, the loader's step
// count), from a library that can: stages/dist registers MPI's. The engine itself knows no MPI.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "engine/stage.h"

namespace slipstream {

// `make` is called once for each run of several ranks, before any stage's setup (it may
// initialise MPI); what it returns becomes RunState::reduce_over_ranks.
using RankReduceFn = std::function<void(std::span<double>, RankReduce, const std::string&)>;
void register_rank_reduce(RankReduceFn (*make)());
// Empty when nothing registered one (a build without MPI).
RankReduceFn make_rank_reduce();

}  // namespace slipstream
