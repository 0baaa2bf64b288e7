#include "engine/config_diff.h"

#include <sstream>
#include <utility>

namespace slipstream {

namespace {

// The settings of resolved_config_yaml's text as (key, value) in order: run.KEY, STAGE.kind,
// STAGE.inputs, STAGE.concurrency, STAGE.PARAM, plugins, description, sized_for, and "stages"
// (the stage names in order).
std::vector<std::pair<std::string, std::string>> settings(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream is(text);
  std::string line, section, stage, stages, plugins;
  auto trim = [](std::string s) {
    if (auto c = s.find("  # "); c != std::string::npos) s.resize(c);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
    return s;
  };
  while (std::getline(is, line)) {
    if (line.starts_with("#") || trim(line).empty()) continue;
    line = trim(line);
    const size_t indent = line.find_first_not_of(' ');
    const std::string body = line.substr(indent);
    const size_t colon = body.find(": ");
    if (indent == 0) {
      section = body.ends_with(":") ? body.substr(0, body.size() - 1) : "";
      // description and sized_for say what a preset is for; they change nothing a run does.
      const std::string key = colon == std::string::npos ? "" : body.substr(0, colon);
      if (!key.empty() && key != "description" && key != "sized_for")
        out.emplace_back(key, body.substr(colon + 2));
      continue;
    }
    if (section == "plugins" && body.starts_with("- ")) {
      plugins += (plugins.empty() ? "" : ", ") + body.substr(2);
    } else if (section == "run" && colon != std::string::npos) {
      out.emplace_back("run." + body.substr(0, colon), body.substr(colon + 2));
    } else if (section == "stages" && body.starts_with("- name: ")) {
      stage = body.substr(8);
      stages += (stages.empty() ? "" : ", ") + stage;
    } else if (section == "stages" && colon != std::string::npos) {
      out.emplace_back(stage + "." + body.substr(0, colon), body.substr(colon + 2));
    }
  }
  if (!plugins.empty()) out.emplace_back("plugins", "[" + plugins + "]");
  out.emplace_back("stages", "[" + stages + "]");
  return out;
}

}  // namespace

std::vector<std::string> config_differences(const std::string& before, const std::string& after,
                                            RunKeys run_keys) {
  const auto a = settings(before), b = settings(after);
  auto find = [](const auto& list, const std::string& key) -> const std::string* {
    for (const auto& [k, v] : list)
      if (k == key) return &v;
    return nullptr;
  };
  std::vector<std::string> out;
  auto skip = [&](const std::string& key) {
    return run_keys == RunKeys::ignore && key.starts_with("run.");
  };
  for (const auto& [k, v] : a) {
    if (skip(k)) continue;
    const std::string* w = find(b, k);
    if (!w)
      out.push_back(k + ": " + v + " -> (not set)");
    else if (*w != v)
      out.push_back(k + ": " + v + " -> " + *w);
  }
  for (const auto& [k, w] : b)
    if (!skip(k) && !find(a, k)) out.push_back(k + ": (not set) -> " + w);
  return out;
}

}  // namespace slipstream
