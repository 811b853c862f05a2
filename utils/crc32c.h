// CRC32C (Castagnoli), the checksum TFRecord files (TensorBoard event files) frame every record with. Debian ships
// no C/C++ CRC32C library, hence this small table-driven one.
#pragma once

#include <cstdint>
#include <string_view>

namespace bridge::utils {

/// CRC32C of `data` (polynomial 0x1EDC6F41, reflected, initial value and final xor 0xFFFFFFFF).
///
/// Example: crc32c("123456789") == 0xE3069283 (the standard check value).
uint32_t crc32c(std::string_view data);

/// The CRC as TFRecord stores it: rotated right by 15 bits plus a constant, so that a CRC computed over data that
/// itself contains CRCs is not trivially related to them.
uint32_t masked_crc32c(std::string_view data);

}  // namespace bridge::utils
