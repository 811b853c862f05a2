// UTF-8 decoding and the lossy conversion of the Unicode Standard's "substitution of maximal subparts".
#include "training/tokenizers/utf8.h"

#include <stdexcept>

namespace bridge::training::tokenizers::utf8 {
namespace {

// The length of the well-formed prefix of a sequence starting at text[i] (1..4 when a whole character is there; 0
// when even the lead byte is ill-formed), following Table 3-7 of the Unicode Standard: the second byte's range
// depends on the lead (E0: A0..BF, ED: 80..9F, F0: 90..BF, F4: 80..8F), the others are 80..BF.
std::size_t valid_prefix(std::string_view text, std::size_t i, std::size_t& needed) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  unsigned char low = 0x80, high = 0xBF;
  if (lead < 0x80) {
    needed = 1;
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    needed = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    needed = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    needed = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    needed = 1;
    return 0;
  }
  std::size_t length = 1;
  while (length < needed && i + length < text.size()) {
    const unsigned char next = byte(i + length);
    const bool ok = length == 1 ? (next >= low && next <= high) : (next >= 0x80 && next <= 0xBF);
    if (!ok) break;
    ++length;
  }
  return length;
}

}  // namespace

void append(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool next(std::string_view text, std::size_t& i, char32_t& c) {
  if (i >= text.size()) return false;
  std::size_t needed = 0;
  if (valid_prefix(text, i, needed) != needed) return false;
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  static constexpr unsigned char kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t value = byte(0) & kLeadMask[needed];
  for (std::size_t k = 1; k < needed; ++k) value = (value << 6) | (byte(k) & 0x3F);
  c = value;
  i += needed;
  return true;
}

std::size_t first_invalid(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    // ASCII runs are most text: skip eight bytes at a time while none has its high bit set.
    while (i + 8 <= text.size()) {
      unsigned long long word = 0;
      for (std::size_t k = 0; k < 8; ++k)
        word |= static_cast<unsigned long long>(static_cast<unsigned char>(text[i + k])) << (8 * k);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= text.size()) break;
    std::size_t needed = 0;
    if (valid_prefix(text, i, needed) != needed) return i;
    i += needed;
  }
  return std::string_view::npos;
}

std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    std::size_t needed = 0;
    const std::size_t length = valid_prefix(bytes, i, needed);
    if (length == needed) {
      out.append(bytes.substr(i, length));
      i += length;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal ill-formed subpart (at least the lead byte)
      i += length == 0 ? 1 : length;
    }
  }
  return out;
}

void require_valid(std::string_view text, std::string_view who) {
  const std::size_t bad = first_invalid(text);
  if (bad != std::string_view::npos) {
    throw std::invalid_argument(std::string(who) + ": the text is not valid UTF-8 at byte " + std::to_string(bad) +
                                "; convert the input to UTF-8");
  }
}

}  // namespace bridge::training::tokenizers::utf8
