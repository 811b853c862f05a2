// JSON lines and text paragraphs -> indexed datasets.
#include "training/datasets/preprocess_data.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "training/datasets/indexed_dataset.h"
#include "training/datasets/tokenizer.h"
#include "utils/strings.h"

namespace bridge::training::datasets {
namespace {

// One document's sequences: their tokens back to back, and each sequence's length.
struct EncodedDocument {
  std::vector<int64_t> tokens;
  std::vector<int64_t> lengths;
};

// Megatron's Encoder.encode for one field: each non-empty piece of text a sequence, EOD after the last one.
EncodedDocument encode_pieces(const Tokenizer& tokenizer, const std::vector<std::string>& pieces, bool append_eod) {
  EncodedDocument document;
  for (const std::string& piece : pieces) {
    const std::vector<int64_t> ids = tokenizer.encode(piece);
    if (ids.empty()) continue;
    document.tokens.insert(document.tokens.end(), ids.begin(), ids.end());
    document.lengths.push_back(static_cast<int64_t>(ids.size()));
  }
  if (append_eod && !document.tokens.empty()) {
    document.tokens.push_back(tokenizer.eod());
    document.lengths.back() += 1;
  }
  return document;
}

class Preprocessor {
 public:
  explicit Preprocessor(const PreprocessConfig& config) : config_(config) {
    if (config_.input_format == InputFormat::kText) config_.json_keys = {"text"};
    if (config_.json_keys.empty()) throw std::invalid_argument("preprocess_data: json_keys names no field");
    tokenizer_ = build_tokenizer(config_.tokenizer_type, config_.vocab_file, config_.merge_file);
    const DType dtype = optimal_dtype(tokenizer_->vocab_size());
    for (const std::string& key : config_.json_keys) {
      outputs_.push_back({config_.output_prefix + "_" + key + "_document", 0, 0});
      builders_.push_back(std::make_unique<IndexedDatasetBuilder>(outputs_.back().path_prefix, dtype));
    }
  }

  std::vector<PreprocessedDataset> run() {
    std::ifstream in(config_.input, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open the input " + config_.input);
    if (config_.input_format == InputFormat::kJsonLines) {
      json_lines(in);
    } else {
      text_paragraphs(in);
    }
    for (std::size_t k = 0; k < builders_.size(); ++k) {
      builders_[k]->finalize();
      outputs_[k].documents = builders_[k]->num_documents();
    }
    return outputs_;
  }

 private:
  std::runtime_error error(int64_t line, const std::string& what) const {
    return std::runtime_error(config_.input + ":" + std::to_string(line) + ": " + what);
  }

  void json_lines(std::istream& in) {
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json object;
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw error(number, std::string("not a JSON object: ") + e.what() +
                                " (JSON lines input wants one object per line; plain text is --input-format text)");
      }
      if (!object.is_object()) throw error(number, "the line is JSON but not an object");
      for (std::size_t k = 0; k < config_.json_keys.size(); ++k) {
        const std::string& key = config_.json_keys[k];
        const auto field = object.find(key);
        if (field == object.end()) {
          std::vector<std::string> present;
          for (const auto& item : object.items()) present.push_back(item.key());
          throw error(number, "no field \"" + key + "\" (the line has: " + bridge::utils::join(present, ", ") +
                                  "); choose the fields with --json-keys");
        }
        std::vector<std::string> pieces;
        if (field->is_string()) {
          pieces.push_back(field->get<std::string>());
        } else if (field->is_array() &&
                   std::all_of(field->begin(), field->end(), [](const auto& v) { return v.is_string(); })) {
          pieces = field->get<std::vector<std::string>>();
        } else {
          throw error(number, "field \"" + key + "\" must be a string or a list of strings, got " + field->type_name());
        }
        add(k, pieces, number);
      }
      progress();
    }
  }

  void text_paragraphs(std::istream& in) {
    std::string line, paragraph;
    int64_t number = 0, first_line = 0;
    const auto flush = [&] {
      add(0, {paragraph}, first_line);
      paragraph.clear();
      progress();
    };
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) {
        if (!paragraph.empty()) flush();
        continue;
      }
      if (paragraph.empty()) {
        first_line = number;
      } else {
        paragraph += '\n';
      }
      paragraph += line;
    }
    if (!paragraph.empty()) flush();
  }

  void add(std::size_t key, const std::vector<std::string>& pieces, int64_t line) {
    EncodedDocument document;
    try {
      document = encode_pieces(*tokenizer_, pieces, config_.append_eod);
    } catch (const std::exception& e) {
      throw error(line, e.what());
    }
    builders_[key]->add_document(document.tokens, document.lengths);
    outputs_[key].tokens += static_cast<int64_t>(document.tokens.size());
  }

  void progress() {
    ++documents_;
    if (config_.log_interval > 0 && documents_ % config_.log_interval == 0) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      std::fprintf(stderr, "preprocess_data: %lld documents, %.0f documents/s\n", static_cast<long long>(documents_),
                   static_cast<double>(documents_) / std::max(seconds, 1e-9));
    }
  }

  PreprocessConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<PreprocessedDataset> outputs_;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders_;
  int64_t documents_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

std::vector<PreprocessedDataset> preprocess_data(const PreprocessConfig& config) { return Preprocessor(config).run(); }

}  // namespace bridge::training::datasets
