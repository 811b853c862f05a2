// Bytes as ids.
#include "training/tokenizers/byte_level_tokenizer.h"

#include <stdexcept>

namespace bridge::training::tokenizers {

std::vector<int64_t> ByteLevelTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteLevelTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < 0 || id > kEod) {
      throw std::out_of_range("ByteLevelTokenizer::decode: id " + std::to_string(id) + " is not in [0, 257)");
    }
    if (id == kEod) {
      text += "<|endoftext|>";
    } else {
      text += static_cast<char>(static_cast<unsigned char>(id));
    }
  }
  return text;
}

}  // namespace bridge::training::tokenizers
