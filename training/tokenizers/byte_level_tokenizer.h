// The tokenizer that needs no files: each byte of the UTF-8 text is its own id, EOD is 256.
//
//   ByteLevelTokenizer bytes;  // "hi" -> {104, 105}; eod() == 256; vocab_size() == 257
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "training/tokenizers/tokenizer.h"

namespace bridge::training::tokenizers {

/// Each byte of the UTF-8 text is its own id (0..255); EOD is 256, so vocab_size() is 257. Decoding EOD gives
/// "<|endoftext|>".
class ByteLevelTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kEod = 256;
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return kEod + 1; }
  int64_t eod() const override { return kEod; }
  std::string name() const override { return "ByteLevel"; }
};

}  // namespace bridge::training::tokenizers
