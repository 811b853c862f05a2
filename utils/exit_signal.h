// Catching SIGTERM and SIGINT for a clean exit, as Megatron's DistributedSignalHandler does for preemption. While an
// ExitSignalHandler lives, a SIGTERM or SIGINT only records the signal (repeats too: launchers often deliver a
// preemption notice twice); the training loop polls it at a step boundary and agrees with the other ranks to save and
// exit. SIGKILL (or SIGQUIT) still ends a stuck process.
#pragma once

#include <csignal>
#include <string>
#include <vector>

namespace bridge::utils {

class ExitSignalHandler {
 public:
  /// Installs the handler for `signals` (each must be catchable). One handler may be installed at a time.
  ///
  ///   ExitSignalHandler signals;                 // SIGTERM and SIGINT
  ///   while (training) { ...; if (signals.received() != 0) save_and_exit(); }
  explicit ExitSignalHandler(std::vector<int> signals = {SIGTERM, SIGINT});
  /// Restores the handlers that were there before.
  ~ExitSignalHandler();
  ExitSignalHandler(const ExitSignalHandler&) = delete;
  ExitSignalHandler& operator=(const ExitSignalHandler&) = delete;

  /// The first signal received since construction; 0 when none.
  int received() const;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

/// "SIGTERM" for SIGTERM, "signal 12" for one without a short name here.
std::string signal_name(int signal);

}  // namespace bridge::utils
