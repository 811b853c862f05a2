// A SentencePiece model (tokenizer.model) through Google's own library (libsentencepiece): Megatron's
// SentencePieceTokenizer, GPTSentencePieceTokenizer and Llama2Tokenizer, which Megatron-Core now builds as one class
// with the same behaviour: ids as SentencePieceProcessor::EncodeAsIds gives them (no BOS or EOS added), EOD = the
// model's eos id, the vocabulary = the model's pieces.
//
//   SentencePieceTokenizer tokenizer("llama2/tokenizer.model");
//   std::vector<int64_t> ids = tokenizer.encode("Hello world");
#pragma once

#include <memory>
#include <string>

#include "training/tokenizers/tokenizer.h"

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

 private:
  std::string model_file_, type_name_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int64_t vocab_size_ = 0;
};

}  // namespace bridge::training::tokenizers
