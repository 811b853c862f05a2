// GPT-2 BPE: pre-tokenization, byte mapping, ranked merges.
#include "training/tokenizers/gpt2_bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "training/tokenizers/bpe_model.h"
#include "training/tokenizers/hf_components.h"
#include "training/tokenizers/unicode_classes.h"
#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

// Decodes one UTF-8 character at `text[i]`, advancing i; throws on malformed input (GPT-2 works on code points).
char32_t next_code_point(std::string_view text, std::size_t& i) {
  char32_t c = 0;
  if (!utf8::next(text, i, c)) {
    throw std::invalid_argument("GPT2BPETokenizer: the text is not valid UTF-8 at byte " + std::to_string(i) +
                                "; convert the input to UTF-8");
  }
  return c;
}

enum class CharClass { kLetter, kNumber, kWhitespace, kOther };

CharClass classify(char32_t c) {
  if (is_unicode_whitespace(c)) return CharClass::kWhitespace;
  if (is_unicode_letter(c)) return CharClass::kLetter;
  if (is_unicode_number(c)) return CharClass::kNumber;
  return CharClass::kOther;
}

// GPT-2's pre-tokenization, the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// scanned by hand: the pieces of `text` as byte ranges, in order, covering all of it.
std::vector<std::string_view> pre_tokenize(std::string_view text) {
  std::vector<char32_t> chars;
  std::vector<std::size_t> starts;  // byte offset of each character, plus the end
  for (std::size_t i = 0; i < text.size();) {
    starts.push_back(i);
    chars.push_back(next_code_point(text, i));
  }
  starts.push_back(text.size());
  const std::size_t n = chars.size();
  std::vector<CharClass> classes(n);
  for (std::size_t i = 0; i < n; ++i) classes[i] = classify(chars[i]);

  const auto run_end = [&](std::size_t from, CharClass cls) {
    while (from < n && classes[from] == cls) ++from;
    return from;
  };
  const auto match_at = [&](std::size_t i) -> std::size_t {
    const char32_t c = chars[i];
    if (c == U'\'' && i + 1 < n) {
      const char32_t a = chars[i + 1];
      if (a == U's' || a == U't' || a == U'm' || a == U'd') return i + 2;
      if (i + 2 < n) {
        const char32_t b = chars[i + 2];
        if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return i + 3;
      }
    }
    // " ?X+" for letters, numbers and other symbols: a space joins the run that follows it.
    for (const CharClass cls : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
      if (c == U' ' && i + 1 < n && classes[i + 1] == cls) return run_end(i + 1, cls);
      if (classes[i] == cls) return run_end(i, cls);
    }
    // Whitespace: the run, less its last character when a non-space follows, so that character's space can lead
    // the next word; a single whitespace character before a non-space stands alone.
    const std::size_t end = run_end(i, CharClass::kWhitespace);
    if (end == n || end - i == 1) return end;
    return end - 1;
  };

  std::vector<std::string_view> pieces;
  for (std::size_t i = 0; i < n;) {
    const std::size_t end = match_at(i);
    pieces.push_back(text.substr(starts[i], starts[end] - starts[i]));
    i = end;
  }
  return pieces;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("GPT2BPETokenizer: cannot open the " + std::string(what) + " file " + path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_json_path, const std::string& merges_path)
    : vocab_json_path_(vocab_json_path) {
  std::unordered_map<std::string, int32_t> encoder;
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json_path, "vocab"));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path + " is not valid JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty()) {
    throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path +
                             " must be a non-empty JSON object of token -> id (GPT-2's encoder.json / vocab.json)");
  }
  decoder_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [token, id_value] : vocab.items()) {
    if (!id_value.is_number_integer()) {
      throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path + ": the id of token \"" + token +
                               "\" is not an integer");
    }
    const auto id = id_value.get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(vocab.size()) || seen[static_cast<std::size_t>(id)]) {
      throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path + ": token \"" + token + "\" has id " +
                               std::to_string(id) + ", but ids must be distinct and in [0, " +
                               std::to_string(vocab.size()) + ")");
    }
    seen[static_cast<std::size_t>(id)] = true;
    decoder_[static_cast<std::size_t>(id)] = token;
    encoder.emplace(token, static_cast<int32_t>(id));
  }
  const auto eod = encoder.find(std::string(kEndOfText));
  if (eod == encoder.end()) {
    throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path + " has no \"<|endoftext|>\" token, which ends " +
                             "every document");
  }
  eod_ = eod->second;

  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(read_file(merges_path, "merges"));
  std::string line;
  int64_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    std::istringstream fields(line);
    std::string first, second, extra;
    if (!(fields >> first >> second) || (fields >> extra)) {
      throw std::runtime_error("GPT2BPETokenizer: " + merges_path + ":" + std::to_string(line_number) +
                               ": expected two space-separated symbols (a merge \"first second\"), got \"" + line +
                               "\"");
    }
    // The rank is the merge's position; a repeated pair takes its last position, as dict(zip(merges, range(n))) in
    // GPT-2's encoder.py does (and BpeModel).
    merges.emplace_back(std::move(first), std::move(second));
  }
  // Every byte's character must be a token, or some text would have no ids.
  for (int b = 0; b < 256; ++b) {
    const std::string& character = hf::byte_level_char(static_cast<unsigned char>(b));
    if (encoder.find(character) == encoder.end()) {
      throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path + " has no token for byte " + std::to_string(b) +
                               " (\"" + character + "\"); a byte-level BPE vocabulary holds all 256");
    }
  }
  try {
    model_ = std::make_unique<BpeModel>(std::move(encoder), merges, BpeOptions{}, merges_path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("GPT2BPETokenizer: ") + e.what());
  }
}

GPT2BPETokenizer::~GPT2BPETokenizer() = default;

std::vector<int64_t> GPT2BPETokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  std::string word;
  for (const std::string_view piece : pre_tokenize(text)) {
    word.clear();
    for (const char byte : piece) word += hf::byte_level_char(static_cast<unsigned char>(byte));
    model_->tokenize(word, ids);
  }
  return ids;
}

std::string GPT2BPETokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("GPT2BPETokenizer::decode: id " + std::to_string(id) + " is not in [0, " +
                              std::to_string(vocab_size()) + ")");
    }
    const std::string& token = decoder_[static_cast<std::size_t>(id)];
    for (std::size_t i = 0; i < token.size();) {
      const int byte = hf::byte_level_byte(next_code_point(token, i));
      if (byte < 0) {
        throw std::runtime_error("GPT2BPETokenizer::decode: token " + std::to_string(id) + " (\"" + token +
                                 "\") holds a character outside GPT-2's byte alphabet");
      }
      text += static_cast<char>(byte);
    }
  }
  return text;
}

}  // namespace bridge::training::tokenizers
