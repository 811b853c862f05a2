// exception_message: what() of a std::exception, a phrase for anything else thrown, and no rethrow of a null pointer.
#include "utils/exception_message.h"

#include <gtest/gtest.h>

#include <stdexcept>

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

}  // namespace
}  // namespace bridge::utils
