// Event names: Megatron-Bridge's 14 exact names and Megatron-LM's on_setup_start, plus the extensions, round trips
// and the unknown-name error.
#include "training/callbacks/event.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace bridge::training {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::set<std::string> kMegatronBridgeEvents = {
    "on_setup_start", "on_data_init_start", "on_train_start",     "on_train_step_start", "on_train_step_end",
    "on_train_end",   "on_eval_start",      "on_eval_step_start", "on_eval_step_end",    "on_eval_end",
    "on_test_start",  "on_test_step_start", "on_test_step_end",   "on_test_end",         "on_checkpoint_save"};

const std::set<std::string> kExtensionEvents = {"on_forward_start", "on_forward_end",          "on_backward_start",
                                                "on_backward_end",  "on_optimizer_step_start", "on_optimizer_step_end",
                                                "on_log",           "on_checkpoint_load",      "on_exception"};

TEST(ValidEvents, MB36_ContainsExactlyTheExpectedEvents) {
  std::set<std::string> expected = kMegatronBridgeEvents;
  expected.insert(kExtensionEvents.begin(), kExtensionEvents.end());
  const std::set<std::string> actual(valid_events().begin(), valid_events().end());
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(valid_events().size(), kNumEvents);
}

TEST(ValidEvents, MB37_IsImmutable) {
  static_assert(std::is_const_v<std::remove_reference_t<decltype(valid_events())>>);
  EXPECT_EQ(&valid_events(), &valid_events());  // one shared constant
}

TEST(Event, NamesRoundTrip) {
  for (Event event : all_events()) {
    EXPECT_EQ(parse_event(to_string(event)), event);
    EXPECT_EQ(event_from_name(to_string(event)), event);
  }
  EXPECT_EQ(parse_event("on_train_start"), Event::kTrainStart);
  EXPECT_EQ(parse_event("train_start"), std::nullopt);
  EXPECT_EQ(parse_event(""), std::nullopt);
}

TEST(Event, UnknownNameListsValidEventsSortedAndSuggests) {
  try {
    event_from_name("on_eval_ends");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_THAT(message, StartsWith("Unknown event 'on_eval_ends'. Valid events: on_backward_end, on_backward_start,"));
    EXPECT_THAT(message, HasSubstr("Did you mean 'on_eval_end'?"));
  }
  try {
    event_from_name("completely_different");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), ::testing::Not(HasSubstr("Did you mean")));
  }
}

}  // namespace
}  // namespace bridge::training
