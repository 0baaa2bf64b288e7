// Two and three MPI ranks average their gradients through the allreduce stage's reducer. Needs
// mpirun; skipped (not passed) without it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

void run_ranks(int n) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not found";
  const std::string worker = std::string(SLIPSTREAM_BINARY_DIR) + "/bin/allreduce_mpi_worker";
  ASSERT_TRUE(std::filesystem::exists(worker)) << worker;
  // --allow-run-as-root: containers run tests as root; --oversubscribe: fewer cores than ranks.
  // detect_leaks=0 matters only in sanitizer builds: Open MPI's MPI_Init leaks in its components.
  const std::string cmd =
      "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 "
      "-np " +
      std::to_string(n) + " " + worker + " " + std::to_string(n) + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(AllreduceMpi, TwoRanksAverageGradients) {
  run_ranks(2);
}

TEST(AllreduceMpi, ThreeRanksAverageGradients) {
  run_ranks(3);
}

}  // namespace
