// libFuzzer target: YAML recipes. Any text must load or be refused with ConfigError (a message naming the key or
// file:line); no other exception, crash or leak. A recipe that loads must survive the --print-config round trip:
// to_yaml of it loads back to a config whose to_yaml is the same text.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "training/config/config_yaml.h"

using bridge::training::ConfigContainer;
using bridge::training::ConfigError;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ConfigContainer config;
  try {
    config = bridge::training::load_config_yaml_string(text, "<fuzz>");
  } catch (const ConfigError&) {
    return 0;
  }
  const std::string printed = bridge::training::to_yaml(config);
  const ConfigContainer back = bridge::training::load_config_yaml_string(printed, "<printed>");
  FUZZ_CHECK(bridge::training::to_yaml(back) == printed);
  return 0;
}
