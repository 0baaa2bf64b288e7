// CLI subcommands contributed by stage families (e.g. `slipstream replay info`), registered from
// static initialisers so the `slipstream` tool stays unaware of any particular family.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace slipstream {

// Adds one subcommand (with its options and callback) to `parent`. A callback reports failure
// by throwing CLI::RuntimeError(exit_code) after printing its own message to stderr.
using CommandSetup = std::function<void(CLI::App& parent)>;

struct RegisteredCommand {
  std::string name;
  CommandSetup setup;
};

void register_command(std::string name, CommandSetup setup);
const std::vector<RegisteredCommand>& registered_commands();

}  // namespace slipstream

#define SLIPSTREAM_REGISTER_COMMAND(ident, name, setup_fn)                     \
  [[maybe_unused]] static const bool slipstream_command_##ident##_registered = \
      (::slipstream::register_command(name, setup_fn), true)
