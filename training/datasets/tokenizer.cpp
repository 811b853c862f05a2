// Byte-level and GPT-2 BPE tokenizers.
#include "training/datasets/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "training/datasets/unicode_classes.h"
#include "utils/closest_match.h"

namespace bridge::training::datasets {
namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Decodes one UTF-8 character at `text[i]`, advancing i; throws on malformed input (GPT-2 works on code points).
char32_t next_code_point(std::string_view text, std::size_t& i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  int extra = 0;
  char32_t c = 0;
  if (lead < 0x80) {
    c = lead;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    extra = 1, c = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    extra = 2, c = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    extra = 3, c = lead & 0x07;
  } else {
    extra = -1;
  }
  bool valid = extra >= 0 && i + static_cast<std::size_t>(extra) < text.size();
  for (int k = 1; valid && k <= extra; ++k) {
    const unsigned char next = byte(i + static_cast<std::size_t>(k));
    valid = (next & 0xC0) == 0x80;
    c = (c << 6) | (next & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
  if (valid &&
      ((extra == 2 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) || (extra == 3 && (c < 0x10000 || c > 0x10FFFF)))) {
    valid = false;
  }
  if (!valid) {
    throw std::invalid_argument("GPT2BPETokenizer: the text is not valid UTF-8 at byte " + std::to_string(i) +
                                "; convert the input to UTF-8");
  }
  i += static_cast<std::size_t>(extra) + 1;
  return c;
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 onwards, so
// every byte becomes a visible character and BPE never sees whitespace or control characters.
const std::array<std::string, 256>& byte_encoder() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> result;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      append_utf8(printable ? static_cast<char32_t>(b) : next++, result[static_cast<std::size_t>(b)]);
    }
    return result;
  }();
  return table;
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

std::vector<int64_t> ByteLevelTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteLevelTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < 0 || id > kEod) {
      throw std::out_of_range("ByteLevelTokenizer::decode: id " + std::to_string(id) + " is not in [0, 257)");
    }
    if (id == kEod) {
      text += kEndOfText;
    } else {
      text += static_cast<char>(static_cast<unsigned char>(id));
    }
  }
  return text;
}

GPT2BPETokenizer::GPT2BPETokenizer(const std::string& vocab_json_path, const std::string& merges_path) {
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
    encoder_.emplace(token, id);
  }
  const auto eod = encoder_.find(std::string(kEndOfText));
  if (eod == encoder_.end()) {
    throw std::runtime_error("GPT2BPETokenizer: " + vocab_json_path + " has no \"<|endoftext|>\" token, which ends " +
                             "every document");
  }
  eod_ = eod->second;

  const std::string merges = read_file(merges_path, "merges");
  std::istringstream lines(merges);
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
    // GPT-2's encoder.py does.
    merge_ranks_.insert_or_assign(first + " " + second, static_cast<int64_t>(line_number));
  }
}

std::vector<std::string> GPT2BPETokenizer::bpe(const std::string& word) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto hit = cache_.find(word);
    if (hit != cache_.end()) return hit->second;
  }
  std::vector<std::string> symbols;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t start = i;
    next_code_point(word, i);
    symbols.push_back(word.substr(start, i - start));
  }
  while (symbols.size() > 1) {
    // The adjacent pair with the lowest merge rank, merged everywhere it occurs, left to right.
    int64_t best_rank = std::numeric_limits<int64_t>::max();
    std::string best;
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto rank = merge_ranks_.find(symbols[i] + " " + symbols[i + 1]);
      if (rank != merge_ranks_.end() && rank->second < best_rank) {
        best_rank = rank->second;
        best = rank->first;
      }
    }
    if (best_rank == std::numeric_limits<int64_t>::max()) break;
    const std::size_t split = best.find(' ');
    const std::string first = best.substr(0, split), second = best.substr(split + 1);
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
    for (std::size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(symbols[i]));
        i += 1;
      }
    }
    symbols = std::move(merged);
  }
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cache_.emplace(word, symbols);
  return symbols;
}

std::vector<int64_t> GPT2BPETokenizer::encode(std::string_view text) const {
  const auto& bytes_to_unicode = byte_encoder();
  std::vector<int64_t> ids;
  for (const std::string_view piece : pre_tokenize(text)) {
    std::string word;
    for (const char byte : piece) word += bytes_to_unicode[static_cast<unsigned char>(byte)];
    for (const std::string& symbol : bpe(word)) {
      const auto id = encoder_.find(symbol);
      if (id == encoder_.end()) {
        throw std::runtime_error("GPT2BPETokenizer: the BPE symbol \"" + symbol + "\" of \"" + std::string(piece) +
                                 "\" is not in the vocabulary; the vocab and merges files do not belong together");
      }
      ids.push_back(id->second);
    }
  }
  return ids;
}

std::string GPT2BPETokenizer::decode(const std::vector<int64_t>& ids) const {
  static const std::unordered_map<char32_t, unsigned char> unicode_to_bytes = [] {
    std::unordered_map<char32_t, unsigned char> result;
    const auto& table = byte_encoder();
    for (int b = 0; b < 256; ++b) {
      std::size_t i = 0;
      result.emplace(next_code_point(table[static_cast<std::size_t>(b)], i), static_cast<unsigned char>(b));
    }
    return result;
  }();
  std::string text;
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("GPT2BPETokenizer::decode: id " + std::to_string(id) + " is not in [0, " +
                              std::to_string(vocab_size()) + ")");
    }
    const std::string& token = decoder_[static_cast<std::size_t>(id)];
    for (std::size_t i = 0; i < token.size();) {
      const auto byte = unicode_to_bytes.find(next_code_point(token, i));
      if (byte == unicode_to_bytes.end()) {
        throw std::runtime_error("GPT2BPETokenizer::decode: token " + std::to_string(id) + " (\"" + token +
                                 "\") holds a character outside GPT-2's byte alphabet");
      }
      text += static_cast<char>(byte->second);
    }
  }
  return text;
}

std::unique_ptr<Tokenizer> build_tokenizer(const std::string& tokenizer_type, const std::string& vocab_file,
                                           const std::string& merge_file) {
  if (tokenizer_type == "ByteLevel") return std::make_unique<ByteLevelTokenizer>();
  if (tokenizer_type == "GPT2BPETokenizer") {
    if (vocab_file.empty() || merge_file.empty()) {
      throw std::invalid_argument(
          "tokenizer GPT2BPETokenizer needs a vocab file (vocab.json) and a merge file "
          "(merges.txt); give --vocab-file and --merge-file");
    }
    return std::make_unique<GPT2BPETokenizer>(vocab_file, merge_file);
  }
  std::string message = "unknown tokenizer type \"" + tokenizer_type + "\"; expected ByteLevel or GPT2BPETokenizer";
  if (const auto guess = bridge::utils::closest_match(tokenizer_type, {"ByteLevel", "GPT2BPETokenizer"})) {
    message += " (did you mean " + *guess + "?)";
  }
  throw std::invalid_argument(message);
}

}  // namespace bridge::training::datasets
