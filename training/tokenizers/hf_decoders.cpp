// tokenizer.json decoders (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence) and post-processors
// (TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence).
#include <cctype>
#include <cstdlib>

#include "training/tokenizers/hf_components.h"
#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers::hf {
namespace {

// Each token's characters back to GPT-2's bytes (a token with a character outside the table keeps its own bytes),
// all of them joined and made UTF-8 lossily: one token comes out.
class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const std::size_t mark = bytes.size();
      bool mapped = true;
      for (std::size_t i = 0; i < token.size();) {
        char32_t c = 0;
        const int b = utf8::next(token, i, c) ? byte_level_byte(c) : -1;
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes += static_cast<char>(b);
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens.assign(1, utf8::lossy(bytes));
  }
};

// <0xXX> tokens to their bytes; a run of them that is not UTF-8 becomes one U+FFFD per token.
class ByteFallback : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    std::size_t byte_tokens = 0;
    const auto flush = [&] {
      if (byte_tokens == 0) return;
      if (utf8::first_invalid(bytes) == std::string_view::npos) {
        out.push_back(bytes);
      } else {
        for (std::size_t i = 0; i < byte_tokens; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      byte_tokens = 0;
    };
    for (std::string& token : tokens) {
      int value = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        // Rust's u8::from_str_radix(&token[3..5], 16): two hex digits, or '+' and one.
        const auto digit = [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c)) ? std::stoi(std::string(1, c), nullptr, 16) : -1;
        };
        const int high = digit(token[3]), low = digit(token[4]);
        if (high >= 0 && low >= 0) {
          value = high * 16 + low;
        } else if (token[3] == '+' && low >= 0) {
          value = low;
        }
      }
      if (value >= 0) {
        bytes += static_cast<char>(value);
        ++byte_tokens;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class Fuse : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::size_t begin = 0, end = token.size();
      for (std::size_t n = 0; n < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++n) {
        begin += content_.size();
      }
      for (std::size_t n = 0; n < stop_ && end >= begin + content_.size() &&
                              token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++n) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  std::size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) replace_all(*pattern_, content_, token);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

// The replacement character back to spaces; in the first token it is removed instead (encoding prepended it).
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& token = tokens[i];
      // In the first token every replacement character goes (not only the leading one), as the library does.
      const bool drop = i == 0 && strip_first_;
      for (std::size_t k = 0; k < token.size();) {
        if (token.compare(k, replacement_.size(), replacement_) == 0) {
          if (!drop) out += ' ';
          k += replacement_.size();
        } else {
          out += token[k++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages) : stages_(std::move(stages)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& stage : stages_) stage->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> stages_;
};

std::size_t count_field(const nlohmann::json& object, const std::string& path, const char* name) {
  const nlohmann::json& value = field(object, path, name);
  if (!value.is_number_unsigned()) throw unsupported(path + "." + name, "expected a count, got " + value.dump());
  return value.get<std::size_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& object, const std::string& path) {
  const std::string type = type_of(object, path);
  if (type == "ByteLevel") {
    only_keys(object, path, {"add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<ByteLevelDecoder>();
  }
  if (type == "ByteFallback") {
    only_keys(object, path, {});
    return std::make_unique<ByteFallback>();
  }
  if (type == "Fuse") {
    only_keys(object, path, {});
    return std::make_unique<Fuse>();
  }
  if (type == "Strip") {
    only_keys(object, path, {"content", "start", "stop"});
    return std::make_unique<StripDecoder>(string_field(object, path, "content"), count_field(object, path, "start"),
                                          count_field(object, path, "stop"));
  }
  if (type == "Replace") {
    only_keys(object, path, {"pattern", "content"});
    return std::make_unique<ReplaceDecoder>(make_pattern(field(object, path, "pattern"), path + ".pattern"),
                                            string_field(object, path, "content"));
  }
  if (type == "Metaspace") {
    only_keys(object, path, {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    bool strip_first = bool_field(object, path, "add_prefix_space", true);
    if (object.contains("prepend_scheme") && !object["prepend_scheme"].is_null()) {
      strip_first = string_field(object, path, "prepend_scheme") != "never";
    }
    return std::make_unique<MetaspaceDecoder>(string_field(object, path, "replacement"), strip_first);
  }
  if (type == "Sequence") {
    only_keys(object, path, {"decoders"});
    const nlohmann::json& list = field(object, path, "decoders");
    if (!list.is_array()) throw unsupported(path + ".decoders", "expected a list");
    std::vector<std::unique_ptr<Decoder>> stages;
    for (std::size_t i = 0; i < list.size(); ++i) {
      stages.push_back(make_decoder(list[i], path + ".decoders[" + std::to_string(i) + "]"));
    }
    return std::make_unique<SequenceDecoder>(std::move(stages));
  }
  throw unsupported(path + ".type", "the decoder \"" + type +
                                        "\" is not implemented (bridge has ByteLevel, ByteFallback, Fuse, Strip, "
                                        "Replace, Metaspace and Sequence)");
}

namespace {

// The single-sequence template: special tokens' ids around the sequence's.
class Template : public PostProcessor {
 public:
  explicit Template(std::vector<std::optional<std::vector<int64_t>>> items) : items_(std::move(items)) {}
  std::vector<int64_t> process(std::vector<int64_t> ids) const override {
    std::vector<int64_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& item : items_) {
      if (item) {
        out.insert(out.end(), item->begin(), item->end());
      } else {
        out.insert(out.end(), ids.begin(), ids.end());
      }
    }
    return out;
  }

 private:
  std::vector<std::optional<std::vector<int64_t>>> items_;  // nullopt: the sequence itself
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> stages) : stages_(std::move(stages)) {}
  std::vector<int64_t> process(std::vector<int64_t> ids) const override {
    for (const auto& stage : stages_) ids = stage->process(std::move(ids));
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> stages_;
};

// BertProcessing / RobertaProcessing's ["token", id] pairs.
int64_t pair_id(const nlohmann::json& object, const std::string& path, const char* name) {
  const nlohmann::json& value = field(object, path, name);
  if (!value.is_array() || value.size() != 2 || !value[1].is_number_integer()) {
    throw unsupported(path + "." + name, "expected [\"token\", id], got " + value.dump());
  }
  return value[1].get<int64_t>();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& object, const std::string& path) {
  const std::string type = type_of(object, path);
  if (type == "ByteLevel") {  // offsets only
    only_keys(object, path, {"add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<SequenceProcessor>(std::vector<std::unique_ptr<PostProcessor>>{});
  }
  if (type == "TemplateProcessing") {
    only_keys(object, path, {"single", "pair", "special_tokens"});
    const nlohmann::json& single = field(object, path, "single");
    const nlohmann::json& specials = field(object, path, "special_tokens");
    if (!single.is_array()) throw unsupported(path + ".single", "expected a list of template pieces");
    std::vector<std::optional<std::vector<int64_t>>> items;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const std::string item_path = path + ".single[" + std::to_string(i) + "]";
      const nlohmann::json& item = single[i];
      if (item.contains("Sequence")) {
        const std::string id = item["Sequence"].value("id", std::string());
        if (id != "A") throw unsupported(item_path, "a single-sequence template can only hold sequence A, not " + id);
        items.emplace_back(std::nullopt);
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].value("id", std::string());
        const auto special = specials.find(name);
        if (special == specials.end() || !special->contains("ids") || !(*special)["ids"].is_array()) {
          throw unsupported(item_path, "the special token \"" + name + "\" is not in " + path + ".special_tokens");
        }
        items.emplace_back((*special)["ids"].get<std::vector<int64_t>>());
      } else {
        throw unsupported(item_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + item.dump());
      }
    }
    return std::make_unique<Template>(std::move(items));
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    only_keys(object, path, {"sep", "cls", "trim_offsets", "add_prefix_space"});
    std::vector<std::optional<std::vector<int64_t>>> items;
    items.emplace_back(std::vector<int64_t>{pair_id(object, path, "cls")});
    items.emplace_back(std::nullopt);
    items.emplace_back(std::vector<int64_t>{pair_id(object, path, "sep")});
    return std::make_unique<Template>(std::move(items));
  }
  if (type == "Sequence") {
    only_keys(object, path, {"processors"});
    const nlohmann::json& list = field(object, path, "processors");
    if (!list.is_array()) throw unsupported(path + ".processors", "expected a list");
    std::vector<std::unique_ptr<PostProcessor>> stages;
    for (std::size_t i = 0; i < list.size(); ++i) {
      stages.push_back(make_post_processor(list[i], path + ".processors[" + std::to_string(i) + "]"));
    }
    return std::make_unique<SequenceProcessor>(std::move(stages));
  }
  throw unsupported(path + ".type", "the post-processor \"" + type +
                                        "\" is not implemented (bridge has TemplateProcessing, ByteLevel, "
                                        "BertProcessing, RobertaProcessing and Sequence)");
}

}  // namespace bridge::training::tokenizers::hf
