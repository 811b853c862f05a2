// Shared pieces of the callback tests: a fixture with a real global state, a one-chunk model and a context over them,
// and what_of for error messages.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "training/callbacks.h"

namespace bridge::training::testing {

class CallbackTest : public ::testing::Test {
 protected:
  GlobalState state;
  ModelChunks model{torch::nn::Linear(4, 4).ptr()};
  CallbackManager manager;
  CallbackContext ctx{state, model, manager.user_state()};
};

/// The message of the exception `fn` throws, or "(no exception)".
inline std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace bridge::training::testing
