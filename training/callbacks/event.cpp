// Event names: the single table that maps events to the names users register them by.
#include "training/callbacks/event.h"

#include <stdexcept>
#include <vector>

#include "utils/closest_match.h"
#include "utils/strings.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

constexpr std::array<std::string_view, kNumEvents> kEventNames = {
    "on_setup_start",        "on_data_init_start",
    "on_train_start",        "on_train_step_start",
    "on_train_step_end",     "on_train_end",
    "on_eval_start",         "on_eval_step_start",
    "on_eval_step_end",      "on_eval_end",
    "on_test_start",         "on_test_step_start",
    "on_test_step_end",      "on_test_end",
    "on_checkpoint_save",    "on_forward_start",
    "on_forward_end",        "on_backward_start",
    "on_backward_end",       "on_optimizer_step_start",
    "on_optimizer_step_end", "on_log",
    "on_checkpoint_load",    "on_exception",
};

}  // namespace

const std::array<Event, kNumEvents>& all_events() {
  static const std::array<Event, kNumEvents> events = [] {
    std::array<Event, kNumEvents> result{};
    for (std::size_t i = 0; i < kNumEvents; ++i) result[i] = static_cast<Event>(i);
    return result;
  }();
  return events;
}

std::string_view to_string(Event event) { return kEventNames.at(static_cast<std::size_t>(event)); }

std::optional<Event> parse_event(std::string_view name) {
  for (std::size_t i = 0; i < kNumEvents; ++i) {
    if (kEventNames[i] == name) return static_cast<Event>(i);
  }
  return std::nullopt;
}

Event event_from_name(std::string_view name) {
  if (std::optional<Event> event = parse_event(name)) return *event;
  std::string message =
      "Unknown event '" + std::string(name) + "'. Valid events: " + utils::join(valid_events(), ", ") + ".";
  const std::vector<std::string_view> candidates(kEventNames.begin(), kEventNames.end());
  if (std::optional<std::string> suggestion = utils::closest_match(name, candidates)) {
    message += " Did you mean '" + *suggestion + "'?";
  }
  throw std::invalid_argument(message);
}

const std::set<std::string, std::less<>>& valid_events() {
  static const std::set<std::string, std::less<>> names(kEventNames.begin(), kEventNames.end());
  return names;
}

}  // namespace callbacks
}  // namespace bridge::training
