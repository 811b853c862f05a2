// Tokenizers that turn text into the token ids stored in indexed datasets: a byte-level one needing no files, and
// GPT-2's byte-level BPE read from its vocab.json and merges.txt (Megatron's GPT2BPETokenizer).
//
//   ByteLevelTokenizer bytes;               // "hi" -> {104, 105}; eod() == 256; vocab_size() == 257
//   GPT2BPETokenizer gpt2("vocab.json", "merges.txt");
//   std::vector<int64_t> ids = gpt2.encode("Hello world");  // {15496, 995} with the released GPT-2 files
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bridge::training::datasets {

/// Text <-> token ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// The ids of `text` (UTF-8). The EOD token is never produced from text; append eod() explicitly.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// The text of `ids` (UTF-8 bytes; a partial character at the ends is kept as raw bytes). Throws
  /// std::out_of_range for an id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  /// Number of ids, EOD included.
  virtual int64_t vocab_size() const = 0;
  /// The end-of-document id that separates documents in a token stream.
  virtual int64_t eod() const = 0;
};

/// Each byte of the UTF-8 text is its own id (0..255); EOD is 256, so vocab_size() is 257. Decoding EOD gives
/// "<|endoftext|>".
class ByteLevelTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kEod = 256;
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return kEod + 1; }
  int64_t eod() const override { return kEod; }
};

/// GPT-2's byte-level BPE (OpenAI's encoder.py, as Megatron's GPT2BPETokenizer uses it): the text is split with
/// GPT-2's pre-tokenization pattern (contractions, letter runs, number runs, other symbols, whitespace, each word
/// keeping one leading space), each piece's UTF-8 bytes are mapped to printable characters, and merges are applied
/// lowest rank first. EOD is the vocabulary's "<|endoftext|>" (50256 in the released files).
class GPT2BPETokenizer : public Tokenizer {
 public:
  /// Reads the vocabulary (a JSON object token -> id) and the merges (one "a b" pair per line, optionally after a
  /// "#version" line). Throws std::runtime_error naming the file and line of anything malformed.
  GPT2BPETokenizer(const std::string& vocab_json_path, const std::string& merges_path);
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  /// Number of vocabulary entries (50257 for GPT-2).
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  int64_t eod() const override { return eod_; }

 private:
  /// The BPE pieces of one pre-tokenized word (already byte-mapped), space-free.
  std::vector<std::string> bpe(const std::string& word) const;

  std::unordered_map<std::string, int64_t> encoder_;
  std::vector<std::string> decoder_;                      ///< id -> token (byte-mapped characters)
  std::unordered_map<std::string, int64_t> merge_ranks_;  ///< "first second" -> rank (lower merges first)
  int64_t eod_ = -1;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache_;
};

/// The tokenizer named as in Megatron's --tokenizer-type: "ByteLevel" (no files) or "GPT2BPETokenizer" (needs
/// vocab_file and merge_file). Throws std::invalid_argument for another name, suggesting the closest one.
std::unique_ptr<Tokenizer> build_tokenizer(const std::string& tokenizer_type, const std::string& vocab_file = "",
                                           const std::string& merge_file = "");

}  // namespace bridge::training::datasets
