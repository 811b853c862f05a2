// The callbacks the dispatch benchmark fires, compiled in their own file so that no call can be inlined.
#pragma once

#include <functional>
#include <memory>

#include "training/callbacks.h"

namespace bridge::bench {

/// A class callback whose on_train_step_end bumps a counter.
std::shared_ptr<training::Callback> make_counting_callback(long& counter);
/// A capturing lambda that bumps a counter.
training::CallbackFn make_counting_function(long& counter);

}  // namespace bridge::bench
