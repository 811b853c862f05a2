// Plugins: callbacks in a shared library that bridge-pretrain loads from a recipe, so users who write C++ callbacks
// add them without rebuilding bridge.
//
//   // mine.cpp, built as a shared library against the installed bridge (examples/plugin/ shows the CMake):
//   #include <bridge/bridge.h>
//   BRIDGE_PLUGIN_ABI_EXPORT()  // the version check the loader runs first
//   extern "C" void bridge_register_callbacks(bridge::training::CallbackManager& manager,
//                                            const bridge::training::PluginOptions& options) {
//     manager.add(std::make_shared<MyCallback>(options.get_double("threshold", 3.0)));
//   }
//
//   callbacks:
//     - {type: Plugin, path: build/libmine.so, threshold: 2.5}   # every other key reaches the plugin as an option
//
// The library is loaded once per process (dlopen, never closed: its callbacks live as long as the process) with
// bridge's own symbols taken from the program that loads it, so the plugin must not link bridge's libraries itself.
// Before registering anything the loader compares the library's bridge_plugin_abi() with its own: the plugin
// protocol, the C++ ABI, libstdc++'s string ABI and the LibTorch version must match, or loading fails saying which.
#pragma once

#include <torch/version.h>

#include <map>
#include <string>
#include <string_view>

#include "training/callbacks/callback_manager.h"

/// The plugin protocol: bump when bridge_register_callbacks or what it may rely on changes. (Defined only when not
/// already, so that a test can build a plugin of another protocol.)
#ifndef BRIDGE_PLUGIN_PROTOCOL
#define BRIDGE_PLUGIN_PROTOCOL 1
#endif

#define BRIDGE_PLUGIN_STRINGIFY_(x) #x
#define BRIDGE_PLUGIN_STRINGIFY(x) BRIDGE_PLUGIN_STRINGIFY_(x)
/// What a plugin and the program that loads it must share, as text: "bridge-plugin 1; c++abi 1018; cxx11-abi 1;
/// torch 2.15.0".
#define BRIDGE_PLUGIN_ABI_STRING                                                                        \
  "bridge-plugin " BRIDGE_PLUGIN_STRINGIFY(BRIDGE_PLUGIN_PROTOCOL) "; c++abi " BRIDGE_PLUGIN_STRINGIFY( \
      __GXX_ABI_VERSION) "; cxx11-abi " BRIDGE_PLUGIN_STRINGIFY(_GLIBCXX_USE_CXX11_ABI) "; torch " TORCH_VERSION

/// Put once in a plugin: exports the ABI string the loader checks.
#define BRIDGE_PLUGIN_ABI_EXPORT() \
  extern "C" __attribute__((visibility("default"))) const char* bridge_plugin_abi() { return BRIDGE_PLUGIN_ABI_STRING; }

namespace bridge::training {
inline namespace callbacks {

/// What a plugin's bridge_register_callbacks receives: its recipe entry's other keys, and where it runs.
struct PluginOptions {
  std::string path;                           ///< the library, as the recipe names it
  std::map<std::string, std::string> values;  ///< every key of the entry but type and path, as YAML text
  int rank = 0;
  int world_size = 1;

  /// The option `key` read as the config reads values (see parse_config_value), or `fallback` when absent; a value
  /// of the wrong type throws std::invalid_argument naming the plugin and the key.
  std::string get_string(const std::string& key, const std::string& fallback = {}) const;
  double get_double(const std::string& key, double fallback) const;
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
};

/// The signature of the function a plugin exports.
using RegisterCallbacksFn = void (*)(CallbackManager& manager, const PluginOptions& options);

/// Loads the plugin at `path` (once per process) and checks its ABI; throws std::invalid_argument starting with
/// `where` that says what is wrong (no such file, not loadable, not a bridge plugin, another ABI) and what to do.
RegisterCallbacksFn load_plugin(const std::string& path, std::string_view where);

}  // namespace callbacks
}  // namespace bridge::training
