// libFuzzer target: the tokenizers. Any bytes: the byte-level tokenizer gives them back exactly; GPT-2 refuses text
// that is not UTF-8 with std::invalid_argument and otherwise gives ids inside its vocabulary that decode to the text.
// Two tokenizer.json pipelines (a byte-level BPE with Llama-3's split pattern, NFKC and added tokens that strip
// whitespace; a byte-fallback BPE with Metaspace) refuse what is not UTF-8 and give ids inside their vocabularies
// whose decoding is UTF-8. The same bytes read as ids must decode or be refused, never crash. The GPT-2 vocabulary is
// the 256 byte characters plus a few merges (as tests/unit/tokenizer_test.cpp builds it).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "training/tokenizers/byte_level_tokenizer.h"
#include "training/tokenizers/gpt2_bpe_tokenizer.h"
#include "training/tokenizers/huggingface_tokenizer.h"
#include "training/tokenizers/utf8.h"

namespace {

using bridge::training::tokenizers::ByteLevelTokenizer;
using bridge::training::tokenizers::GPT2BPETokenizer;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the others for U+0100 onwards; as a
// JSON string (UTF-8, with '"' and '\' escaped).
std::string byte_character(int b) {
  static const std::vector<int> codes = [] {
    std::vector<int> result(256);
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      result[static_cast<std::size_t>(c)] = printable ? c : next++;
    }
    return result;
  }();
  const int code = codes[static_cast<std::size_t>(b)];
  std::string out;
  if (code < 0x80) {
    if (code == '"' || code == '\\') out += '\\';
    out += static_cast<char>(code);
  } else {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

const GPT2BPETokenizer& gpt2() {
  static const std::unique_ptr<GPT2BPETokenizer> tokenizer = [] {
    std::string vocab = "{";
    for (int b = 0; b < 256; ++b) vocab += "\"" + byte_character(b) + "\": " + std::to_string(b) + ", ";
    vocab +=
        "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"Ġw\": 260, \"or\": 261, \"Ġwor\": 262, "
        "\"Ġworl\": 263, \"Ġworld\": 264, \"'s\": 265, \"12\": 266, \"<|endoftext|>\": 267}";
    const auto dir = bridge::fuzz::scratch_dir();
    bridge::fuzz::write_file(dir / "vocab.json", vocab);
    bridge::fuzz::write_file(dir / "merges.txt",
                             "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ w\no r\nĠw or\nĠwor l\nĠworl d\n' s\n1 2\n");
    return std::make_unique<GPT2BPETokenizer>((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }();
  return *tokenizer;
}

// A tokenizer.json: `model` is the BPE model's JSON, the rest the pipeline.
const bridge::training::tokenizers::HuggingFaceTokenizer& hf(const std::string& name, const std::string& json) {
  const auto dir = bridge::fuzz::scratch_dir() / name;
  std::filesystem::create_directories(dir);
  bridge::fuzz::write_file(dir / "tokenizer.json", json);
  static std::vector<std::unique_ptr<bridge::training::tokenizers::HuggingFaceTokenizer>> keep;
  keep.push_back(std::make_unique<bridge::training::tokenizers::HuggingFaceTokenizer>(dir.string()));
  return *keep.back();
}

const bridge::training::tokenizers::HuggingFaceTokenizer& byte_level_bpe() {
  static const auto& tokenizer = []() -> const bridge::training::tokenizers::HuggingFaceTokenizer& {
    std::string vocab = "{";
    for (int b = 0; b < 256; ++b) vocab += "\"" + byte_character(b) + "\": " + std::to_string(b) + ", ";
    vocab += R"("he": 256, "ll": 257, "hell": 258, "hello": 259, "Ġw": 260, "or": 261, "Ġwor": 262})";
    return hf("byte_level",
              R"({"version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 263, "content": "<|s|>", "single_word": false, "lstrip": false, "rstrip": false,
                        "normalized": false, "special": true}],
      "normalizer": {"type": "NFKC"},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
      "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|s|>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<|s|>": {"id": "<|s|>",
        "ids": [263], "tokens": ["<|s|>"]}}},
      "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
      "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true, "vocab": )" +
                  vocab + R"(, "merges": [["h", "e"], ["l", "l"], ["he", "ll"], ["hell", "o"], ["Ġ", "w"], ["o", "r"],
        ["Ġw", "or"]]}})");
  }();
  return tokenizer;
}

const bridge::training::tokenizers::HuggingFaceTokenizer& byte_fallback_bpe() {
  static const auto& tokenizer = []() -> const bridge::training::tokenizers::HuggingFaceTokenizer& {
    std::string vocab = R"({"<unk>": 0, "<s>": 1, "</s>": 2)";
    char name[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab += ", \"" + std::string(name) + "\": " + std::to_string(3 + b);
    }
    vocab += R"(, "▁": 259, "a": 260, "b": 261, "▁a": 262, "ab": 263, "▁ab": 264})";
    return hf("byte_fallback", R"({"version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false,
                        "normalized": false, "special": true},
                       {"id": 265, "content": "<m>", "single_word": false, "lstrip": true, "rstrip": true,
                        "normalized": false, "special": true}],
      "normalizer": null,
      "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
      "post_processor": null,
      "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": )" +
                                   vocab + R"(, "merges": [["▁", "a"], ["a", "b"], ["▁a", "b"]]}})");
  }();
  return tokenizer;
}

void check_hf(const bridge::training::tokenizers::HuggingFaceTokenizer& tokenizer, const std::string& text) {
  try {
    const std::vector<int64_t> ids = tokenizer.encode(text);
    for (const int64_t id : ids) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
    const std::string decoded = tokenizer.decode(ids);
    FUZZ_CHECK(bridge::training::tokenizers::utf8::first_invalid(decoded) == std::string_view::npos);
  } catch (const std::invalid_argument&) {  // not UTF-8
    FUZZ_CHECK(bridge::training::tokenizers::utf8::first_invalid(text) != std::string_view::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const ByteLevelTokenizer bytes;
  FUZZ_CHECK(bytes.decode(bytes.encode(text)) == text);

  const GPT2BPETokenizer& tokenizer = gpt2();
  try {
    const std::vector<int64_t> ids = tokenizer.encode(text);
    for (const int64_t id : ids) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size() && id != tokenizer.eod());
    FUZZ_CHECK(tokenizer.decode(ids) == text);
  } catch (const std::invalid_argument&) {  // not UTF-8
  }

  check_hf(byte_level_bpe(), text);
  check_hf(byte_fallback_bpe(), text);

  std::vector<int64_t> ids;
  for (std::size_t i = 0; i + 1 < size; i += 2) ids.push_back(static_cast<int16_t>(data[i] | data[i + 1] << 8));
  for (const auto* t : {static_cast<const bridge::training::tokenizers::Tokenizer*>(&bytes),
                        static_cast<const bridge::training::tokenizers::Tokenizer*>(&tokenizer),
                        static_cast<const bridge::training::tokenizers::Tokenizer*>(&byte_level_bpe()),
                        static_cast<const bridge::training::tokenizers::Tokenizer*>(&byte_fallback_bpe())}) {
    try {
      t->decode(ids);
    } catch (const std::out_of_range&) {
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
