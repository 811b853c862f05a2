// MD5 (RFC 1321).
#include "training/datasets/md5.h"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace bridge::training::datasets {
namespace {

constexpr std::array<uint32_t, 64> kShifts = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                              5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                              4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                              6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

// K[i] = floor(2^32 * |sin(i + 1)|), computed once rather than spelled out.
const std::array<uint32_t, 64>& constants() {
  static const std::array<uint32_t, 64> table = [] {
    std::array<uint32_t, 64> k{};
    for (std::size_t i = 0; i < 64; ++i) {
      k[i] = static_cast<uint32_t>(std::floor(std::fabs(std::sin(static_cast<double>(i + 1))) * 4294967296.0));
    }
    return k;
  }();
  return table;
}

uint32_t rotate_left(uint32_t x, uint32_t c) { return (x << c) | (x >> (32 - c)); }

void process_block(const unsigned char* block, std::array<uint32_t, 4>& state) {
  uint32_t m[16];
  for (std::size_t i = 0; i < 16; ++i) {
    m[i] = uint32_t{block[4 * i]} | uint32_t{block[4 * i + 1]} << 8 | uint32_t{block[4 * i + 2]} << 16 |
           uint32_t{block[4 * i + 3]} << 24;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  const auto& k = constants();
  for (std::size_t i = 0; i < 64; ++i) {
    uint32_t f;
    std::size_t g;
    if (i < 16) {
      f = (b & c) | (~b & d);
      g = i;
    } else if (i < 32) {
      f = (d & b) | (~d & c);
      g = (5 * i + 1) % 16;
    } else if (i < 48) {
      f = b ^ c ^ d;
      g = (3 * i + 5) % 16;
    } else {
      f = c ^ (b | ~d);
      g = (7 * i) % 16;
    }
    f += a + k[i] + m[g];
    a = d;
    d = c;
    c = b;
    b += rotate_left(f, kShifts[i]);
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
}

}  // namespace

std::string md5_hex(std::string_view data) {
  std::array<uint32_t, 4> state = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  const std::size_t full = data.size() / 64 * 64;
  for (std::size_t offset = 0; offset < full; offset += 64) {
    process_block(reinterpret_cast<const unsigned char*>(data.data()) + offset, state);
  }
  // The tail, a 1 bit, zeros, and the message length in bits (little-endian) fill one or two final blocks.
  unsigned char tail[128] = {};
  const std::size_t rest = data.size() - full;
  if (rest > 0) std::memcpy(tail, data.data() + full, rest);
  tail[rest] = 0x80;
  const std::size_t tail_size = rest < 56 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  for (std::size_t i = 0; i < 8; ++i) tail[tail_size - 8 + i] = static_cast<unsigned char>(bits >> (8 * i));
  for (std::size_t offset = 0; offset < tail_size; offset += 64) process_block(tail + offset, state);

  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (const uint32_t word : state) {
    for (std::size_t i = 0; i < 4; ++i) {
      const auto byte = static_cast<unsigned char>(word >> (8 * i));
      hex += kHex[byte >> 4];
      hex += kHex[byte & 0xF];
    }
  }
  return hex;
}

}  // namespace bridge::training::datasets
