// NumPy's legacy RandomState(seed).shuffle, reproduced draw for draw, so the GPT sample order matches Megatron's for
// the same seed: RandomState seeds MT19937 exactly as std::mt19937(seed) does, and shuffle is a Fisher-Yates pass
// from the back whose swap partner comes from random_interval's masked rejection sampling.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace bridge::training::datasets {

/// numpy.random.RandomState(seed), for the draws shuffle makes.
class NumpyRandomState {
 public:
  /// `seed` must be in [0, 2^32), as NumPy requires; throws std::invalid_argument otherwise.
  explicit NumpyRandomState(uint64_t seed);

  /// A uniform integer in [0, max] (NumPy's random_interval).
  uint64_t random_interval(uint64_t max);

  /// Shuffles `values` in place like RandomState.shuffle on a 1-D array (the element type does not affect the draws).
  template <class T>
  void shuffle(std::vector<T>& values) {
    for (std::size_t i = values.size(); i-- > 1;) {
      const auto j = static_cast<std::size_t>(random_interval(i));
      std::swap(values[i], values[j]);
    }
  }

 private:
  std::mt19937 generator_;
};

}  // namespace bridge::training::datasets
