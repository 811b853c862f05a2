// The built-in callbacks by name, for YAML recipes and bridge-pretrain (which write no C++): each type's options
// with their types, defaults and docs, a check of a `callbacks:` entry, and the callback it builds.
//
//   callbacks:                                   # in a recipe, or callbacks=[{type: ProgressBar}] as an override
//     - {type: EarlyStopping, monitor: lm loss validation, patience: 3}
//     - {type: TimeLimit, duration: 4h, reserve: 5min}
//
// An unknown type or option, or a value of the wrong type, is an error that names the entry, the option and the
// closest valid name; an option left out keeps the options struct's default.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "training/config/config.h"

namespace bridge::training {
inline namespace callbacks {

class Callback;
class CallbackManager;

struct CallbackOptionInfo {
  std::string name;
  std::string type;           ///< as --help writes it: "int", "float", "duration", ...
  std::string default_value;  ///< as YAML
  std::string doc;
};

struct CallbackTypeInfo {
  std::string type;  ///< "EarlyStopping"
  std::string doc;
  std::vector<CallbackOptionInfo> options;
};

/// Every built-in a `callbacks:` entry may name, in alphabetical order.
std::vector<CallbackTypeInfo> builtin_callback_types();

/// The pseudo-type of an entry that loads callbacks from a shared library: {type: Plugin, path: libmine.so, ...}
/// (training/callbacks/plugin.h); its other keys are the plugin's options.
inline constexpr std::string_view kPluginType = "Plugin";

/// Checks `entry` (its type, option names and values); throws std::invalid_argument starting with `where` (e.g.
/// "callbacks[1]") that names the type or option and the closest valid one. A Plugin entry needs a `path`; with
/// `load_plugins` the library is loaded and its ABI checked too (ConfigContainer::validate does; reading YAML
/// does not).
void validate_callback_config(const CallbackConfig& entry, std::string_view where, bool load_plugins = true);

/// The built-in callback `entry` describes (validated as above); a Plugin entry throws (see add_callbacks).
std::shared_ptr<Callback> build_callback(const CallbackConfig& entry, std::string_view where);

/// Adds what each entry describes to `manager`, in order: a built-in, or whatever a plugin registers (it is given
/// `rank` and `world_size`). `where` of entry i is "callbacks[i]".
void add_callbacks(CallbackManager& manager, const std::vector<CallbackConfig>& entries, int rank, int world_size);

}  // namespace callbacks
}  // namespace bridge::training
