// The table of tokenizer types and the builder over it.
#include "training/tokenizers/build_tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <utility>

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
  /// Names users type for this type (compared without case, '-', '_' or spaces); an unknown type that is one of
  /// them suggests this type, where spelling distance alone points elsewhere ("HFTokenizer" is nearer NullTokenizer).
  std::vector<std::string> aliases = {};
};

std::unique_ptr<Tokenizer> sentencepiece(const TokenizerConfig& config) {
  return std::make_unique<SentencePieceTokenizer>(config.tokenizer_model, config.tokenizer_type);
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {{"ByteLevel", "each UTF-8 byte one id, EOD 256, vocab 257; needs no files", {}},
       [](const TokenizerConfig&) { return std::make_unique<ByteLevelTokenizer>(); },
       {"bytes", "byte", "ByteLevelTokenizer", "ByteTokenizer"}},
      {{"GPT2BPETokenizer", "GPT-2's byte-level BPE from vocab.json and merges.txt", {"vocab_file", "merge_file"}},
       [](const TokenizerConfig& c) { return std::make_unique<GPT2BPETokenizer>(c.vocab_file, c.merge_file); },
       {"GPT2", "GPT2Tokenizer", "GPT2BPE", "GPTBPETokenizer"}},
      {{"HuggingFaceTokenizer",
        "a Hugging Face tokenizer.json (Llama-3, Qwen, Mistral, ...): a model directory or the file; BOS as the file's "
        "post-processor adds it, EOD = eos_token",
        {"tokenizer_model"}},
       [](const TokenizerConfig& c) { return std::make_unique<HuggingFaceTokenizer>(c.tokenizer_model); },
       {"HFTokenizer", "HuggingFace", "HF", "AutoTokenizer", "HFAutoTokenizer", "PreTrainedTokenizerFast",
        "TokenizersBackend", "tokenizer.json", "transformers", "tokenizers"}},
      {{"SentencePieceTokenizer", "a SentencePiece tokenizer.model; EOD = its eos id", {"tokenizer_model"}},
       sentencepiece,
       {"SentencePiece", "spm", "tokenizer.model"}},
      {{"GPTSentencePieceTokenizer",
        "the same as SentencePieceTokenizer (one class in Megatron-Core)",
        {"tokenizer_model"}},
       sentencepiece},
      {{"Llama2Tokenizer",
        "the same as SentencePieceTokenizer (one class in Megatron-Core): no BOS is added",
        {"tokenizer_model"}},
       sentencepiece,
       {"LlamaTokenizer", "Llama2"}},
      {{"NullTokenizer",
        "the text holds space-separated ids; EOD = vocab_size - 1 unless null_tokenizer_eod_id",
        {"vocab_size"}},
       [](const TokenizerConfig& c) { return std::make_unique<NullTokenizer>(*c.vocab_size, c.null_tokenizer_eod_id); },
       {"Null", "ids"}},
  };
  return table;
}

// "tokenizer_model" as the user writes it: a flag (--tokenizer-model) or a config key (tokenizer.tokenizer_model).
std::string spelled(const std::string& prefix, std::string field) {
  if (prefix == "--") std::replace(field.begin(), field.end(), '_', '-');
  return prefix + field;
}

// A name as compared with the aliases: lower case, without '-', '_' or spaces.
std::string folded(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (c != '-' && c != '_' && c != ' ') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// The type an unknown name most likely means: one spelt so but for case and separators, one it is an alias of,
// else the nearest by spelling.
std::optional<std::string> suggestion(const std::string& name, const std::vector<std::string_view>& names) {
  for (const Row& row : rows()) {
    if (folded(row.type.name) == folded(name)) return row.type.name;
    for (const std::string& alias : row.aliases) {
      if (folded(alias) == folded(name)) return row.type.name;
    }
  }
  return bridge::utils::closest_match(name, names);
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
  if (const auto guess = suggestion(name, names)) message += " (did you mean " + *guess + "?)";
  throw std::invalid_argument(message);
}

// The fields a type may need, by name, and whether a config gives each.
const std::vector<std::pair<std::string, bool (*)(const TokenizerConfig&)>>& fields() {
  static const std::vector<std::pair<std::string, bool (*)(const TokenizerConfig&)>> table = {
      {"tokenizer_model", [](const TokenizerConfig& c) { return !c.tokenizer_model.empty(); }},
      {"vocab_file", [](const TokenizerConfig& c) { return !c.vocab_file.empty(); }},
      {"merge_file", [](const TokenizerConfig& c) { return !c.merge_file.empty(); }},
      {"vocab_size", [](const TokenizerConfig& c) { return c.vocab_size.has_value(); }},
      {"null_tokenizer_eod_id", [](const TokenizerConfig& c) { return c.null_tokenizer_eod_id.has_value(); }},
  };
  return table;
}

bool given(const TokenizerConfig& config, const std::string& field) {
  for (const auto& [name, is_given] : fields()) {
    if (name == field) return is_given(config);
  }
  return false;
}

}  // namespace

std::vector<std::string> given_tokenizer_fields(const TokenizerConfig& config) {
  std::vector<std::string> names;
  for (const auto& [name, is_given] : fields()) {
    if (is_given(config)) names.push_back(name);
  }
  return names;
}

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

namespace {

// What identifies a file's contents without reading it: size, modification time (ns) and inode; for a directory the
// same of each regular file in it. With `siblings`, a file counts with its directory's files (a tokenizer.json named
// alone is read with tokenizer_config.json and special_tokens_map.json beside it).
std::string fingerprint(const std::string& path, bool siblings = false) {
  if (path.empty()) return "-";
  const auto stat_of = [](const std::string& file) {
    struct stat info {};
    if (::stat(file.c_str(), &info) != 0) return std::string("missing");
    return std::to_string(info.st_size) + "/" + std::to_string(info.st_mtim.tv_sec) + "." +
           std::to_string(info.st_mtim.tv_nsec) + "/" + std::to_string(info.st_ino);
  };
  std::error_code error;
  std::filesystem::path directory = path;
  if (!std::filesystem::is_directory(path, error)) {
    if (!siblings) return stat_of(path);
    directory = std::filesystem::path(path).parent_path();
    if (directory.empty()) directory = ".";
  }
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (entry.is_regular_file(error)) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  std::string print;
  for (const std::string& file : files) print += file + "=" + stat_of(file) + ";";
  return print;
}

}  // namespace

std::shared_ptr<const Tokenizer> shared_tokenizer(const TokenizerConfig& config) {
  constexpr std::size_t kKept = 4;
  static std::mutex mutex;
  static auto* cache = new std::deque<std::pair<std::string, std::shared_ptr<const Tokenizer>>>;
  const auto optional = [](const std::optional<int64_t>& value) { return value ? std::to_string(*value) : "-"; };
  const std::string key = config.tokenizer_type + "\n" + config.tokenizer_model + "\n" +
                          fingerprint(config.tokenizer_model, /*siblings=*/true) + "\n" + config.vocab_file + "\n" +
                          fingerprint(config.vocab_file) + "\n" + config.merge_file + "\n" +
                          fingerprint(config.merge_file) + "\n" + optional(config.vocab_size) + "\n" +
                          optional(config.null_tokenizer_eod_id);
  std::lock_guard<std::mutex> lock(mutex);  // one load at a time: a second asker waits for the first's result
  for (const auto& [cached_key, tokenizer] : *cache) {
    if (cached_key == key) return tokenizer;
  }
  std::shared_ptr<const Tokenizer> tokenizer = build_tokenizer(config);
  cache->emplace_back(key, tokenizer);
  if (cache->size() > kKept) cache->pop_front();
  return tokenizer;
}

}  // namespace bridge::training::tokenizers
