// A SentencePiece model (tokenizer.model) through Google's own library (libsentencepiece): Megatron's
// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer, which Megatron-Core now builds as one class
// with the same behaviour: ids as SentencePieceProcessor::EncodeAsIds gives them (no BOS or EOS added), EOD = the
// model's eos id, the vocabulary = the model's pieces.
//
// Where the model keeps words apart, the ids of a text are those of its words one by one, and each word is encoded once
// and its ids cached (WordCache), as the BPE paths do: Debian's libsentencepiece 0.1.97 builds a protobuf for every
// call, which made a text encoded whole half the Python package's speed. Two kinds of model keep words apart (checked
// from the model's protobuf and pieces): spm_train's defaults, whose normalizer folds whitespace runs into one "▁"
// and adds the dummy prefix, with no piece holding "▁" past its first character ("a  b" encodes as "a" then "b"), and
// Llama-2's, whose identity rule keeps every space as a "▁", with no piece holding "▁" after something else ("a  b"
// encodes as "a" then " b"). Other models, and texts holding "▁" themselves, encode whole.
//
//   SentencePieceTokenizer tokenizer("llama2/tokenizer.model");
//   std::vector<int64_t> ids = tokenizer.encode("Hello world");
#pragma once

#include <array>
#include <atomic>
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
  /// How a model's texts split into words that encode apart (sentencepiece_tokenizer.cpp's word_rule): not at all,
  /// at whitespace runs that fold into one "▁" (spm_train's defaults), at spaces kept one "▁" each (Llama-2's).
  enum class Words { kWhole, kFolded, kKept };
  Words words() const { return words_; }
  /// Whether texts are encoded word by word through the cache (above), or whole.
  bool encodes_words_separately() const { return words_ != Words::kWhole; }
  /// Calls into the library so far (each costs 0.1.97 a protobuf): a text's missing words take one.
  int64_t library_calls() const { return library_calls_.load(std::memory_order_relaxed); }

 private:
  // A text's words missing from the cache: their keys joined by spaces, where each begins in `joined` and where its
  // ids go in the text's.
  struct Missing {
    std::string joined;
    std::vector<std::string_view> keys;
    std::vector<std::size_t> begins, at;
    void add(std::string_view key, std::size_t ids_at);
  };
  void encode_whole(std::string_view text, std::vector<int32_t>& ids) const;
  std::vector<std::vector<int32_t>> split_missing(const Missing& missing) const;

  std::string model_file_, type_name_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int64_t vocab_size_ = 0;
  Words words_ = Words::kWhole;
  std::array<bool, 256> is_word_start_{};  // by byte: whether a word may start with it
  WordCache cache_;
  mutable std::atomic<int64_t> library_calls_{0};
};

}  // namespace bridge::training::tokenizers
