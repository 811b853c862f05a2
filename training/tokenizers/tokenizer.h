// The tokenizer interface that preprocessing (bridge-preprocess-data), the datasets and the TextGenerator use, as
// Megatron's MegatronTokenizer: text to ids (tokenize), ids to text (detokenize), the vocabulary size and the
// end-of-document id. build_tokenizer (build_tokenizer.h) makes one from Megatron's --tokenizer-type names.
//
//   std::unique_ptr<Tokenizer> tokenizer = build_tokenizer({.tokenizer_type = "HuggingFaceTokenizer",
//                                                           .tokenizer_model = "checkpoints/llama3"});
//   std::vector<int64_t> ids = tokenizer->encode("Hello world");
//   ids.push_back(tokenizer->eod());
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bridge::training::tokenizers {

/// Text <-> token ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// The ids of `text` (UTF-8) as Megatron's tokenize makes them (with a BOS where the tokenizer adds one). The EOD
  /// token is never appended here; preprocessing appends eod() itself.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// The text of `ids`. Throws std::out_of_range for an id the tokenizer does not have.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  /// Number of ids (the largest id plus one), special tokens included.
  virtual int64_t vocab_size() const = 0;
  /// The end-of-document id that separates documents in a token stream.
  virtual int64_t eod() const = 0;
  /// The beginning-of-sequence id, where the tokenizer has one.
  virtual std::optional<int64_t> bos() const { return std::nullopt; }
  /// What the tokenizer is, for messages: its type and file.
  virtual std::string name() const = 0;
};

}  // namespace bridge::training::tokenizers
