// Rank-aware logging: the rank tag, info once (rank 0), warnings everywhere, and the all-ranks switch.
#include "utils/logging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <regex>
#include <sstream>
#include <vector>

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

// "YYYY-MM-DD HH:MM:SS" in each line of `text`.
std::vector<std::ptrdiff_t> timestamps_per_line(const std::string& text) {
  static const std::regex timestamp(R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)");
  std::vector<std::ptrdiff_t> counts;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    counts.push_back(std::distance(std::sregex_iterator(line.begin(), line.end(), timestamp), std::sregex_iterator()));
  }
  return counts;
}

TEST(Logging, EveryLineCarriesOneTimestamp) {
  std::ostringstream out;
  configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  logger().info("plain");
  log_info_on_this_rank("the logger's timestamp");
  // Megatron's training log line brings its own: the logger's prefix leaves its one out.
  log_info_on_this_rank(" [2026-01-01 12:00:00] iteration        1/      10 |", Timestamp::kInMessage);
  logger().flush();
  configure_logging(0, 1, std::make_shared<spdlog::sinks::ostream_sink_mt>(std::cerr));
  const std::string text = out.str();
  EXPECT_EQ(timestamps_per_line(text), (std::vector<std::ptrdiff_t>{1, 1, 1})) << text;
  std::istringstream lines(text);
  std::string first, second, third;
  std::getline(lines, first);
  std::getline(lines, second);
  std::getline(lines, third);
  EXPECT_TRUE(std::regex_match(first, std::regex(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \[rank 0/1\] \[info\] plain)")))
      << first;
  // It is the time of the line, not a zero date.
  std::tm logged{};
  std::istringstream(first.substr(1, 19)) >> std::get_time(&logged, "%Y-%m-%d %H:%M:%S");
  logged.tm_isdst = -1;
  EXPECT_LT(std::abs(std::difftime(std::time(nullptr), std::mktime(&logged))), 60.0) << first;
  EXPECT_EQ(third.rfind("[rank 0/1] [info]  [2026-01-01 12:00:00] iteration ", 0), 0U) << third;
}

TEST(Logging, UnknownLevelFallsBackToInfo) {
  setenv("BRIDGE_LOG_LEVEL", "verbose", 1);
  const std::string text = log_as(0, 1);
  unsetenv("BRIDGE_LOG_LEVEL");
  EXPECT_THAT(text, HasSubstr("hello 42"));
}

}  // namespace
}  // namespace bridge::utils
