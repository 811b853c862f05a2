// GPT-2 BPE: pre-tokenization, byte mapping, ranked merges.
#include "training/tokenizers/gpt2_bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
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
  if (!in) throw std::invalid_argument("GPT2BPETokenizer: cannot open the " + std::string(what) + " file " + path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// vocab.json's token -> id object, read as nlohmann parses it (its SAX interface) rather than through the document
// a parse builds (a node per token, copied once more into the encoder): the load of a 16k vocabulary went from 30 to
// 22 ms, serial time before any worker starts.
// A repeated token keeps its last id, as a parse (and Python's json) does.
class VocabReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  static constexpr const char* kNotAnObject =
      "must be a non-empty JSON object of token -> id (GPT-2's encoder.json / vocab.json)";

  std::unordered_map<std::string, int64_t> ids;
  std::string error;  // what is wrong, when a callback stopped the parse

  bool start_object(std::size_t /*elements*/) override {
    if (depth_ != 0) return not_an_id();
    ++depth_;
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool key(string_t& token) override {
    token_ = std::move(token);
    return true;
  }
  bool number_integer(number_integer_t id) override { return depth_ == 1 ? add(id) : not_an_object(); }
  bool number_unsigned(number_unsigned_t id) override {
    if (id > static_cast<number_unsigned_t>(std::numeric_limits<int64_t>::max())) {
      return fail("token \"" + token_ + "\" has id " + std::to_string(id) + ", past any vocabulary's size");
    }
    return number_integer(static_cast<int64_t>(id));
  }
  bool null() override { return not_an_id(); }
  bool boolean(bool /*value*/) override { return not_an_id(); }
  bool number_float(number_float_t /*value*/, const string_t& /*text*/) override { return not_an_id(); }
  bool string(string_t& /*value*/) override { return not_an_id(); }
  bool binary(binary_t& /*value*/) override { return not_an_id(); }
  bool start_array(std::size_t /*elements*/) override { return not_an_id(); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& e) override {
    error = std::string("not valid JSON: ") + e.what();
    return false;
  }

 private:
  bool add(int64_t id) {
    ids.insert_or_assign(std::move(token_), id);
    return true;
  }
  bool not_an_id() {
    return depth_ == 1 ? fail("the id of token \"" + token_ + "\" is not an integer") : not_an_object();
  }
  bool not_an_object() { return fail(kNotAnObject); }
  bool fail(std::string what) {
    error = std::move(what);
    return false;
  }

  int depth_ = 0;
  std::string token_;
};

// One merges.txt line's whitespace-separated fields.
std::vector<std::string_view> fields_of(std::string_view line) {
  constexpr std::string_view kSpace = " \t\r\v\f";
  std::vector<std::string_view> fields;
  for (std::size_t at = line.find_first_not_of(kSpace); at != std::string_view::npos;) {
    const std::size_t end = std::min(line.find_first_of(kSpace, at), line.size());
    fields.push_back(line.substr(at, end - at));
    at = line.find_first_not_of(kSpace, end);
  }
  return fields;
}

}  // namespace

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_json_path, const std::string& merges_path)
    : vocab_json_path_(vocab_json_path) {
  VocabReader vocab;
  if (!nlohmann::json::sax_parse(read_file(vocab_json_path, "vocab"), &vocab) || vocab.ids.empty()) {
    if (vocab.error.empty()) vocab.error = VocabReader::kNotAnObject;
    throw std::invalid_argument("GPT2BPETokenizer: " + vocab_json_path + ": " + vocab.error);
  }
  std::unordered_map<std::string, int32_t> encoder;
  encoder.reserve(vocab.ids.size());
  decoder_.assign(vocab.ids.size(), std::string());
  std::vector<bool> seen(vocab.ids.size(), false);
  for (auto& [token, id] : vocab.ids) {
    if (id < 0 || id >= static_cast<int64_t>(vocab.ids.size()) || seen[static_cast<std::size_t>(id)]) {
      throw std::invalid_argument("GPT2BPETokenizer: " + vocab_json_path + ": token \"" + token + "\" has id " +
                                  std::to_string(id) + ", but ids must be distinct and in [0, " +
                                  std::to_string(vocab.ids.size()) + ")");
    }
    seen[static_cast<std::size_t>(id)] = true;
    decoder_[static_cast<std::size_t>(id)] = token;
    encoder.emplace(token, static_cast<int32_t>(id));
  }
  const auto eod = encoder.find(std::string(kEndOfText));
  if (eod == encoder.end()) {
    throw std::invalid_argument("GPT2BPETokenizer: " + vocab_json_path +
                                " has no \"<|endoftext|>\" token, which ends " + "every document");
  }
  eod_ = eod->second;

  std::vector<std::pair<std::string, std::string>> merges;
  const std::string merges_text = read_file(merges_path, "merges");
  int64_t line_number = 0;
  for (std::size_t at = 0; at < merges_text.size();) {
    const std::size_t end = std::min(merges_text.find('\n', at), merges_text.size());
    std::string_view line(merges_text.data() + at, end - at);
    at = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.substr(0, 8) == "#version")) continue;
    const std::vector<std::string_view> fields = fields_of(line);
    if (fields.size() != 2) {
      throw std::invalid_argument("GPT2BPETokenizer: " + merges_path + ":" + std::to_string(line_number) +
                                  ": expected two space-separated symbols (a merge \"first second\"), got \"" +
                                  std::string(line) + "\"");
    }
    // The rank is the merge's position; a repeated pair takes its last position, as dict(zip(merges, range(n))) in
    // GPT-2's encoder.py does (and BpeModel).
    merges.emplace_back(fields[0], fields[1]);
  }
  // Every byte's character must be a token, or some text would have no ids.
  for (int b = 0; b < 256; ++b) {
    const std::string& character = hf::byte_level_char(static_cast<unsigned char>(b));
    if (encoder.find(character) == encoder.end()) {
      throw std::invalid_argument("GPT2BPETokenizer: " + vocab_json_path + " has no token for byte " +
                                  std::to_string(b) + " (\"" + character +
                                  "\"); a byte-level BPE vocabulary holds all 256");
    }
  }
  try {
    model_ = std::make_unique<BpeModel>(std::move(encoder), merges, BpeOptions{}, merges_path);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("GPT2BPETokenizer: ") + e.what());
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
