// A check that a file is a whole ELF shared object for this machine, before dlopen maps it.
//
// dlopen trusts the file: a plugin truncated by a partial copy or a full disk is mapped past its end, and the first
// touch of a missing page kills the process with SIGBUS and no message. Reading the headers first turns that into
// an error that names the file and what is wrong with it.
//
//   utils::check_shared_object("build/libmine.so");  // throws std::invalid_argument if dlopen would crash or refuse
#pragma once

#include <string>

namespace bridge::utils {

/// Checks that `path` is a 64-bit little-endian ELF shared object (ET_DYN) for this machine whose program headers,
/// loadable segments and section header table all lie inside the file. Throws std::invalid_argument with the reason
/// ("is truncated: its segment 2 ends at byte 41200 but the file has 32768 bytes", ...); returns if it is whole.
void check_shared_object(const std::string& path);

}  // namespace bridge::utils
