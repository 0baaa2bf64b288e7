// The `slipstream` command: exit codes and messages of validate/stages/new-stage/devices.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <fstream>

#include <array>
#include <cstdio>
#include <filesystem>

#include "tests/support/cli_output.h"
#include "tests/support/temp_dir.h"

using slipstream::testing::TempDir;

namespace {

using Output = slipstream::testing::CliOutput;
Output run_cli(const std::string& args) {
  return slipstream::testing::run_command(std::string(SLIPSTREAM_CLI) + " " + args);
}

}  // namespace

TEST(Cli, ValidateReportsFileLineColumnAndExit2) {
  TempDir d;
  std::string f = d.write("bad.yaml", "stages:\n  - {name: h2d, kind: prefetsh}\n");
  Output o = run_cli("validate " + f);
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(
      o.text.find(f + ":2:23: stage 'h2d': unknown kind 'prefetsh'; did you mean 'prefetch'?"),
      std::string::npos)
      << o.text;
}

// `validate PRESET` names the preset, its graph, and each setting the preset (and its
// extends: chain) and --set change, with where each came from.
TEST(Cli, ValidateOfAPresetNamesItAndItsOverrides) {
  Output o = run_cli("validate cpu_quick --set core.d_model=32");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("preset 'cpu_quick' ("), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("configs/train_bc.yaml: OK, 9 stages"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("  replays.batch_size: 32  (" + std::string(SLIPSTREAM_SOURCE_DIR) +
                        "/presets/cpu_quick.yaml:"),
            std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("  core.d_model: 32  (--set core.d_model=32)"), std::string::npos)
      << o.text;
}

TEST(Cli, StagesListsAndDescribesKinds) {
  Output all = run_cli("stages");
  EXPECT_EQ(all.status, 0);
  EXPECT_NE(all.text.find("prefetch"), std::string::npos);
  EXPECT_NE(all.text.find("checkpoint"), std::string::npos);
  Output one = run_cli("stages checkpoint");
  EXPECT_EQ(one.status, 0);
  EXPECT_NE(one.text.find("every: int = 1000"), std::string::npos) << one.text;
  Output typo = run_cli("stages chekpoint");
  EXPECT_EQ(typo.status, 2);
  EXPECT_NE(typo.text.find("did you mean 'checkpoint'?"), std::string::npos);
  Output run = run_cli("stages run");
  EXPECT_NE(run.text.find("precision"), std::string::npos);
}

TEST(Cli, NewStageWritesCompilingSkeleton) {
  TempDir d;
  std::filesystem::create_directories(d.path() + "/stages");
  std::filesystem::create_directories(d.path() + "/tests");
  Output o = run_cli("new-stage my_scale --family custom --root " + d.path());
  ASSERT_EQ(o.status, 0) << o.text;
  std::string src = d.path() + "/stages/custom/my_scale.cpp";
  std::string test = d.path() + "/tests/stages/my_scale_test.cpp";
  ASSERT_TRUE(std::filesystem::exists(src));
  ASSERT_TRUE(std::filesystem::exists(test));
  // The skeleton compiles against the engine headers.
  std::string cxx = "c++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I" +
                    std::string(SLIPSTREAM_SOURCE_DIR) + " -I" +
                    std::string(SLIPSTREAM_BINARY_DIR) + "/generated/sdk";
  EXPECT_EQ(std::system((cxx + " " + src).c_str()), 0);
  EXPECT_EQ(std::system((cxx + " " + test).c_str()), 0);
  // Refuses to overwrite, and rejects bad names.
  EXPECT_EQ(run_cli("new-stage my_scale --family custom --root " + d.path()).status, 1);
  EXPECT_EQ(run_cli("new-stage My-Scale --root " + d.path()).status, 2);
  // A plugin project's library is named after the kind: CMake's own target names are refused.
  const Output reserved = run_cli("new-stage test --out " + d.path() + "/proj-test");
  EXPECT_EQ(reserved.status, 2) << reserved.text;
  EXPECT_NE(reserved.text.find("a target name CMake keeps for itself"), std::string::npos)
      << reserved.text;
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/proj-test"));
}

// A directory where a YAML file belongs is a one-line error and exit 2, never an abort.
TEST(Cli, DirectoryAsConfigIsAnErrorNotACrash) {
  TempDir d;
  std::filesystem::create_directories(d.path() + "/run");
  d.write("run/config.yaml", "stages: []\n");
  for (const std::string& args :
       {"validate " + d.path() + "/run", "run --config " + d.path() + "/run",
        "validate " + d.write("g.yaml", "extends: " + d.path() + "/run\n")}) {
    Output o = run_cli(args);
    EXPECT_EQ(o.status, 2) << args << "\n" << o.text;
    EXPECT_NE(o.text.find("is a directory, not a YAML file"), std::string::npos) << o.text;
  }
  EXPECT_NE(run_cli("validate " + d.path() + "/run").text.find("run/config.yaml"),
            std::string::npos);
}

// Sizes that would overflow the loader's window arithmetic are rejected by validation.
TEST(Cli, HugeWindowSizesAreRejected) {
  for (const char* set : {"replays.stride=3000000000", "replays.stride=4294967296",
                          "replays.window=9223372036854775000", "replays.batch_size=4294967296"}) {
    Output o = run_cli(std::string("validate cpu_quick --set ") + set);
    EXPECT_EQ(o.status, 2) << set << "\n" << o.text;
    // stride takes 0 (the window); the others start at 1.
    const bool stride = std::string(set).starts_with("replays.stride");
    EXPECT_NE(o.text.find(stride ? "is out of range [0, 1048576]" : "is out of range [1, 1048576]"),
              std::string::npos)
        << o.text;
  }
}

// Usage errors exit 2, as configuration errors do; --help exits 0.
// An error a command does not catch itself is one line and exit 1, not std::terminate (134).
TEST(Cli, ACommandsStrayErrorIsOneLineNotAnAbort) {
  TempDir d;
  const std::string file = d.write("a.json", "{}");
  Output o = run_cli("new-stage foo --out " + file);  // a file where its folder would go
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_EQ(o.text.find("terminate"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("error: "), std::string::npos) << o.text;
  o = slipstream::testing::run_command("SLIPSTREAM_CPU_ISA=bogus " + std::string(SLIPSTREAM_CLI) +
                                       " devices");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_EQ(o.text.find("terminate"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("bogus"), std::string::npos) << o.text;
}

TEST(Cli, UsageErrorsExit2) {
  Output both = run_cli("run --preset cpu_quick --config x.yaml");
  EXPECT_EQ(both.status, 2) << both.text;
  EXPECT_NE(both.text.find("excludes"), std::string::npos) << both.text;
  EXPECT_EQ(run_cli("run --no-such-flag").status, 2);
  EXPECT_EQ(run_cli("run --help").status, 0);
}

TEST(Cli, ResumeOfSomethingElseSaysWhat) {
  TempDir d;
  Output o = run_cli("run --resume " + d.path());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(
      o.text.find("not a run directory (no config.yaml) nor a checkpoint (no model.safetensors)"),
      std::string::npos)
      << o.text;
  // A run directory without any complete checkpoint says so before loading any data.
  d.write("config.yaml", "extends: cpu_quick\n");
  std::filesystem::create_directories(d.path() + "/checkpoints/step-5");
  o = run_cli("run --resume " + d.path());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("no complete periodic checkpoint to resume from"), std::string::npos)
      << o.text;
  // Its best checkpoint, written at a validation before any periodic one, is named to go on from.
  d.write("checkpoints/best-step-3/DONE", "3\n");
  o = run_cli("run --resume " + d.path());
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("; its best checkpoint: best-step-3 (give " + d.path() +
                        "/checkpoints/best-step-3 for the newest)"),
            std::string::npos)
      << o.text;
}

// A file that made yaml-cpp's LoadAll loop forever is a syntax error with exit 2.
TEST(Cli, ValidateOfAStrayCommaExits2) {
  TempDir d;
  Output o = run_cli("validate " + d.write("comma.yaml", ",\n"));
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("comma.yaml:1:1: YAML syntax error: unexpected ','"), std::string::npos)
      << o.text;
}

TEST(Cli, ValidateCatchesMalformedListsAndMissingPaths) {
  Output list = run_cli("validate cpu_quick --set 'replays.paths=[a, b'");
  EXPECT_EQ(list.status, 2) << list.text;
  EXPECT_NE(list.text.find("malformed value '[a, b'"), std::string::npos) << list.text;
  Output missing = run_cli("validate cpu_quick --set 'replays.paths=[/no/such/replays]'");
  EXPECT_EQ(missing.status, 2) << missing.text;
  EXPECT_NE(missing.text.find("parameter 'paths': /no/such/replays not found"), std::string::npos)
      << missing.text;
  // Paths that hold no replays are found at validation too, each one named with what it is.
  TempDir empty;
  std::filesystem::create_directories(empty.path() + "/folder");
  Output none = run_cli("validate cpu_quick --set 'replays.paths=[/no/such/replays, " +
                        empty.path() + "/folder, " + empty.path() + "/*.slp]'");
  EXPECT_EQ(none.status, 2) << none.text;
  EXPECT_NE(none.text.find("parameter 'paths': /no/such/replays not found"), std::string::npos)
      << none.text;
  EXPECT_NE(none.text.find("parameter 'paths': no replays in " + empty.path() +
                           "/folder (a folder with no .slp files), " + empty.path() +
                           "/*.slp (matches no .slp file)"),
            std::string::npos)
      << none.text;
  // One empty folder beside one that holds a replay is not an error.
  std::filesystem::create_directories(empty.path() + "/full/deep");
  { std::ofstream(empty.path() + "/full/deep/a.slp") << "x"; }
  Output some = run_cli("validate cpu_quick --set 'replays.paths=[" + empty.path() + "/folder, " +
                        empty.path() + "/full]'");
  EXPECT_EQ(some.status, 0) << some.text;
  // Filter names are resolved at validation, not when the run starts.
  Output name = run_cli("validate cpu_quick --set 'replays.characters=[fox, foxx]'");
  EXPECT_EQ(name.status, 2) << name.text;
  EXPECT_NE(name.text.find("unknown character 'foxx'; did you mean 'fox'?"), std::string::npos)
      << name.text;
  TempDir d;
  Output print = run_cli("validate cpu_quick --print --set run.runs_dir=" + d.path() + "/r");
  EXPECT_EQ(print.status, 0) << print.text;
  EXPECT_NE(print.text.find("runs_dir: " + d.path() + "/r"), std::string::npos) << print.text;
  EXPECT_NE(print.text.find("kind: slippi_replays"), std::string::npos) << print.text;
}

TEST(Cli, NewStageRefusesABuiltInName) {
  TempDir d;
  std::filesystem::create_directories(d.path() + "/stages");
  std::filesystem::create_directories(d.path() + "/tests");
  Output o = run_cli("new-stage mamba --root " + d.path());
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("'mamba' is already a stage kind"), std::string::npos) << o.text;
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/stages/custom/mamba.cpp"));
}

TEST(Cli, DevicesAndDoctorAnswerOnThisMachine) {
  Output dev = run_cli("devices");
  EXPECT_EQ(dev.status, 0);
  EXPECT_NE(dev.text.find("cpu:"), std::string::npos) << dev.text;
  EXPECT_NE(dev.text.find("cpu kernels: "), std::string::npos) << dev.text;
  EXPECT_NE(dev.text.find("; fp32 GEMMs: "), std::string::npos) << dev.text;
  // Under OPENBLAS_NUM_THREADS the fp32 products are OpenBLAS's whatever oneDNN could do.
  Output blas =
      slipstream::testing::run_command("OPENBLAS_NUM_THREADS=1 " SLIPSTREAM_CLI " devices");
  EXPECT_NE(blas.text.find("; fp32 GEMMs: OpenBLAS sgemm"), std::string::npos) << blas.text;
  Output doc = run_cli("doctor --device cpu");
  EXPECT_EQ(doc.status, 0) << doc.text;
}

// A registered command's failure keeps its own exit status (1: the input was bad), distinct
// from a usage error (2).
TEST(Cli, ACommandsFailureExitsWithItsOwnStatus) {
  TempDir d;
  const std::string junk = d.write("junk.slp", "this is not a replay");
  Output info = run_cli("replay info " + junk);
  EXPECT_EQ(info.status, 1) << info.text;
  Output usage = run_cli("replay info");
  EXPECT_EQ(usage.status, 2) << usage.text;
}
