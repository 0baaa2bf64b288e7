// "Did you mean ...?" for config errors: the candidate closest in edit distance, if it is close
// enough to be a plausible typo.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace slipstream {

size_t edit_distance(std::string_view a, std::string_view b);  // Levenshtein
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);
// "; did you mean 'x'?" or "" — ready to append to a message.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace slipstream
