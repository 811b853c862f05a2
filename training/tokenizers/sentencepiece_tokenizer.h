// A SentencePiece model (tokenizer.model) through Google's own library (libsentencepiece): Megatron's
// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer, which Megatron-Core now builds as one class
// with the same behaviour: ids as SentencePieceProcessor::EncodeAsIds gives them (no BOS or EOS added), EOD = the
// model's eos id, the vocabulary = the model's pieces.
//
// Where the model keeps words apart (its normalizer folds whitespace runs into one "▁" and adds the dummy prefix, and
// no piece holds "▁" past its first character, as spm_train's defaults make it), the ids of a text are those of its
// space-led words one by one: "a  b" encodes as "a" then "  b", and a word's ids are those of its text after the
// spaces ("b": the run folds into the one "▁" the dummy prefix gives). Each word is then encoded once and its ids
// cached (WordCache) under that text, as the BPE paths do; Debian's libsentencepiece 0.1.97 builds a protobuf for every
// call, which made it half the Python package's speed. Other models (Llama-2's keeps whitespace runs as pieces) encode
// each text whole.
//
//   SentencePieceTokenizer tokenizer("llama2/tokenizer.model");
//   std::vector<int64_t> ids = tokenizer.encode("Hello world");
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "training/tokenizers/tokenizer.h"
#include "training/tokenizers/word_cache.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace bridge::training::tokenizers {

class SentencePieceTokenizer : public Tokenizer {
 public:
  /// Loads `model_file`; throws std::invalid_argument with the library's message when it cannot.
  explicit SentencePieceTokenizer(const std::string& model_file, std::string type_name = "SentencePieceTokenizer");
  ~SentencePieceTokenizer() override;

  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  /// The model's eos id; throws std::logic_error when the model was trained without one (eos_id = -1).
  int64_t eod() const override;
  std::optional<int64_t> bos() const override;
  std::string name() const override { return type_name_ + "(" + model_file_ + ")"; }
  /// Whether texts are encoded word by word through the cache (above), or whole.
  bool encodes_words_separately() const { return !word_starts_.empty(); }

 private:
  void encode_whole(std::string_view text, std::vector<int32_t>& ids) const;

  std::string model_file_, type_name_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int64_t vocab_size_ = 0;
  std::string word_starts_;                // the characters a word may start with; empty: texts go whole
  std::array<bool, 256> is_word_start_{};  // by byte: whether it is in word_starts_
  std::vector<bool> starts_word_;          // by id: whether the piece begins with U+2581
  WordCache cache_;
};

}  // namespace bridge::training::tokenizers
