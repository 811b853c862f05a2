// Byte-at-a-time CRC32C behind utils/crc32c.h. Metric files are small, so the simple table is fast enough.
#include "utils/crc32c.h"

#include <array>

namespace bridge::utils {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78;  // 0x1EDC6F41 with its bits reversed
constexpr uint32_t kTfRecordMaskDelta = 0xA282EAD8;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? kReflectedPolynomial : 0u);
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : data) crc = kTable[(crc ^ static_cast<unsigned char>(c)) & 0xFFu] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kTfRecordMaskDelta;
}

}  // namespace bridge::utils
