// MD5 digests, for naming cached index files after their description as Megatron does (hashlib.md5(...).hexdigest()).
// Not for security.
#pragma once

#include <string>
#include <string_view>

namespace bridge::training::datasets {

/// The 32 lowercase hex digits of MD5(data). Example: md5_hex("") == "d41d8cd98f00b204e9800998ecf8427e".
std::string md5_hex(std::string_view data);

}  // namespace bridge::training::datasets
