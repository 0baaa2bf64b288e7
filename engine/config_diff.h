// What differs between two resolved configurations (resolved_config_yaml's text: a run
// directory's config.yaml, the graph a checkpoint carries), setting by setting: a resume told
// to use another preset, or a checkpoint opened with a config that has changed since, says what
// would change instead of going on with it silently.
#pragma once

#include <string>
#include <vector>

namespace slipstream {

enum class RunKeys { compare, ignore };

// One line a difference, in the order the settings appear: "core.d_model: 64 -> 128",
// "replays.paths: [/a] -> (not set)", "stages: [a, b] -> [a, c, b]". `run:` settings (steps,
// name, log_every, ...) are left out with RunKeys::ignore; comments are never compared.
std::vector<std::string> config_differences(const std::string& before, const std::string& after,
                                            RunKeys run_keys);

}  // namespace slipstream
