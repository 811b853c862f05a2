// ExitSignalHandler: a caught signal is recorded, not fatal; the previous handler comes back afterwards; one at a time.
#include "utils/exit_signal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>

namespace bridge::utils {
namespace {

std::atomic<int> previous_calls{0};
extern "C" void previous_handler(int) { ++previous_calls; }

TEST(ExitSignalHandler, RecordsTheSignalAndRestoresThePreviousHandler) {
  struct sigaction previous {};
  previous.sa_handler = previous_handler;
  sigemptyset(&previous.sa_mask);
  struct sigaction original {};
  ASSERT_EQ(sigaction(SIGUSR1, &previous, &original), 0);
  {
    ExitSignalHandler handler({SIGUSR1, SIGUSR2});
    EXPECT_EQ(handler.received(), 0);
    std::raise(SIGUSR2);
    EXPECT_EQ(handler.received(), SIGUSR2);
    EXPECT_EQ(previous_calls, 0);
  }
  std::raise(SIGUSR1);
  EXPECT_EQ(previous_calls, 1);
  {
    ExitSignalHandler again({SIGUSR1});
    EXPECT_EQ(again.received(), 0) << "a new handler starts with no signal";
  }
  sigaction(SIGUSR1, &original, nullptr);
}

TEST(ExitSignalHandler, OneAtATime) {
  ExitSignalHandler first({SIGUSR1});
  EXPECT_THROW(ExitSignalHandler({SIGUSR2}), std::logic_error);
}

TEST(ExitSignalHandler, UncatchableSignalIsAnError) {
  EXPECT_THROW(ExitSignalHandler({SIGKILL}), std::invalid_argument);
  EXPECT_NO_THROW(ExitSignalHandler({SIGUSR1}));  // nothing was left installed by the failure
}

TEST(ExitSignalHandler, SignalNames) {
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_THAT(signal_name(SIGRTMIN + 1), ::testing::StartsWith("signal "));
}

}  // namespace
}  // namespace bridge::utils
