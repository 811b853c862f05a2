// exception_message and describe: what() of a std::exception, a phrase for anything else thrown, no rethrow of a null
// pointer, and LibTorch's c10::Error without its C++ backtrace unless TORCH_SHOW_CPP_STACKTRACES=1 asks for it.
#include "utils/exception_message.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace bridge::utils {
namespace {

template <class T>
std::exception_ptr thrown(const T& value) {
  try {
    throw value;
  } catch (...) {
    return std::current_exception();
  }
}

TEST(ExceptionMessage, WhatOfAStdExceptionAndAPhraseOtherwise) {
  EXPECT_EQ(exception_message(thrown(std::runtime_error("disk full"))), "disk full");
  EXPECT_EQ(exception_message(thrown(std::out_of_range("index 9"))), "index 9");
  EXPECT_EQ(exception_message(thrown(42)), "an exception not derived from std::exception");
  EXPECT_EQ(exception_message(nullptr), "no exception");
}

// A real LibTorch error (a shape mismatch): what() carries "Exception raised from ..." and the frames.
TEST(ExceptionMessage, C10ErrorsLoseTheirBacktraceUnlessAskedFor) {
  ::unsetenv("TORCH_SHOW_CPP_STACKTRACES");
  try {
    torch::ones({2, 3}).matmul(torch::ones({2, 3}));
    FAIL() << "the mismatched matmul did not throw";
  } catch (const c10::Error& error) {
    const std::string full = error.what();
    ASSERT_NE(full, error.what_without_backtrace()) << "this LibTorch puts no backtrace into what()";
    EXPECT_EQ(describe(error), error.what_without_backtrace());
    EXPECT_EQ(exception_message(std::current_exception()), error.what_without_backtrace());
    EXPECT_EQ(describe(error).find("Exception raised from"), std::string::npos);
    ::setenv("TORCH_SHOW_CPP_STACKTRACES", "1", 1);
    EXPECT_EQ(describe(error), full);
    ::unsetenv("TORCH_SHOW_CPP_STACKTRACES");
  }
  const std::runtime_error plain("plain");
  EXPECT_EQ(describe(plain), "plain");
}

}  // namespace
}  // namespace bridge::utils
