// tokenizer.json pre-tokenizers: Split (a pattern and one of tokenizers' five delimiter behaviours), ByteLevel
// (GPT-2's split and byte-to-character mapping), Metaspace (SentencePiece's '▁'), Digits, Whitespace,
// WhitespaceSplit and Sequence.
#include <unicode/uchar.h>

#include <algorithm>

#include "training/tokenizers/hf_components.h"
#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers::hf {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const nlohmann::json& object, const std::string& path) {
  const std::string name = string_field(object, path, "behavior");
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw unsupported(path + ".behavior", "\"" + name +
                                            "\" is not a delimiter behaviour (Removed, Isolated, MergedWithPrevious, "
                                            "MergedWithNext, Contiguous)");
}

struct Span {
  std::size_t begin, end;
  bool is_match;
};

// The spans of `text` (covering it, in order) with the matches of `pattern` flagged, as tokenizers' find_matches.
void find_spans(const Regex& pattern, const std::string& text, bool invert, std::vector<Span>& spans) {
  spans.clear();
  thread_local std::vector<Regex::Match> matches;
  matches.clear();
  if (matches.capacity() > (1u << 20)) matches.shrink_to_fit();  // a huge document's matches are not kept around
  pattern.find_all(text, matches);
  std::size_t previous = 0;
  for (const Regex::Match& match : matches) {
    if (previous != match.begin) spans.push_back({previous, match.begin, invert});
    spans.push_back({match.begin, match.end, !invert});
    previous = match.end;
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});
}

// tokenizers' NormalizedString::split: the spans grouped by the behaviour; empty ones are dropped by the caller.
void apply_behavior(Behavior behavior, std::vector<Span>& spans) {
  std::vector<Span> out;
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      return;
    case Behavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.is_match) out.push_back(span);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back(span);
        }
        previous_match = span.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (std::size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].is_match == previous_match) {
          out.back().end = spans[i].end;
        } else {
          out.push_back(spans[i]);
        }
        previous_match = spans[i].is_match;
      }
      break;
  }
  spans = std::move(out);
}

// Splits every piece with `pattern` and `behavior`; the first sub-piece of a piece at the start stays at the start.
void split_pieces(const Regex& pattern, Behavior behavior, bool invert, std::vector<Piece>& pieces) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  std::vector<Span> spans;
  for (Piece& piece : pieces) {
    find_spans(pattern, piece.text, invert, spans);
    apply_behavior(behavior, spans);
    for (const Span& span : spans) {
      if (span.end == span.begin) continue;
      out.push_back({piece.text.substr(span.begin, span.end - span.begin), piece.at_start && span.begin == 0});
    }
  }
  pieces = std::move(out);
}

class Split : public PreTokenizer {
 public:
  Split(std::unique_ptr<Regex> pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override { split_pieces(*pattern_, behavior_, invert_, pieces); }

 private:
  std::unique_ptr<Regex> pattern_;
  Behavior behavior_;
  bool invert_;
};

// tokenizers' ByteLevel: an optional leading space, GPT-2's split, then each byte as its printable character.
class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space_) {
      for (Piece& piece : pieces) {
        if (!piece.text.empty() && piece.text[0] != ' ')
          piece.text = " " + piece.text;  // "" stays "", as in the library
      }
    }
    if (use_regex_) {
      static const Regex gpt2(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
                              "ByteLevel's GPT-2 pattern");
      split_pieces(gpt2, Behavior::kIsolated, false, pieces);
    }
    for (Piece& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() + piece.text.size() / 2);
      for (const char b : piece.text) mapped += byte_level_char(static_cast<unsigned char>(b));
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

// SentencePiece's whitespace: spaces become the replacement character ('▁'), one is prepended (always, or only to
// the text's first piece), and with `split` each word is a piece that starts with the replacement.
class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    if (split_) split_pattern_ = std::make_unique<Regex>(regex_escape(replacement_), "Metaspace's split");
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + 8);
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_start))) {
        replaced.insert(0, replacement_);
      }
      piece.text = std::move(replaced);
    }
    if (split_) split_pieces(*split_pattern_, Behavior::kMergedWithNext, false, pieces);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  std::unique_ptr<Regex> split_pattern_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> stages) : stages_(std::move(stages)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& stage : stages_) stage->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& object, const std::string& path) {
  const std::string type = type_of(object, path);
  if (type == "Split") {
    only_keys(object, path, {"pattern", "behavior", "invert"});
    return std::make_unique<Split>(make_pattern(field(object, path, "pattern"), path + ".pattern"),
                                   parse_behavior(object, path), bool_field(object, path, "invert", false));
  }
  if (type == "ByteLevel") {
    only_keys(object, path, {"add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<ByteLevel>(bool_field(object, path, "add_prefix_space", true),
                                       bool_field(object, path, "use_regex", true));
  }
  if (type == "Metaspace") {
    only_keys(object, path, {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    std::string replacement = string_field(object, path, "replacement");
    std::size_t i = 0;
    char32_t c = 0;
    if (!utf8::next(replacement, i, c) || i != replacement.size()) {
      throw unsupported(path + ".replacement", "must be one character, got \"" + replacement + "\"");
    }
    PrependScheme scheme =
        bool_field(object, path, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
    if (object.contains("prepend_scheme") && !object["prepend_scheme"].is_null()) {
      const std::string name = string_field(object, path, "prepend_scheme");
      if (name == "always") {
        scheme = PrependScheme::kAlways;
      } else if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else {
        throw unsupported(path + ".prepend_scheme", "\"" + name + "\" is not always, first or never");
      }
    }
    return std::make_unique<Metaspace>(std::move(replacement), scheme, bool_field(object, path, "split", true));
  }
  if (type == "Digits") {
    only_keys(object, path, {"individual_digits"});
    const bool individual = bool_field(object, path, "individual_digits", false);
    return std::make_unique<Split>(std::make_unique<Regex>(R"(\p{N})", path),
                                   individual ? Behavior::kIsolated : Behavior::kContiguous, false);
  }
  if (type == "Whitespace") {
    // The tokenizers quicktour's pre-tokenizer, \w+|[^\w\s]+ with the whitespace between the runs dropped. The
    // library scans it by hand with the Unicode \w of Rust's regex crate (Alphabetic, marks, decimal digits,
    // connectors, the two joiners), not Oniguruma's: measured over every code point with tokenizers 0.23.
    only_keys(object, path, {});
    static constexpr const char* kWord = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";
    return std::make_unique<Split>(std::make_unique<Regex>("[" + std::string(kWord) + "]+|[^" + kWord + "\\s]+", path),
                                   Behavior::kRemoved,
                                   /*invert=*/true);
  }
  if (type == "WhitespaceSplit") {
    only_keys(object, path, {});
    return std::make_unique<Split>(std::make_unique<Regex>(R"([\s\x{85}])", path), Behavior::kRemoved, false);
  }
  if (type == "Sequence") {
    only_keys(object, path, {"pretokenizers"});
    const nlohmann::json& list = field(object, path, "pretokenizers");
    if (!list.is_array()) throw unsupported(path + ".pretokenizers", "expected a list");
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (std::size_t i = 0; i < list.size(); ++i) {
      stages.push_back(make_pre_tokenizer(list[i], path + ".pretokenizers[" + std::to_string(i) + "]"));
    }
    return std::make_unique<Sequence>(std::move(stages));
  }
  throw unsupported(path + ".type", "the pre-tokenizer \"" + type +
                                        "\" is not implemented (bridge has Split, ByteLevel, Metaspace, Digits, "
                                        "Whitespace, WhitespaceSplit and Sequence)");
}

}  // namespace bridge::training::tokenizers::hf
