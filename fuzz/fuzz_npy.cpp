// libFuzzer target: the .npy reader of the cached sample indices. It must reject an input with std::runtime_error
// or accept it; an accepted array written back with npy_bytes must read back the same (type, shape and values).
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "training/datasets/npy.h"

using bridge::training::datasets::NpyArray;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  NpyArray array;
  try {
    array = bridge::training::datasets::parse_npy(bytes);
  } catch (const std::runtime_error&) {
    return 0;
  }
  int64_t count = 1;
  for (const int64_t dim : array.shape) count *= dim;
  FUZZ_CHECK(count == static_cast<int64_t>(array.values.size()));
  const std::string written = bridge::training::datasets::npy_bytes(array.type, array.shape, array.values);
  const NpyArray back = bridge::training::datasets::parse_npy(written);
  FUZZ_CHECK(back.type == array.type && back.shape == array.shape && back.values == array.values);
  return 0;
}
