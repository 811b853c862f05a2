// Megatron's NullTokenizer: the text already holds the ids, separated by single spaces ("12 7 301"), for data made
// elsewhere and for mock runs; EOD is vocab_size - 1 unless given.
//
//   NullTokenizer null(32000);           // eod() == 31999
//   null.encode("5 17 4");               // {5, 17, 4}
#pragma once

#include <optional>

#include "training/tokenizers/tokenizer.h"

namespace bridge::training::tokenizers {

class NullTokenizer : public Tokenizer {
 public:
  /// Throws std::invalid_argument unless vocab_size >= 1 and the eod id is in [0, vocab_size).
  explicit NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id = std::nullopt);
  /// Python's [int(x) for x in text.split(' ')]: each piece an integer (surrounding whitespace allowed) in
  /// [0, vocab_size); anything else throws std::invalid_argument naming the piece.
  std::vector<int64_t> encode(std::string_view text) const override;
  /// The ids, space-separated.
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  std::string name() const override { return "NullTokenizer(" + std::to_string(vocab_size_) + ")"; }

 private:
  int64_t vocab_size_, eod_;
};

}  // namespace bridge::training::tokenizers
