// The table of tokenizer types and the builder over it.
#include "training/tokenizers/build_tokenizer.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "training/tokenizers/byte_level_tokenizer.h"
#include "training/tokenizers/gpt2_bpe_tokenizer.h"
#include "training/tokenizers/huggingface_tokenizer.h"
#include "training/tokenizers/null_tokenizer.h"
#include "training/tokenizers/sentencepiece_tokenizer.h"
#include "utils/closest_match.h"

namespace bridge::training::tokenizers {
namespace {

struct Row {
  TokenizerType type;
  std::function<std::unique_ptr<Tokenizer>(const TokenizerConfig&)> make;
};

std::unique_ptr<Tokenizer> sentencepiece(const TokenizerConfig& config) {
  return std::make_unique<SentencePieceTokenizer>(config.tokenizer_model, config.tokenizer_type);
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {{"ByteLevel", "each UTF-8 byte one id, EOD 256, vocab 257; needs no files", {}},
       [](const TokenizerConfig&) { return std::make_unique<ByteLevelTokenizer>(); }},
      {{"GPT2BPETokenizer", "GPT-2's byte-level BPE from vocab.json and merges.txt", {"vocab_file", "merge_file"}},
       [](const TokenizerConfig& c) { return std::make_unique<GPT2BPETokenizer>(c.vocab_file, c.merge_file); }},
      {{"HuggingFaceTokenizer",
        "a Hugging Face tokenizer.json (Llama-3, Qwen, Mistral, ...): a model directory or the file; BOS as the file's "
        "post-processor adds it, EOD = eos_token",
        {"tokenizer_model"}},
       [](const TokenizerConfig& c) { return std::make_unique<HuggingFaceTokenizer>(c.tokenizer_model); }},
      {{"SentencePieceTokenizer", "a SentencePiece tokenizer.model; EOD = its eos id", {"tokenizer_model"}},
       sentencepiece},
      {{"GPTSentencePieceTokenizer",
        "the same as SentencePieceTokenizer (one class in Megatron-Core)",
        {"tokenizer_model"}},
       sentencepiece},
      {{"Llama2Tokenizer",
        "the same as SentencePieceTokenizer (one class in Megatron-Core): no BOS is added",
        {"tokenizer_model"}},
       sentencepiece},
      {{"NullTokenizer",
        "the text holds space-separated ids; EOD = vocab_size - 1 unless null_tokenizer_eod_id",
        {"vocab_size"}},
       [](const TokenizerConfig& c) {
         return std::make_unique<NullTokenizer>(*c.vocab_size, c.null_tokenizer_eod_id);
       }},
  };
  return table;
}

// "tokenizer_model" as the user writes it: a flag (--tokenizer-model) or a config key (tokenizer.tokenizer_model).
std::string spelled(const std::string& prefix, std::string field) {
  if (prefix == "--") std::replace(field.begin(), field.end(), '_', '-');
  return prefix + field;
}

const Row& find_row(const std::string& name, const std::string& prefix) {
  for (const Row& row : rows()) {
    if (row.type.name == name) return row;
  }
  std::vector<std::string_view> names;
  std::string listed;
  for (const Row& row : rows()) {
    names.push_back(row.type.name);
    listed += (listed.empty() ? "" : ", ") + row.type.name;
  }
  std::string message =
      spelled(prefix, "tokenizer_type") + ": unknown tokenizer type \"" + name + "\"; expected one of " + listed;
  if (const auto guess = bridge::utils::closest_match(name, names)) message += " (did you mean " + *guess + "?)";
  throw std::invalid_argument(message);
}

bool given(const TokenizerConfig& config, const std::string& field) {
  if (field == "tokenizer_model") return !config.tokenizer_model.empty();
  if (field == "vocab_file") return !config.vocab_file.empty();
  if (field == "merge_file") return !config.merge_file.empty();
  if (field == "vocab_size") return config.vocab_size.has_value();
  return false;
}

}  // namespace

const std::vector<TokenizerType>& tokenizer_types() {
  static const std::vector<TokenizerType> types = [] {
    std::vector<TokenizerType> result;
    for (const Row& row : rows()) result.push_back(row.type);
    return result;
  }();
  return types;
}

void validate_tokenizer_config(const TokenizerConfig& config, const std::string& prefix) {
  const Row& row = find_row(config.tokenizer_type, prefix);
  for (const std::string& field : row.type.needs) {
    if (!given(config, field)) {
      throw std::invalid_argument("tokenizer " + row.type.name + " needs " + spelled(prefix, field) + " (" +
                                  row.type.description + ")");
    }
  }
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerConfig& config) {
  validate_tokenizer_config(config);
  return find_row(config.tokenizer_type, "").make(config);
}

}  // namespace bridge::training::tokenizers
