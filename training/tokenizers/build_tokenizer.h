// The tokenizer a config names, by Megatron's --tokenizer-type names and Megatron-Bridge's TokenizerConfig fields
// (training/tokenizers/config.py), from one table of types: what each needs and how it is built.
//
//   TokenizerConfig config;
//   config.tokenizer_type = "HuggingFaceTokenizer";
//   config.tokenizer_model = "checkpoints/llama3";  // a directory with tokenizer.json
//   std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(config);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "training/tokenizers/tokenizer.h"

namespace bridge::training::tokenizers {

struct TokenizerConfig {
  /// ByteLevel (bridge's own: bytes as ids, no files), GPT2BPETokenizer, HuggingFaceTokenizer,
  /// SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer or NullTokenizer. Empty (null in YAML):
  /// none, where that is allowed (a training run then reads token ids as they are).
  std::string tokenizer_type;
  /// HuggingFaceTokenizer: a directory with tokenizer.json, or the file; the SentencePiece types: tokenizer.model.
  std::string tokenizer_model;
  std::string vocab_file;                        ///< GPT2BPETokenizer: vocab.json
  std::string merge_file;                        ///< GPT2BPETokenizer: merges.txt
  std::optional<int64_t> vocab_size;             ///< NullTokenizer: the number of ids
  std::optional<int64_t> null_tokenizer_eod_id;  ///< NullTokenizer: the EOD id (vocab_size - 1 when unset)
  /// Training runs only (Megatron-Bridge's field): whether the model's vocabulary is the tokenizer's. Null: yes for
  /// a model trained from scratch whose model.vocab_size is smaller; with a pretrained checkpoint, no.
  /// See training/tokenizer_setup.h.
  std::optional<bool> use_tokenizer_vocab_size;
};

/// A config naming `type` and nothing else: enough for ByteLevel, the rest filled in by the caller.
inline TokenizerConfig tokenizer_config_of(std::string type) {
  TokenizerConfig config;
  config.tokenizer_type = std::move(type);
  return config;
}

/// One row of the table: a type, what it is, and the TokenizerConfig fields it needs.
struct TokenizerType {
  std::string name;
  std::string description;
  std::vector<std::string> needs;  ///< field names, e.g. {"tokenizer_model"}
};
const std::vector<TokenizerType>& tokenizer_types();

/// Checks that `config` names a known type and gives what it needs, without reading any file. Throws
/// std::invalid_argument naming the field (with `prefix`, e.g. "--" for command-line flags or "tokenizer." for
/// config keys) and the fix; suggests the closest type name for a typo.
void validate_tokenizer_config(const TokenizerConfig& config, const std::string& prefix = "");

/// The names of the fields besides tokenizer_type that `config` sets (tokenizer_model, vocab_file, merge_file,
/// vocab_size, null_tokenizer_eod_id): a config without a type must set none.
std::vector<std::string> given_tokenizer_fields(const TokenizerConfig& config);

/// The tokenizer `config` describes (validated first). Throws std::invalid_argument for a bad config or files.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerConfig& config);

/// build_tokenizer's tokenizer, loaded once per process for the same config and the same files: bridge-pretrain's
/// config resolution, pretrain() and the TextGenerator each ask for the run's tokenizer, and a Llama-3 tokenizer.json
/// takes about a second to load. A file changed since (its size, modification time or inode; for a directory, those
/// of each file in it) is loaded anew. The last few tokenizers stay cached for the life of the process.
std::shared_ptr<const Tokenizer> shared_tokenizer(const TokenizerConfig& config);

}  // namespace bridge::training::tokenizers
