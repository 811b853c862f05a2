// NumPy's legacy MT19937 draws (numpy/random/src/distributions/distributions.c: random_interval).
#include "training/datasets/numpy_random_state.h"

#include <stdexcept>
#include <string>

namespace bridge::training::datasets {

NumpyRandomState::NumpyRandomState(uint64_t seed) {
  if (seed > 0xFFFFFFFFULL) {
    throw std::invalid_argument(
        "NumpyRandomState: the seed " + std::to_string(seed) +
        " is not in [0, 2^32), which numpy.random.RandomState requires; use a smaller rng.seed");
  }
  generator_.seed(static_cast<std::mt19937::result_type>(seed));
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xFFFFFFFFULL) {
    do {
      value = generator_() & mask;
    } while (value > max);
  } else {
    do {
      const uint64_t high = generator_();  // NumPy's next_uint64: the first 32-bit draw is the high half
      value = ((high << 32) | generator_()) & mask;
    } while (value > max);
  }
  return value;
}

}  // namespace bridge::training::datasets
