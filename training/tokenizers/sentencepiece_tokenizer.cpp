// SentencePieceProcessor behind the Tokenizer interface.
#include "training/tokenizers/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "training/tokenizers/utf8.h"

#if BRIDGE_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#else
namespace sentencepiece {
class SentencePieceProcessor {};  // never made: the constructor below refuses first
}  // namespace sentencepiece
#endif

namespace bridge::training::tokenizers {

#if BRIDGE_WITH_SENTENCEPIECE

namespace {

// The few fields of the model's protobuf (sentencepiece_model.proto) that decide whether words encode apart, read
// from its wire format: the library's header does not expose them, and a malformed or unexpected message only means
// "encode whole".
struct Field {
  uint64_t number = 0, wire = 0, value = 0;  // value: a varint's
  std::string_view bytes;                    // a length-delimited field's
};

bool read_varint(std::string_view message, std::size_t& at, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && at < message.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(message[at++]);
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Calls visit(field) for each field of `message`; false if it is malformed.
template <class Visit>
bool for_each_field(std::string_view message, const Visit& visit) {
  std::size_t at = 0;
  while (at < message.size()) {
    Field field;
    uint64_t tag = 0;
    if (!read_varint(message, at, tag)) return false;
    field.number = tag >> 3;
    field.wire = tag & 7;
    if (field.wire == 0) {
      if (!read_varint(message, at, field.value)) return false;
    } else if (field.wire == 2) {
      uint64_t length = 0;
      if (!read_varint(message, at, length) || length > message.size() - at) return false;
      field.bytes = message.substr(at, length);
      at += length;
    } else if (field.wire == 1 || field.wire == 5) {
      const std::size_t width = field.wire == 1 ? 8 : 4;
      if (width > message.size() - at) return false;
      at += width;
    } else {
      return false;
    }
    visit(field);
  }
  return true;
}

constexpr std::string_view kMeta = "\xE2\x96\x81";  // "▁" (U+2581), SentencePiece's escaped space

// spm_train's defaults: NormalizerSpec (ModelProto field 3) with one of the library's own rules (name, 1; a custom
// rule TSV could map across a word's start), add_dummy_prefix (3), remove_extra_whitespaces (4) and
// escape_whitespaces (5) true, TrainerSpec (field 2) treat_whitespace_as_suffix (24) false; then every piece holds
// "▁" at most as its first character and no plain space, so no piece spans the start of a word. Returns the
// characters a word may start with: spaces, and under the NMT rules, which map tab, line feed, carriage return and
// form feed to a space, those too; empty when words do not encode apart.
std::string word_starts(const sentencepiece::SentencePieceProcessor& processor) {
  const std::string proto = processor.serialized_model_proto();
  bool dummy_prefix = true, fold_whitespace = true, escape = true, suffix = false;
  std::string_view rule = "nmt_nfkc";
  const bool parsed = for_each_field(proto, [&](const Field& model) {
    if (model.wire != 2) return;
    if (model.number == 3) {
      for_each_field(model.bytes, [&](const Field& spec) {
        if (spec.wire == 2 && spec.number == 1) rule = spec.bytes;
        if (spec.wire != 0) return;
        if (spec.number == 3) dummy_prefix = spec.value != 0;
        if (spec.number == 4) fold_whitespace = spec.value != 0;
        if (spec.number == 5) escape = spec.value != 0;
      });
    } else if (model.number == 2) {
      for_each_field(model.bytes, [&](const Field& spec) {
        if (spec.wire == 0 && spec.number == 24) suffix = spec.value != 0;
      });
    }
  });
  const bool known_rule =
      rule == "nmt_nfkc" || rule == "nfkc" || rule == "nmt_nfkc_cf" || rule == "nfkc_cf" || rule == "identity";
  if (!parsed || !known_rule || !dummy_prefix || !fold_whitespace || !escape || suffix) return "";
  std::string starts = rule == "nmt_nfkc" || rule == "nmt_nfkc_cf" ? " \t\n\r\f" : " ";
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    const std::string& piece = processor.IdToPiece(id);
    if (piece.find(' ') != std::string::npos || piece.find(kMeta, 1) != std::string::npos) return "";
    // A user-defined piece is matched in the raw text: one holding a tab or line break must not be cut there.
    if (piece.find_first_of(starts) != std::string::npos) starts = " ";
  }
  return starts;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, std::string type_name)
    : model_file_(model_file),
      type_name_(std::move(type_name)),
      processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = processor_->Load(model_file);
  if (!status.ok()) {
    throw std::invalid_argument(type_name_ + ": cannot load the SentencePiece model " + model_file + ": " +
                                status.ToString() + " (give --tokenizer-model the tokenizer.model file)");
  }
  vocab_size_ = processor_->GetPieceSize();
  word_starts_ = word_starts(*processor_);
  for (const char c : word_starts_) is_word_start_[static_cast<unsigned char>(c)] = true;
  starts_word_.resize(static_cast<std::size_t>(vocab_size_));
  for (int id = 0; id < vocab_size_; ++id) {
    starts_word_[static_cast<std::size_t>(id)] = processor_->IdToPiece(id).rfind(kMeta, 0) == 0;
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_whole(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<int> encoded;
  const auto status = processor_->Encode(text, &encoded);
  if (!status.ok()) throw std::runtime_error(name() + ": encoding failed: " + status.ToString());
  ids.assign(encoded.begin(), encoded.end());
}

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  utf8::require_valid(text, type_name_);
  std::vector<int64_t> ids;
  // A "▁" typed in the text ends a word as an escaped space would (the normalizer drops a word's trailing ones under
  // the identity and NFKC rules), so such a text goes whole.
  if (word_starts_.empty() || text.find(kMeta) != std::string_view::npos) {
    std::vector<int32_t> whole;
    encode_whole(text, whole);
    return std::vector<int64_t>(whole.begin(), whole.end());
  }
  // A word starts where a run of spaces does ("a  b" is "a" and "  b"; under the NMT rules also a run of tabs and
  // line breaks): the normalizer folds the run into the "▁" that begins the word's first piece, in the text as in the
  // word alone (the dummy prefix). The words of a text not cached yet are encoded together, in one library call
  // (each call costs Debian's 0.1.97 a protobuf), and the ids split where a piece begins with "▁". Only words of
  // printable ASCII after their spaces go in that call: each normalizes to one "▁" and something after it under the
  // library's rules, so each begins exactly one such piece; if the count comes out otherwise, they are encoded one by
  // one.
  const auto is_space = [this](char c) { return is_word_start_[static_cast<unsigned char>(c)]; };
  const auto encode_word = [this](std::string_view word, std::vector<int32_t>& word_ids) {
    encode_whole(word, word_ids);
  };
  std::string missing;  // the missing words, one after another
  std::vector<std::string_view> missing_words;
  std::vector<std::size_t> missing_at;  // where each one's ids go in `ids`
  std::size_t start = 0;
  for (std::size_t i = 1; i <= text.size(); ++i) {
    if (i < text.size() && !(is_space(text[i]) && !is_space(text[i - 1]))) continue;
    const std::string_view word = text.substr(start, i - start);
    start = i;
    // The spaces before a word fold into the "▁" its text alone gets as the dummy prefix: "\n  word" has the ids of
    // "word", which is the key (spaces alone, as at a text's end, are their own key).
    std::size_t body = 0;
    while (body < word.size() && is_space(word[body])) ++body;
    const std::string_view key = body < word.size() ? word.substr(body) : word;
    if (cache_.find(key, ids)) continue;
    const bool plain = body < word.size() && key.size() < WordCache::kMaxWordBytes &&
                       std::all_of(key.begin(), key.end(), [](char c) { return c > ' ' && c < 0x7f; });
    if (!plain) {
      cache_.append(key, ids, encode_word);
      continue;
    }
    missing += ' ';
    missing += key;
    missing_words.push_back(key);
    missing_at.push_back(ids.size());
  }
  if (missing_words.empty()) return ids;

  std::vector<int32_t> missing_ids;
  encode_whole(missing, missing_ids);
  std::vector<std::vector<int32_t>> split;
  bool counted = true;
  for (const int32_t id : missing_ids) {
    if (starts_word_[static_cast<std::size_t>(id)]) split.emplace_back();
    if (split.empty()) {
      counted = false;
      break;
    }
    split.back().push_back(id);
  }
  if (!counted || split.size() != missing_words.size()) {
    split.assign(missing_words.size(), {});
    for (std::size_t w = 0; w < missing_words.size(); ++w) encode_word(missing_words[w], split[w]);
  }
  // The text's ids in order: the cached ones with each missing word's in its place.
  std::vector<int64_t> merged;
  merged.reserve(ids.size() + missing_ids.size());
  std::size_t from = 0;
  for (std::size_t w = 0; w < missing_words.size(); ++w) {
    merged.insert(merged.end(), ids.begin() + static_cast<std::ptrdiff_t>(from),
                  ids.begin() + static_cast<std::ptrdiff_t>(missing_at[w]));
    from = missing_at[w];
    merged.insert(merged.end(), split[w].begin(), split[w].end());
    cache_.insert(missing_words[w], split[w]);
  }
  merged.insert(merged.end(), ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
  return merged;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      throw std::out_of_range(type_name_ + "::decode: id " + std::to_string(id) + " is not in [0, " +
                              std::to_string(vocab_size_) + ")");
    }
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = processor_->Decode(narrow, &text);
  if (!status.ok()) throw std::runtime_error(name() + ": decoding failed: " + status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::eod() const {
  const int eos = processor_->eos_id();
  if (eos < 0) {
    throw std::logic_error(name() +
                           ": the model has no end-of-sentence piece (trained with eos_id=-1), so there is "
                           "no end-of-document id; train it with an eos piece");
  }
  return eos;
}

std::optional<int64_t> SentencePieceTokenizer::bos() const {
  const int bos = processor_->bos_id();
  if (bos < 0) return std::nullopt;
  return bos;
}

#else

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, std::string type_name)
    : model_file_(model_file), type_name_(std::move(type_name)) {
  throw std::invalid_argument(type_name_ +
                              ": this bridge was built without SentencePiece: its LibTorch links the "
                              "system's libprotobuf, which cannot share a process with libsentencepiece's "
                              "own copy (Debian's LibTorch 1.13 does); build against the torch wheel");
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view) const { return {}; }
std::string SentencePieceTokenizer::decode(const std::vector<int64_t>&) const { return {}; }
int64_t SentencePieceTokenizer::eod() const { return -1; }
std::optional<int64_t> SentencePieceTokenizer::bos() const { return std::nullopt; }

#endif

}  // namespace bridge::training::tokenizers
