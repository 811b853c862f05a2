// Edit distance against hand-computed values, and the typo threshold of closest_match.
#include "utils/closest_match.h"

#include <gtest/gtest.h>

namespace bridge::utils {
namespace {

TEST(EditDistance, HandComputedValues) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("on_train_start", "on_trian_start"), 2u);  // a transposition is two edits
  EXPECT_EQ(edit_distance("same", "same"), 0u);
}

TEST(ClosestMatch, PicksTheNearestPlausibleCandidate) {
  const std::vector<std::string_view> names = {"on_train_start", "on_train_end", "on_eval_start"};
  EXPECT_EQ(closest_match("on_train_strat", names), "on_train_start");
  EXPECT_EQ(closest_match("on_eval_strt", names), "on_eval_start");
  EXPECT_EQ(closest_match("on_train_end", names), "on_train_end");
  EXPECT_EQ(closest_match("xyz", names), std::nullopt);  // too far from everything
  EXPECT_EQ(closest_match("anything", {}), std::nullopt);
}

TEST(ClosestMatch, TiesGoToTheEarliestCandidate) { EXPECT_EQ(closest_match("abcd", {"abcx", "abcy"}), "abcx"); }

}  // namespace
}  // namespace bridge::utils
