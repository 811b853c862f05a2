// Helpers of the config tests (config_yaml_test, megatron_bridge_keys_test): the message of the ConfigError a piece
// of code throws.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "training/config/config_yaml.h"

namespace bridge::training::testing {

/// The message of the ConfigError that `fn` throws ("" and a test failure if it throws none).
template <class Fn>
std::string config_error(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

/// The message of the ConfigError that applying `assignment` to the defaults throws.
inline std::string override_error(const std::string& assignment) {
  return config_error([&] {
    ConfigContainer config;
    apply_override(config, assignment);
  });
}

}  // namespace bridge::training::testing
