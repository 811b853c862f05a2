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

// Where a model's texts split into words that encode apart, read from NormalizerSpec (ModelProto field 3): the rule
// (name, 1; one of the library's own: a custom rule TSV could map across a word's start), add_dummy_prefix (3),
// remove_extra_whitespaces (4), escape_whitespaces (5), and TrainerSpec (field 2) treat_whitespace_as_suffix (24).
// With the dummy prefix, escaping and no suffix rule:
// - kFolded (spm_train's defaults): whitespace runs fold into one "▁", and every piece holds "▁" at most as its first
//   character, so no piece spans the start of a word; words start at spaces and, under the NMT rules, which map tab,
//   line feed, carriage return and form feed to a space, at those too.
// - kKept (Llama-2's: the identity rule, whitespace kept): every piece holds "▁" only in a run at its start, so no
//   piece spans a "▁" that follows something else; words start at a space after something else.
// No piece may hold a plain space. `starts` gets the characters a word may start with.
SentencePieceTokenizer::Words word_rule(const sentencepiece::SentencePieceProcessor& processor, std::string& starts) {
  using Words = SentencePieceTokenizer::Words;
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
  if (!parsed || !known_rule || !dummy_prefix || !escape || suffix) return Words::kWhole;
  if (!fold_whitespace && rule != "identity") return Words::kWhole;
  const Words words = fold_whitespace ? Words::kFolded : Words::kKept;
  starts = rule == "nmt_nfkc" || rule == "nmt_nfkc_cf" ? " \t\n\r\f" : " ";
  for (int id = 0; id < processor.GetPieceSize(); ++id) {
    const std::string& piece = processor.IdToPiece(id);
    if (piece.find(' ') != std::string::npos) return Words::kWhole;
    std::size_t after = 0;  // past the piece's leading "▁"s (kKept) or its first one (kFolded)
    while (piece.compare(after, kMeta.size(), kMeta) == 0 && (words == Words::kKept || after == 0)) {
      after += kMeta.size();
    }
    if (piece.find(kMeta, after) != std::string::npos) return Words::kWhole;
    // A user-defined piece is matched in the raw text: one holding a tab or line break must not be cut there.
    if (piece.find_first_of(starts) != std::string::npos) starts = " ";
  }
  return words;
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
  std::string starts;
  words_ = word_rule(*processor_, starts);
  for (const char c : starts) is_word_start_[static_cast<unsigned char>(c)] = true;
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_whole(std::string_view text, std::vector<int32_t>& ids) const {
  library_calls_.fetch_add(1, std::memory_order_relaxed);
  std::vector<int> encoded;
  const auto status = processor_->Encode(text, &encoded);
  if (!status.ok()) throw std::runtime_error(name() + ": encoding failed: " + status.ToString());
  ids.assign(encoded.begin(), encoded.end());
}

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  utf8::require_valid(text, type_name_);
  // A "▁" typed in the text ends a word as an escaped space would (the normalizer drops a word's trailing ones under
  // the identity and NFKC rules), so such a text goes whole.
  if (words_ == Words::kWhole || text.find(kMeta) != std::string_view::npos) {
    std::vector<int32_t> whole;
    encode_whole(text, whole);
    return std::vector<int64_t>(whole.begin(), whole.end());
  }
  // Each word's ids are those of its key encoded alone; a word's ids come from the cache, or, if it is missing, from
  // one library call over all of the text's missing keys (each call costs Debian's 0.1.97 a protobuf).
  std::vector<int64_t> ids;
  Missing missing;
  const auto take = [&](std::string_view key, bool batch) {
    if (!batch || key.size() >= WordCache::kMaxWordBytes) {
      cache_.append(key, ids, [this](std::string_view word, std::vector<int32_t>& out) { encode_whole(word, out); });
    } else if (!cache_.find(key, ids)) {
      missing.add(key, ids.size());
    }
  };
  const auto is_start = [this](char c) { return is_word_start_[static_cast<unsigned char>(c)]; };
  if (words_ == Words::kFolded) {
    // A word starts where a run of spaces does ("a  b" is "a" and "  b"; under the NMT rules also a run of tabs and
    // line breaks). The run folds into the "▁" the word's text alone gets as the dummy prefix, so a word of printable
    // ASCII is keyed by its text after the run ("\n  word" has the ids of "word"); another is keyed whole and
    // encoded alone, as its characters could normalize to spaces.
    std::size_t start = 0;
    for (std::size_t i = 1; i <= text.size(); ++i) {
      if (i < text.size() && !(is_start(text[i]) && !is_start(text[i - 1]))) continue;
      const std::string_view word = text.substr(start, i - start);
      start = i;
      std::size_t body = 0;
      while (body < word.size() && is_start(word[body])) ++body;
      if (body == word.size()) continue;  // spaces alone, at the text's end: removed, as extra whitespace
      const bool plain = std::all_of(word.begin() + static_cast<std::ptrdiff_t>(body), word.end(),
                                     [](char c) { return c > ' ' && c < 0x7f; });
      if (plain) {
        take(word.substr(body), true);
      } else {
        take(word, false);
      }
    }
  } else {
    // The identity rule keeps every space as a "▁": a word starts at a space after something else, when something
    // else follows ("a  b " is "a" and "  b "). The dummy prefix is the word's first "▁" when it is encoded alone, so
    // a word's key is its text without its first space (the text's first word keeps all of its own).
    const std::size_t last = text.find_last_not_of(' ');  // a word starts only before it
    std::size_t start = 0;
    for (std::size_t i = 1; i <= text.size(); ++i) {
      if (i < text.size() && !(text[i] == ' ' && text[i - 1] != ' ' && i < last)) continue;
      const std::size_t from = start == 0 ? 0 : start + 1;
      take(text.substr(from, i - from), true);
      start = i;
    }
  }
  if (missing.keys.empty()) return ids;

  std::vector<std::vector<int32_t>> split = split_missing(missing);
  // The text's ids in order: the cached ones with each missing word's in its place.
  std::vector<int64_t> merged;
  std::size_t count = ids.size();
  for (const std::vector<int32_t>& word_ids : split) count += word_ids.size();
  merged.reserve(count);
  std::size_t from = 0;
  for (std::size_t w = 0; w < missing.keys.size(); ++w) {
    merged.insert(merged.end(), ids.begin() + static_cast<std::ptrdiff_t>(from),
                  ids.begin() + static_cast<std::ptrdiff_t>(missing.at[w]));
    from = missing.at[w];
    merged.insert(merged.end(), split[w].begin(), split[w].end());
    cache_.insert(missing.keys[w], split[w]);
  }
  merged.insert(merged.end(), ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
  return merged;
}

void SentencePieceTokenizer::Missing::add(std::string_view key, std::size_t ids_at) {
  begins.push_back(joined.size());
  if (!joined.empty()) joined += ' ';
  joined += key;
  keys.push_back(key);
  at.push_back(ids_at);
}

// The keys joined by a space read, to the normalizer, as each word did in its text: the space is the word's first
// "▁" (or folds into it), and the first key gets the dummy prefix. The library reports where in the joined text each
// piece came from, which gives each key its pieces; should a piece reach past its key's end, the keys are encoded
// one by one instead.
std::vector<std::vector<int32_t>> SentencePieceTokenizer::split_missing(const Missing& missing) const {
  const std::size_t count = missing.keys.size();
  std::vector<std::vector<int32_t>> split(count);
  const auto end_of = [&](std::size_t w) { return w + 1 < count ? missing.begins[w + 1] : missing.joined.size(); };
  library_calls_.fetch_add(1, std::memory_order_relaxed);
  const sentencepiece::ImmutableSentencePieceText encoded = processor_->EncodeAsImmutableProto(missing.joined);
  bool apart = encoded.pieces_size() > 0;
  std::size_t w = 0;
  for (const auto& piece : encoded.pieces()) {
    while (w + 1 < count && piece.begin() >= missing.begins[w + 1]) ++w;
    if (piece.begin() < missing.begins[w] || piece.end() > end_of(w)) {
      apart = false;
      break;
    }
    split[w].push_back(static_cast<int32_t>(piece.id()));
  }
  for (std::size_t k = 0; k < count && apart; ++k) apart = !split[k].empty();
  if (!apart) {
    for (std::size_t k = 0; k < count; ++k) encode_whole(missing.keys[k], split[k]);
  }
  return split;
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
