// Shared helpers of the dataset tests: a scratch folder per test, the independent Python reference scripts
// (tests/tools/megatron_*.py, run with a Python that has NumPy), the known content those scripts write, and a small
// run's config over it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "training/config/config.h"

namespace bridge::training::datasets::testing {

namespace fs = std::filesystem;

/// A fresh folder for one test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("bridge_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Runs tests/tools/<script> with the NumPy Python; fails the test (with the command) when it fails.
inline void run_python_tool(const std::string& script_and_args) {
  const std::string python = BRIDGE_NUMPY_PYTHON;
  ASSERT_TRUE(fs::exists(python)) << "the reference scripts need " << python
                                  << " with NumPy (scripts/install_deps.sh installs python3-torch, which brings it; "
                                     "or configure with -DBRIDGE_NUMPY_PYTHON=<python>)";
  const std::string command = "'" + python + "' '" + BRIDGE_TEST_TOOLS_DIR + "/" + script_and_args;
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Document i of megatron_indexed_writer.py (its docstring states the same formula).
inline std::vector<int64_t> known_document(int64_t i, bool uint16) {
  const int64_t length = (7 * i) % 13 + 1;
  const int64_t modulus = uint16 ? 65536 : 2147483647;
  const int64_t step = uint16 ? 31 : 31 * 70001;
  std::vector<int64_t> tokens;
  for (int64_t j = 0; j < length; ++j) tokens.push_back((i * 1009 + j * step) % modulus);
  return tokens;
}

/// A small run over the dataset `<dir>/data` (uint16 ids), split 8,1,1 with its index cache in `dir`: 5 steps of 4
/// samples of 8 tokens, evaluating 2 batches every 2 steps.
inline ConfigContainer data_config(const ScratchDir& dir) {
  ConfigContainer config;
  config.model.seq_length = 8;
  config.model.vocab_size = 65536;
  config.train.train_iters = 5;
  config.train.global_batch_size = 4;
  config.train.eval_iters = 2;
  config.train.eval_interval = 2;
  config.dataset.data_path = {dir / "data"};
  config.dataset.split = "8,1,1";
  config.dataset.path_to_cache = dir / "cache";
  config.rng.seed = 5;
  return config;
}

/// Writes `<prefix>.bin/.idx` of `count` known documents with the Python (Megatron) writer.
inline void write_reference_dataset(const std::string& prefix, const std::string& dtype, int count) {
  run_python_tool("megatron_indexed_writer.py' '" + prefix + "' " + dtype + " " + std::to_string(count));
}

}  // namespace bridge::training::datasets::testing
