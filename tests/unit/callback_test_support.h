// Shared fixture for the callback-core tests: a real global state, a one-chunk model and a context over them.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "training/callbacks.h"

namespace bridge::training::testing {

class CallbackTest : public ::testing::Test {
 protected:
  GlobalState state;
  ModelChunks model{torch::nn::Linear(4, 4).ptr()};
  CallbackManager manager;
  CallbackContext ctx{state, model, manager.user_state()};
};

}  // namespace bridge::training::testing
