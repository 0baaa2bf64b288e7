// `slipstream validate` and `slipstream stages`.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <map>

#include <yaml-cpp/yaml.h>

#include "engine/graph.h"
#include "engine/registry.h"
#include "engine/text_match.h"
#include "tools/slipstream/commands.h"

namespace slipstream::cli {

namespace {
int g_exit = kExitOk;
std::string g_command_line;
}  // namespace
const std::string& command_line() {
  return g_command_line;
}
void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
                                         "OPQRSTUVWXYZ0123456789-_=./:,+@%") == std::string::npos;
    if (!plain) {  // single quotes, each ' as '\''
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    g_command_line += (i ? " " : "") + a;
  }
}
int exit_code() {
  return g_exit;
}
void set_exit_code(int code) {
  g_exit = code;
}

void add_run_commands(CLI::App& app);
void add_authoring_commands(CLI::App& app);
void add_plot_commands(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_reference_command(CLI::App& app);
void add_summary_command(CLI::App& app);

static void add_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Check a preset or graph file without running it");
  auto target = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  cmd->add_option("preset_or_file", *target, "preset name or YAML file")->required();
  cmd->add_option("--set,-s", *sets, "override stage.param=value or run.key=value (repeatable)");
  auto print = std::make_shared<bool>(false);
  cmd->add_flag("--print", *print,
                "print the resolved configuration (every parameter, paths absolute): what a run "
                "would write as its config.yaml");
  cmd->callback([target, sets, print] {
    try {
      GraphPlan plan = plan_graph(load_config(*target, *sets));
      if (*print) {
        std::map<std::string, Params> sp;
        for (const auto& s : plan.stages) sp[s.name] = s.params;
        std::cout << resolved_config_yaml(plan.config, sp, plan.run);
        return;
      }
      const Config& c = plan.config;
      if (!c.preset_file.empty())
        std::cout << "preset '" << c.preset << "' (" << c.preset_file << "), ";
      std::cout << c.graph_file << ": OK, " << plan.stages.size() << " stages:";
      // A generated graph may have thousands of stages: name the first few.
      constexpr size_t kShown = 32;
      for (size_t k = 0; k < std::min(kShown, plan.stages.size()); ++k)
        std::cout << " " << plan.stages[k].name;
      if (plan.stages.size() > kShown)
        std::cout << " ... (" << plan.stages.size() - kShown << " more)";
      std::cout << "\n";
      // What the preset (and its extends: chain) and --set change from the graph file.
      auto overridden = [&](const std::string& key, const ConfigValue& v) {
        if (v.mark.file.empty() || v.mark.file == c.graph_file || v.mark.file == "<default>")
          return;
        YAML::Emitter flow;
        flow << YAML::Flow << v.node;
        std::cout << "  " << key << ": " << flow.c_str() << "  (" << v.mark.str() << ")\n";
      };
      for (const auto& [k, v] : c.run) overridden("run." + k, v);
      for (const auto& st : c.stages)
        for (const auto& [k, v] : st.params) overridden(st.name + "." + k, v);
    } catch (const ConfigError& e) {
      std::cerr << e.what() << "\n";
      set_exit_code(kExitConfig);
    }
  });
}

static void add_stages(CLI::App& app) {
  auto* cmd = app.add_subcommand("stages", "List stage kinds, or print one kind's schema");
  auto kind = std::make_shared<std::string>();
  cmd->add_option("kind", *kind, "a stage kind (or 'run' for the run section)");
  cmd->callback([kind] {
    if (kind->empty()) {
      std::string family = "\x01";
      for (const auto* s : StageRegistry::all()) {
        std::string f = s->family_name().empty() ? "core" : s->family_name();
        if (f != family) std::cout << (family == "\x01" ? "" : "\n") << f << ":\n", family = f;
        const std::string& full = s->doc_text();
        std::string doc = full.substr(0, std::min(full.find(". "), full.size()));  // first sentence
        std::printf("  %-20s %s\n", s->kind().c_str(), doc.c_str());
      }
      std::cout << "\n`slipstream stages KIND` prints a kind's ports and parameters.\n";
      return;
    }
    if (*kind == "run") {
      std::cout << run_schema().help();
      return;
    }
    const StageSchema* s = StageRegistry::find(*kind);
    if (!s) {
      std::vector<std::string> kinds;
      for (const auto* k : StageRegistry::all()) kinds.push_back(k->kind());
      std::cerr << "unknown stage kind '" << *kind << "'" << did_you_mean(*kind, kinds) << "\n";
      set_exit_code(kExitConfig);
      return;
    }
    std::cout << s->help();
  });
}

void add_core_commands(CLI::App& app) {
  add_run_commands(app);
  add_validate(app);
  add_stages(app);
  add_authoring_commands(app);
  add_plot_commands(app);
  add_bench_command(app);
  add_reference_command(app);
  add_summary_command(app);
}

}  // namespace slipstream::cli
