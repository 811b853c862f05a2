// A Hugging Face tokenizer.json, run by bridge (Megatron's HuggingFaceTokenizer): the files that Llama-3, Qwen,
// Mistral and most models on the hub ship, read without Python. The pipeline is the `tokenizers` library's: added
// tokens found first, then the normalizer, the pre-tokenizer, the BPE model and, for Megatron's tokenize, the
// post-processor's special tokens (Llama's BOS); decoding runs the file's decoder. What bridge implements is listed
// in docs/tokenizers.md; anything else in a file is refused with its JSON path, never approximated.
//
//   HuggingFaceTokenizer tokenizer("checkpoints/llama3");   // a directory with tokenizer.json, or the file itself
//   std::vector<int64_t> ids = tokenizer.encode("Hello");    // {<|begin_of_text|>, "Hello"}: as
//   tokenizer(text).input_ids tokenizer.eod();                                         // the eos_token of
//   tokenizer_config.json
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "training/tokenizers/tokenizer.h"

namespace bridge::training::tokenizers {

class BpeModel;
class AddedVocabulary;
struct AddedToken;
namespace hf {
class Normalizer;
class PreTokenizer;
class PostProcessor;
class Decoder;
}  // namespace hf

class HuggingFaceTokenizer : public Tokenizer {
 public:
  /// `path`: a directory holding tokenizer.json (and optionally tokenizer_config.json / special_tokens_map.json,
  /// which name the BOS and EOS tokens), or a tokenizer.json file whose directory may hold those. Throws
  /// std::invalid_argument naming the file and the JSON path of anything malformed or not implemented.
  explicit HuggingFaceTokenizer(const std::string& path);
  ~HuggingFaceTokenizer() override;

  /// Megatron's tokenize: the ids with the post-processor's special tokens (add_special_tokens=True).
  std::vector<int64_t> encode(std::string_view text) const override { return encode(text, true); }
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const;
  /// The file's decoder over the tokens of `ids`, special tokens included (transformers' decode default).
  std::string decode(const std::vector<int64_t>& ids) const override;
  /// The model's vocabulary and the added tokens outside it (len(tokenizer) in transformers).
  int64_t vocab_size() const override { return vocab_size_; }
  /// The EOS token's id; throws std::logic_error when the directory names no eos_token.
  int64_t eod() const override;
  std::optional<int64_t> bos() const override { return bos_; }
  std::optional<int64_t> eos() const { return eos_; }
  std::string name() const override { return "HuggingFaceTokenizer(" + path_ + ")"; }

 private:
  std::vector<AddedToken> settle_added_tokens(std::vector<AddedToken> tokens) const;

  std::string path_;
  std::unique_ptr<AddedVocabulary> added_;
  std::unique_ptr<hf::Normalizer> normalizer_;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<hf::PostProcessor> post_processor_;
  std::unique_ptr<hf::Decoder> decoder_;
  int64_t vocab_size_ = 0;
  std::optional<int64_t> bos_, eos_;
};

}  // namespace bridge::training::tokenizers
