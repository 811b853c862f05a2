// The stages of a Hugging Face tokenizer.json pipeline (normalizer, pre-tokenizer, post-processor, decoder) as
// bridge implements them, each built from its JSON object. Internal to training/tokenizers: the public face is
// HuggingFaceTokenizer (huggingface_tokenizer.h).
//
// Every builder takes the object and its JSON path ("pre_tokenizer.pretokenizers[1]") and throws
// std::invalid_argument naming that path for a type or an option bridge does not implement, never approximating.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "training/tokenizers/regex.h"

namespace bridge::training::tokenizers::hf {

/// A piece of text on its way through the pipeline; `at_start` is true when it begins at the start of the text that
/// was encoded (Metaspace's prepend_scheme "first" prepends only there).
struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Replaces `pieces` by their pre-tokenized pieces, in order; empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// The ids of a single sequence with the processor's special tokens added (add_special_tokens=True).
  virtual std::vector<int64_t> process(std::vector<int64_t> ids) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// tokenizers' decode_chain: the tokens, transformed (their number may change).
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& object, const std::string& path);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& object, const std::string& path);
std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& object, const std::string& path);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& object, const std::string& path);

// Shared by the builders: typed field access with errors that name the JSON path.
std::invalid_argument unsupported(const std::string& path, const std::string& what);
const nlohmann::json& field(const nlohmann::json& object, const std::string& path, const char* name);
std::string string_field(const nlohmann::json& object, const std::string& path, const char* name);
bool bool_field(const nlohmann::json& object, const std::string& path, const char* name, bool fallback);
/// The "type" of a pipeline object (whose JSON must be an object).
std::string type_of(const nlohmann::json& object, const std::string& path);
/// Refuses keys outside `known`, so that an option bridge does not implement is an error, not silently ignored.
void only_keys(const nlohmann::json& object, const std::string& path, std::initializer_list<const char*> known);

/// A {"String": s} or {"Regex": r} pattern (of Split, Replace), compiled; a String matches literally.
std::unique_ptr<Regex> make_pattern(const nlohmann::json& pattern, const std::string& path);
/// Replaces each match of `pattern` in `text` by `content`.
void replace_all(const Regex& pattern, const std::string& content, std::string& text);

/// GPT-2's byte-to-character table (tokenizers' bytes_char): printable Latin-1 bytes map to themselves, the other 68
/// to U+0100 onwards. byte_level_char(b) is the UTF-8 of byte b's character.
const std::string& byte_level_char(unsigned char b);
/// The byte of a byte-level character, or -1 for a character outside the table.
int byte_level_byte(char32_t c);

}  // namespace bridge::training::tokenizers::hf
