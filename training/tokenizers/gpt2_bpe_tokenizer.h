// GPT-2's byte-level BPE read from its vocab.json and merges.txt (Megatron's GPT2BPETokenizer), exact to OpenAI's
// encoder.py: GPT-2's pre-tokenization scanned by hand over Unicode 14 classes, then ranked merges.
//
//   GPT2BPETokenizer gpt2("vocab.json", "merges.txt");
//   std::vector<int64_t> ids = gpt2.encode("Hello world");  // {15496, 995} with the released GPT-2 files
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "training/tokenizers/tokenizer.h"

namespace bridge::training::tokenizers {

class BpeModel;

/// GPT-2's byte-level BPE (OpenAI's encoder.py, as Megatron's GPT2BPETokenizer uses it): the text is split with
/// GPT-2's pre-tokenization pattern (contractions, letter runs, number runs, other symbols, whitespace, each word
/// keeping one leading space), each piece's UTF-8 bytes are mapped to printable characters, and merges are applied
/// lowest rank first. EOD is the vocabulary's "<|endoftext|>" (50256 in the released files).
class GPT2BPETokenizer : public Tokenizer {
 public:
  /// Reads the vocabulary (a JSON object token -> id) and the merges (one "a b" pair per line, optionally after a
  /// "#version" line). Throws std::invalid_argument naming the file and line of anything missing or malformed (a bad
  /// tokenizer file is bad input, as for the other tokenizers: exit 2 in bridge-preprocess-data).
  GPT2BPETokenizer(const std::string& vocab_json_path, const std::string& merges_path);
  ~GPT2BPETokenizer() override;
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  /// Number of vocabulary entries (50257 for GPT-2).
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  int64_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer(" + vocab_json_path_ + ")"; }

 private:
  std::string vocab_json_path_;
  std::vector<std::string> decoder_;  ///< id -> token (byte-mapped characters)
  std::unique_ptr<BpeModel> model_;   ///< the merges, applied as tokenizers' BPE applies them
  int64_t eod_ = -1;
};

}  // namespace bridge::training::tokenizers
