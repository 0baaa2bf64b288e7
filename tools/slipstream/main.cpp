// `slipstream`: run graphs, validate them, inspect stage kinds and devices. Subcommands that
// belong to a stage family (replay inspection, synthetic data, ...) register themselves through
// engine/command_registry.h.
#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>

#include "engine/command_registry.h"
#include "engine/registry.h"
#include "tools/slipstream/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"slipstream: data-flow pipelines for batched sequence-model training"};
  app.require_subcommand(1);
  // Every option's default in its --help line (CLI11 prints none unless it captured it).
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", std::string("slipstream ") + SLIPSTREAM_VERSION);
  // Before the command: `slipstream --plugin libmine.so stages my_kind` (graphs name theirs in
  // `plugins:`).
  app.add_option_function<std::vector<std::string>>(
         "--plugin",
         [](const std::vector<std::string>& paths) {
           for (const auto& p : paths) {
             try {
               slipstream::StageRegistry::load_plugin(p, /*given=*/true);
             } catch (const std::exception& e) {
               throw CLI::ValidationError("--plugin", e.what());
             }
           }
         },
         "load a stage plugin (.so) before the command (repeatable)")
      ->trigger_on_parse();
  slipstream::cli::add_core_commands(app);
  for (const auto& cmd : slipstream::registered_commands()) cmd.setup(app);
  // No default shown where it says nothing: a required option's, or an empty list's "[]".
  std::function<void(CLI::App&)> quiet_defaults = [&](CLI::App& a) {
    for (CLI::Option* o : a.get_options())
      if (o->get_required() || o->get_default_str() == "[]") o->default_str("");
    for (CLI::App* sub : a.get_subcommands([](CLI::App*) { return true; })) quiet_defaults(*sub);
  };
  quiet_defaults(app);
  slipstream::cli::set_command_line(argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    // A command's callback failed after printing why: its own exit status (command_registry.h).
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2 like configuration errors; --help and --version exit 0.
    return app.exit(e) == 0 ? 0 : slipstream::cli::kExitConfig;
  } catch (const std::exception& e) {
    // An error a command did not catch itself (a folder it cannot make, a bad environment
    // variable): one line and exit 1, never std::terminate.
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return slipstream::cli::exit_code();
}
