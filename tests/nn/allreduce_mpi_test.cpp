// Two and three MPI ranks average their gradients through the allreduce stage's reducer. Needs
// mpirun; skipped (not passed) without it.
#include <gtest/gtest.h>

#include <cstdio>
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

// A rank that stops inside a step, after its neighbour heard it reached the step: the others
// find it silent and name it, and the run ends (bounded in time) rather than hanging.
TEST(AllreduceMpi, ARankStoppedInsideAStepIsNamed) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not found";
  const std::string worker = std::string(SLIPSTREAM_BINARY_DIR) + "/bin/allreduce_mpi_worker";
  const std::string cmd =
      "timeout -s KILL 90 mpirun --allow-run-as-root --oversubscribe -x "
      "ASAN_OPTIONS=detect_leaks=0 -np 3 " +
      worker + " 3 stall 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("(sync.timeout_s): rank 1 stopped during step 2"), std::string::npos) << out;
  EXPECT_EQ(out.find("finished although rank 1 stopped"), std::string::npos) << out;
  std::system("pkill -KILL -f 'allreduce_mpi_worker 3 stall' > /dev/null 2>&1");
}

}  // namespace
