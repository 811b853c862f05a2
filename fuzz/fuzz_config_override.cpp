// libFuzzer target: command-line overrides ("a.b.c=value", Hydra style). Any line must apply or be refused with
// ConfigError naming the key and the closest valid one; no other exception, crash or leak. An override that applies
// must survive the --print-config round trip, and applying it twice is the same as once.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "training/config/config_yaml.h"

using bridge::training::ConfigContainer;
using bridge::training::ConfigError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view assignment(reinterpret_cast<const char*>(data), size);
  ConfigContainer config;
  try {
    bridge::training::apply_override(config, assignment);
  } catch (const ConfigError&) {
    return 0;
  }
  const std::string printed = bridge::training::to_yaml(config);
  FUZZ_CHECK(bridge::training::to_yaml(bridge::training::load_config_yaml_string(printed, "<printed>")) == printed);
  bridge::training::apply_override(config, assignment);
  FUZZ_CHECK(bridge::training::to_yaml(config) == printed);
  return 0;
}
