// ExitSignalHandler: an async-signal-safe flag (a lock-free atomic written from the handler) and the saved handlers.
#include "utils/exit_signal.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace bridge::utils {
namespace {

std::atomic<int> received_signal{0};
std::atomic<bool> installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the signal flag must be lock-free to be set from a handler");

// Repeats only keep the first signal: launchers and schedulers often deliver a preemption notice twice (srun or
// mpirun forwarding it beside the node's own), and a second one must not undo the save the first asked for.
extern "C" void on_exit_signal(int signal) {
  int expected = 0;
  received_signal.compare_exchange_strong(expected, signal);
}

}  // namespace

ExitSignalHandler::ExitSignalHandler(std::vector<int> signals) : signals_(std::move(signals)) {
  if (installed.exchange(true)) {
    throw std::logic_error("ExitSignalHandler: another one is already installed in this process; keep one");
  }
  received_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_exit_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and collectives go on; the loop looks at the flag between steps
  previous_.resize(signals_.size());
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    if (sigaction(signals_[i], &action, &previous_[i]) != 0) {
      const int error = errno;
      for (std::size_t j = 0; j < i; ++j) sigaction(signals_[j], &previous_[j], nullptr);
      installed = false;
      throw std::invalid_argument("ExitSignalHandler: cannot catch signal " + std::to_string(signals_[i]) + ": " +
                                  std::strerror(error));
    }
  }
}

ExitSignalHandler::~ExitSignalHandler() {
  for (std::size_t i = 0; i < signals_.size(); ++i) sigaction(signals_[i], &previous_[i], nullptr);
  installed = false;
}

int ExitSignalHandler::received() const { return received_signal.load(); }

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(signal);
  }
}

}  // namespace bridge::utils
