// The added tokens of a tokenizer.json (special ones like <|begin_of_text|> and any others): found in the text before
// anything else runs, never split, matched leftmost-longest as tokenizers' AddedVocabulary does, with each token's
// lstrip / rstrip (take the whitespace beside it) and single_word (only between non-word characters).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bridge::training::tokenizers {

struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  ///< matched in the normalized text instead of the raw text
  /// What is matched and what decoding gives: the content, or for a `normalized` token the content as the
  /// tokenizer's normalizer leaves it (tokenizers matches "</s>" under a Prepend("▁") normalizer as "▁</s>").
  std::string form;
};

class AddedVocabulary {
 public:
  /// A piece of the text: an added token's id, or -1 for text between tokens (`text` then holds it).
  struct Segment {
    int64_t id = -1;
    std::size_t begin = 0, end = 0;  ///< byte offsets in the text that was split
  };

  /// `tokens` with their ids and forms settled (HuggingFaceTokenizer does that as the library does).
  explicit AddedVocabulary(std::vector<AddedToken> tokens);

  /// Splits `text` at the tokens whose `normalized` flag equals `normalized`, into segments that cover it in order.
  void split(std::string_view text, bool normalized, std::vector<Segment>& segments) const;

  /// The added token with this id, or nullptr.
  const AddedToken* find(int64_t id) const;
  const AddedToken* find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  // A byte trie over one pass's token contents.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
      int32_t token = -1;                                       // index into tokens_ of the token ending here
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    bool empty = true;
    void insert(const std::string& content, int32_t token);
    // The longest token starting at text[i]: its index and length, or {-1, 0}.
    std::pair<int32_t, std::size_t> longest_at(std::string_view text, std::size_t i) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int64_t, std::size_t> by_id_;
  std::unordered_map<std::string, std::size_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace bridge::training::tokenizers
