// Edit distance with one rolling row, and the nearest-candidate rule built on it.
#include "utils/closest_match.h"

#include <algorithm>
#include <numeric>

namespace bridge::utils {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_match(std::string_view name, const std::vector<std::string_view>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (std::string_view candidate : candidates) {
    const std::size_t distance = edit_distance(name, candidate);
    const std::size_t allowed = std::max(name.size(), candidate.size()) / 3;
    if (distance <= allowed && (!best || distance < best_distance)) {
      best = std::string(candidate);
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace bridge::utils
