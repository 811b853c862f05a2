// Rank-aware logging: the rank tag, info once (rank 0), warnings everywhere, and the all-ranks switch.
#include "utils/logging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace bridge::utils {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string log_as(int rank, int world_size) {
  std::ostringstream out;
  configure_logging(rank, world_size, std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  logger().info("hello {}", 42);
  logger().warn("careful");
  logger().flush();
  configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(std::cerr));  // restore for other tests
  return out.str();
}

TEST(Logging, RankZeroPrintsInfoTaggedWithItsRank) {
  unsetenv("BRIDGE_LOG_ALL_RANKS");
  const std::string text = log_as(0, 4);
  EXPECT_THAT(text, HasSubstr("[rank 0/4] [info] hello 42"));
  EXPECT_THAT(text, HasSubstr("[rank 0/4] [warning] careful"));
}

TEST(Logging, OtherRanksPrintOnlyWarningsUnlessAskedToPrintAll) {
  unsetenv("BRIDGE_LOG_ALL_RANKS");
  std::string text = log_as(3, 4);
  EXPECT_THAT(text, Not(HasSubstr("hello")));
  EXPECT_THAT(text, HasSubstr("[rank 3/4] [warning] careful"));
  setenv("BRIDGE_LOG_ALL_RANKS", "1", 1);
  text = log_as(3, 4);
  unsetenv("BRIDGE_LOG_ALL_RANKS");
  EXPECT_THAT(text, HasSubstr("[rank 3/4] [info] hello 42"));
}

TEST(Logging, LevelFromEnvironment) {
  setenv("BRIDGE_LOG_LEVEL", "warn", 1);
  const std::string text = log_as(0, 1);
  unsetenv("BRIDGE_LOG_LEVEL");
  EXPECT_THAT(text, Not(HasSubstr("hello")));
  EXPECT_THAT(text, HasSubstr("careful"));
}

TEST(Logging, ReconfiguringKeepsTheSinkAndReferences) {
  std::ostringstream out;
  configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  spdlog::logger& before = logger();
  configure_logging(2, 8);  // what init_distributed does: the user's sink stays
  EXPECT_EQ(&before, &logger());
  logger().warn("still here");
  logger().flush();
  EXPECT_THAT(out.str(), HasSubstr("[rank 2/8] [warning] still here"));
  configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(std::cerr));
}

TEST(Logging, UnknownLevelFallsBackToInfo) {
  setenv("BRIDGE_LOG_LEVEL", "verbose", 1);
  const std::string text = log_as(0, 1);
  unsetenv("BRIDGE_LOG_LEVEL");
  EXPECT_THAT(text, HasSubstr("hello 42"));
}

}  // namespace
}  // namespace bridge::utils
