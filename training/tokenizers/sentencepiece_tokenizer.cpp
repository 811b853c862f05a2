// SentencePieceProcessor behind the Tokenizer interface.
#include "training/tokenizers/sentencepiece_tokenizer.h"

#include <stdexcept>

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
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text) const {
  utf8::require_valid(text, type_name_);
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error(name() + ": encoding failed: " + status.ToString());
  return std::vector<int64_t>(ids.begin(), ids.end());
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
