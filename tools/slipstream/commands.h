// The engine's own subcommands of `slipstream`.
#pragma once

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/config.h"

namespace CLI {
class App;
}

namespace slipstream::cli {

void add_core_commands(CLI::App& app);
// Exit status the chosen subcommand asked for (set by its callback).
int exit_code();
void set_exit_code(int code);
// The command line as typed (shell-quoted), for the run directory's run.json.
const std::string& command_line();
void set_command_line(int argc, char** argv);

// Exit statuses shared by the commands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfig = 2;  // invalid graph, preset or override
inline constexpr int kExitInterrupted = 130;

// A command's body, its failures as exit statuses: a ConfigError prints its message (file:line:col
// and the closest key) and gives kExitConfig, any other exception "error: ..." and kExitFailure.
template <class Body>
int exit_status_of(Body&& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kExitConfig;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitFailure;
  }
}

// A command's --json output: `j` indented, to `path`; throws naming the path when it cannot.
inline void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

}  // namespace slipstream::cli
