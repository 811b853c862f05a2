// Space-separated ids as text.
#include "training/tokenizers/null_tokenizer.h"

#include <charconv>
#include <stdexcept>

namespace bridge::training::tokenizers {

NullTokenizer::NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id)
    : vocab_size_(vocab_size), eod_(eod_id.value_or(vocab_size - 1)) {
  if (vocab_size_ < 1) {
    throw std::invalid_argument("NullTokenizer: vocab_size must be at least 1, got " + std::to_string(vocab_size_) +
                                "; give --vocab-size");
  }
  if (eod_ < 0 || eod_ >= vocab_size_) {
    throw std::invalid_argument("NullTokenizer: the eod id " + std::to_string(eod_) + " is not in [0, " +
                                std::to_string(vocab_size_) + ")");
  }
}

std::vector<int64_t> NullTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  std::size_t start = 0;
  while (true) {
    const std::size_t space = text.find(' ', start);
    std::string_view piece =
        text.substr(start, space == std::string_view::npos ? std::string_view::npos : space - start);
    // int() takes surrounding whitespace and a '+' sign.
    const auto blank = [](char c) { return c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
    while (!piece.empty() && blank(piece.front())) piece.remove_prefix(1);
    while (!piece.empty() && blank(piece.back())) piece.remove_suffix(1);
    std::string_view digits = piece;
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    int64_t id = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
    if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || id < 0 || id >= vocab_size_) {
      throw std::invalid_argument("NullTokenizer: \"" + std::string(piece) + "\" is not a token id in [0, " +
                                  std::to_string(vocab_size_) + "); its text must be ids separated by single spaces");
    }
    ids.push_back(id);
    if (space == std::string_view::npos) break;
    start = space + 1;
  }
  return ids;
}

std::string NullTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw std::out_of_range("NullTokenizer::decode: id " + std::to_string(ids[i]) + " is not in [0, " +
                              std::to_string(vocab_size_) + ")");
    }
    if (i > 0) text += ' ';
    text += std::to_string(ids[i]);
  }
  return text;
}

}  // namespace bridge::training::tokenizers
