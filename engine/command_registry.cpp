#include "engine/command_registry.h"

namespace slipstream {

static std::vector<RegisteredCommand>& commands() {
  static std::vector<RegisteredCommand> list;  // function-local: safe from static-init order
  return list;
}

void register_command(std::string name, CommandSetup setup) {
  commands().push_back({std::move(name), std::move(setup)});
}

const std::vector<RegisteredCommand>& registered_commands() {
  return commands();
}

}  // namespace slipstream
