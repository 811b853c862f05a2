// Plugins: the file check, dlopen, the ABI check, and the options' typed reads.
#include "training/callbacks/plugin.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "training/config/config_yaml.h"
#include "utils/elf_file.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

template <class T>
T read_option(const PluginOptions& options, const std::string& key, T fallback) {
  const auto it = options.values.find(key);
  if (it == options.values.end()) return fallback;
  return parse_config_value<T>(it->second, "plugin " + options.path + ": option " + key);
}

}  // namespace

std::string PluginOptions::get_string(const std::string& key, const std::string& fallback) const {
  return read_option<std::string>(*this, key, fallback);
}
double PluginOptions::get_double(const std::string& key, double fallback) const {
  return read_option<double>(*this, key, fallback);
}
std::int64_t PluginOptions::get_int(const std::string& key, std::int64_t fallback) const {
  return read_option<std::int64_t>(*this, key, fallback);
}
bool PluginOptions::get_bool(const std::string& key, bool fallback) const {
  return read_option<bool>(*this, key, fallback);
}

RegisterCallbacksFn load_plugin(const std::string& path, std::string_view where_view) {
  const std::string where(where_view);
  static std::mutex mutex;
  static std::map<std::string, RegisterCallbacksFn> loaded;  // by canonical path; never unloaded
  std::error_code error;
  const std::filesystem::path canonical = std::filesystem::canonical(path, error);
  if (error) {
    throw std::invalid_argument(where + ".path: no plugin at '" + path + "' (" + error.message() +
                                "); build it (see examples/plugin/) and give its path");
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = loaded.find(canonical.string()); it != loaded.end()) return it->second;
  // dlopen maps a truncated file past its end and dies of SIGBUS on the first missing page: check the headers first.
  try {
    utils::check_shared_object(canonical.string());
  } catch (const std::invalid_argument& bad) {
    throw std::invalid_argument(where + ".path: " + bad.what());
  }
  void* library = ::dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    throw std::invalid_argument(where + ".path: cannot load '" + path + "': " + ::dlerror() +
                                " (a plugin takes bridge's symbols from the program that loads it: do not link "
                                "bridge's libraries into it, and load it from bridge-pretrain)");
  }
  using AbiFn = const char* (*)();
  const auto abi = reinterpret_cast<AbiFn>(::dlsym(library, "bridge_plugin_abi"));
  if (abi == nullptr) {
    ::dlclose(library);
    throw std::invalid_argument(where + ".path: '" + path +
                                "' is not a bridge plugin: it exports no bridge_plugin_abi (put "
                                "BRIDGE_PLUGIN_ABI_EXPORT() in one of its files)");
  }
  const std::string theirs = abi();
  if (theirs != BRIDGE_PLUGIN_ABI_STRING) {
    ::dlclose(library);
    throw std::invalid_argument(where + ".path: '" + path + "' was built for \"" + theirs +
                                "\", but this bridge is \"" + BRIDGE_PLUGIN_ABI_STRING +
                                "\"; rebuild the plugin against this bridge (the same compiler and LibTorch)");
  }
  const auto fn = reinterpret_cast<RegisterCallbacksFn>(::dlsym(library, "bridge_register_callbacks"));
  if (fn == nullptr) {
    ::dlclose(library);
    throw std::invalid_argument(where + ".path: '" + path +
                                "' exports no bridge_register_callbacks; define extern \"C\" void "
                                "bridge_register_callbacks(bridge::training::CallbackManager&, const "
                                "bridge::training::PluginOptions&)");
  }
  loaded.emplace(canonical.string(), fn);
  return fn;
}

}  // namespace callbacks
}  // namespace bridge::training
