// UserState: typed storage, type errors naming the key and both types, and setdefault-style access.
#include "training/callbacks/user_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace bridge::training {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(UserState, StoresAndReadsBackTypedValues) {
  UserState state;
  state.set("steps", 3);
  state.set("name", std::string("run"));
  state.get<int>("steps") += 2;
  EXPECT_EQ(state.get<int>("steps"), 5);
  EXPECT_EQ(state.get<std::string>("name"), "run");
  state.set("steps", 9);  // same type: replaced
  EXPECT_EQ(state.get<int>("steps"), 9);
  EXPECT_EQ(state.size(), 2u);
  EXPECT_THAT(state.keys(), ElementsAre("name", "steps"));
}

TEST(UserState, ReadingAsAnotherTypeNamesKeyAndBothTypes) {
  UserState state;
  state.set("lr", 0.5);
  try {
    state.get<int>("lr");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("user_state['lr'] holds a value of type double, not int"));
  }
  EXPECT_THROW(state.set("lr", 1), std::invalid_argument);  // storing another type is the same error
  EXPECT_THROW(state.get_or<float>("lr", 1.0f), std::invalid_argument);
  EXPECT_DOUBLE_EQ(state.get<double>("lr"), 0.5);  // the failed store changed nothing
}

TEST(UserState, MissingKeyIsAClearError) {
  UserState state;
  try {
    state.get<int>("absent");
    FAIL() << "expected std::out_of_range";
  } catch (const std::out_of_range& error) {
    EXPECT_THAT(error.what(), HasSubstr("user_state has no key 'absent'"));
  }
}

TEST(UserState, GetOrAndGetOrInsert) {
  UserState state;
  EXPECT_EQ(state.get_or("count", 7), 7);
  EXPECT_FALSE(state.contains("count"));
  ++state.get_or_insert("count", 0);
  ++state.get_or_insert("count", 100);  // present: the initial value is ignored
  EXPECT_EQ(state.get<int>("count"), 2);
  EXPECT_EQ(state.get_or("count", 7), 2);
}

TEST(UserState, EraseFreesTheKeyForAnotherType) {
  UserState state;
  state.set("x", 1);
  EXPECT_TRUE(state.erase("x"));
  EXPECT_FALSE(state.erase("x"));
  state.set("x", std::string("now a string"));
  EXPECT_EQ(state.get<std::string>("x"), "now a string");
}

TEST(UserState, StringLiteralsAreStoredAsStrings) {
  UserState state;
  state.set("name", "run-1");
  EXPECT_EQ(state.get<std::string>("name"), "run-1");
  state.set("name", "run-2");
  EXPECT_EQ(state.get<std::string>("name"), "run-2");
}

TEST(UserState, ConstAccess) {
  UserState state;
  state.set("v", 4);
  const UserState& view = state;
  EXPECT_EQ(view.get<int>("v"), 4);
  EXPECT_THROW(view.get<long>("v"), std::invalid_argument);
}

}  // namespace
}  // namespace bridge::training
