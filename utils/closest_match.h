// "Did you mean ...?" suggestions for names typed by users: events, config keys, options.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::utils {

/// Levenshtein distance: the fewest single-character insertions, deletions and substitutions turning a into b.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest to `name`, if it is close enough to be a plausible typo: at most a third of the longer
/// name's characters differ. Ties go to the earliest candidate.
///
/// Example: closest_match("on_trian_start", {"on_train_start", "on_eval_start"}) == "on_train_start".
std::optional<std::string> closest_match(std::string_view name, const std::vector<std::string_view>& candidates);

}  // namespace bridge::utils
