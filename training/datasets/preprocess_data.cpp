// JSON lines and text paragraphs -> indexed datasets, tokenized on worker threads and written in input order. The
// calling thread reads the next batch and writes finished ones while the workers tokenize, as Megatron's main
// process feeds its pool and writes what comes back: reading and writing stay off the workers' critical path. The
// workers also parse the JSON and convert their ids to the output's dtype, so the calling thread, which a second
// worker shares the cores with, does as little as it can.
#include "training/datasets/preprocess_data.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "training/datasets/indexed_dataset.h"
#include "training/datasets/sentence_splitter.h"
#include "training/tokenizers/tokenizer.h"
#include "utils/strings.h"

namespace bridge::training::datasets {
namespace {

using tokenizers::Tokenizer;

// One document's sequences: their tokens back to back, already in the output's dtype (the workers convert them, so
// that the writing thread only writes), and each sequence's length.
struct EncodedDocument {
  std::vector<unsigned char> token_bytes;
  std::vector<int64_t> lengths;
};

// Megatron's Encoder.encode for one field: each non-empty piece of text a sequence, EOD after the last one.
EncodedDocument encode_pieces(const Tokenizer& tokenizer, const std::vector<std::string>& pieces, bool append_eod,
                              DType dtype) {
  EncodedDocument document;
  // The dtype holds every id below the tokenizer's vocab_size, so an id that does not fit is the tokenizer's fault.
  const auto append = [&](const int64_t* ids, std::size_t count) {
    try {
      append_token_bytes(ids, count, dtype, document.token_bytes);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error("the tokenizer gave an id outside its vocabulary of " +
                               std::to_string(tokenizer.vocab_size()) + ": " + e.what());
    }
  };
  for (const std::string& piece : pieces) {
    const std::vector<int64_t> ids = tokenizer.encode(piece);
    if (ids.empty()) continue;
    append(ids.data(), ids.size());
    document.lengths.push_back(static_cast<int64_t>(ids.size()));
  }
  if (append_eod && !document.lengths.empty()) {
    const int64_t eod = tokenizer.eod();
    append(&eod, 1);
    document.lengths.back() += 1;
  }
  return document;
}

// Calls `line(text)` for each line of `in`, without its '\n', as std::getline splits them. Reads 1 MiB at a time
// and gives views into it, so that a document's string is made once at its size: getline grows a string from empty,
// several reallocations per document on the one thread that feeds every worker.
// A read that fails (an I/O error, or an input that is a folder) is an error naming `path`, not the end of the input.
template <typename Line>
void for_each_line(std::istream& in, const std::string& path, Line&& line) {
  std::vector<char> buffer(std::size_t{1} << 20);
  std::string partial;  // a line that runs past the buffer
  while (in) {
    errno = 0;
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.bad()) {
      throw std::runtime_error("cannot read the input " + path +
                               (errno != 0 ? ": " + std::string(std::strerror(errno)) : "") +
                               " (is it a readable file, not a folder?)");
    }
    const char* at = buffer.data();
    const char* const end = at + in.gcount();
    while (at < end) {
      const auto* newline = static_cast<const char*>(std::memchr(at, '\n', static_cast<std::size_t>(end - at)));
      if (newline == nullptr) {
        partial.append(at, end);
        break;
      }
      if (partial.empty()) {
        line(std::string_view(at, static_cast<std::size_t>(newline - at)));
      } else {
        partial.append(at, newline);
        line(std::string_view(partial));
        partial.clear();
      }
      at = newline + 1;
    }
  }
  if (!partial.empty()) line(std::string_view(partial));
}

// One document as read: the input line it starts on, and either its JSON line (parsed by a worker) or each key's
// pieces of text.
struct RawDocument {
  int64_t line = 0;
  std::string json;
  std::vector<std::vector<std::string>> pieces;  // per key
};

// Documents are tokenized this many per worker at a time, then written in input order.
constexpr std::size_t kDocumentsPerWorker = 256;

// Batches tokenizing while the caller reads the next one; more would only hold more documents in memory.
constexpr std::size_t kBatchesInFlight = 2;

// A batch handed to the workers: the documents as read, and what tokenizing each gave (or its error).
struct Batch {
  std::vector<RawDocument> documents;
  std::vector<std::vector<EncodedDocument>> encoded;
  std::vector<std::string> errors;
  std::atomic<std::size_t> next{0};  // the next document a worker may take
  std::atomic<std::size_t> left{0};  // documents not yet tokenized
  std::promise<void> done;
  std::future<void> finished = done.get_future();
};

// Worker threads that live as long as the run, so each keeps its tokenizer's thread-local word cache warm; a worker
// done with its share of one batch takes documents of the next without waiting for the others (no barrier per
// batch), and the caller collects the batches in input order.
class TokenizingPool {
 public:
  TokenizingPool(int workers, std::function<void(Batch&, std::size_t)> encode) : encode_(std::move(encode)) {
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }
  ~TokenizingPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }
  TokenizingPool(const TokenizingPool&) = delete;
  TokenizingPool& operator=(const TokenizingPool&) = delete;

  /// Queues `documents`; the batch's `finished` is ready once every one is tokenized.
  std::shared_ptr<Batch> submit(std::vector<RawDocument> documents) {
    auto batch = std::make_shared<Batch>();
    batch->documents = std::move(documents);
    batch->encoded.resize(batch->documents.size());
    batch->errors.resize(batch->documents.size());
    batch->left = batch->documents.size();
    if (batch->documents.empty()) {
      batch->done.set_value();
      return batch;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_.push_back(batch);
    }
    ready_.notify_all();
    return batch;
  }

 private:
  void work() {
    while (true) {
      std::shared_ptr<Batch> batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !open_.empty(); });
        if (open_.empty()) return;  // stopping, with nothing left to do
        batch = open_.front();
      }
      const std::size_t i = batch->next++;
      if (i >= batch->documents.size()) {  // every document taken: on to the next batch
        std::lock_guard<std::mutex> lock(mutex_);
        if (!open_.empty() && open_.front() == batch) open_.pop_front();
        continue;
      }
      encode_(*batch, i);
      if (--batch->left == 0) batch->done.set_value();
    }
  }

  std::function<void(Batch&, std::size_t)> encode_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::shared_ptr<Batch>> open_;  // batches with documents not yet taken, in input order
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

class Preprocessor {
 public:
  explicit Preprocessor(const PreprocessConfig& config) : config_(config) {
    if (config_.input_format == InputFormat::kText) config_.json_keys = {"text"};
    if (config_.json_keys.empty()) throw std::invalid_argument("preprocess_data: json_keys names no field");
    if (config_.workers < 1) throw std::invalid_argument("preprocess_data: workers must be >= 1");
    if (config_.partitions < 1) throw std::invalid_argument("preprocess_data: partitions must be >= 1");
    if (config_.workers % config_.partitions != 0) {
      throw std::invalid_argument("--workers (" + std::to_string(config_.workers) +
                                  ") must be a multiple of --partitions (" + std::to_string(config_.partitions) +
                                  "), as Megatron's preprocess_data.py requires");
    }
    if (config_.keep_newlines && !config_.split_sentences) {
      throw std::invalid_argument("--keep-newlines applies with --split-sentences only");
    }
    tokenizer_ = tokenizers::build_tokenizer(config_.tokenizer);
    if (config_.append_eod) {
      try {
        tokenizer_->eod();
      } catch (const std::logic_error& e) {
        throw std::invalid_argument(std::string("--append-eod: ") + e.what());
      }
    }
    dtype_ = optimal_dtype(tokenizer_->vocab_size());
    pool_ = std::make_unique<TokenizingPool>(config_.workers, [this](Batch& batch, std::size_t i) {
      try {
        batch.encoded[i] = encode(batch.documents[i]);
      } catch (const std::exception& e) {
        batch.errors[i] = e.what();
      }
    });
    // The output's folder is made as needed (every example writes to data/...), once the tokenizer and the input
    // are known good, so a bad command leaves no folder; a folder already there is used as it is.
    if (!std::ifstream(config_.input, std::ios::binary))
      throw std::runtime_error("cannot open the input " + config_.input);
    make_output_folder();
    const std::string level = config_.split_sentences ? "_sentence" : "_document";
    for (const std::string& key : config_.json_keys) {
      outputs_.push_back({config_.output_prefix + "_" + key + level, 0, 0});
      builders_.push_back(std::make_unique<IndexedDatasetBuilder>(outputs_.back().path_prefix, dtype_));
    }
  }

  std::vector<PreprocessedDataset> run() {
    // Megatron deals the documents round-robin to its partitions and merges their outputs in partition order: one
    // pass per partition writes the same sequence of documents. Contiguous partitions merge back to the input order.
    const int passes = config_.keep_sequential_samples ? 1 : config_.partitions;
    for (int pass = 0; pass < passes; ++pass) {
      std::ifstream in(config_.input, std::ios::binary);
      if (!in) throw std::runtime_error("cannot open the input " + config_.input);
      int64_t ordinal = 0;
      const auto take = [&](RawDocument&& document) {
        if (ordinal++ % passes != pass) return;
        reading_.push_back(std::move(document));
        if (reading_.size() >= kDocumentsPerWorker * static_cast<std::size_t>(config_.workers)) hand_over();
      };
      if (config_.input_format == InputFormat::kJsonLines) {
        json_lines(in, take);
      } else {
        text_paragraphs(in, take);
      }
      hand_over();
    }
    hand_over(/*last=*/true);
    for (std::size_t k = 0; k < builders_.size(); ++k) {
      builders_[k]->finalize();
      outputs_[k].documents = builders_[k]->num_documents();
    }
    return outputs_;
  }

 private:
  using Take = std::function<void(RawDocument&&)>;

  void make_output_folder() const {
    const std::filesystem::path folder = std::filesystem::path(config_.output_prefix).parent_path();
    if (folder.empty()) return;
    std::error_code failure;
    std::filesystem::create_directories(folder, failure);
    if (failure || !std::filesystem::is_directory(folder)) {
      throw std::runtime_error("cannot make the output folder " + folder.string() + " of --output-prefix " +
                               config_.output_prefix + ": " +
                               (failure ? failure.message() : std::string("a file of that name is in the way")) +
                               "; choose another --output-prefix or make the folder writable");
    }
  }

  std::runtime_error error(int64_t line, const std::string& what) const {
    return std::runtime_error(config_.input + ":" + std::to_string(line) + ": " + what);
  }

  // The non-blank lines; parsing them is the workers' (parse_json below), so that it scales with them.
  void json_lines(std::istream& in, const Take& take) const {
    int64_t number = 0;
    for_each_line(in, config_.input, [&](std::string_view line) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
      take(RawDocument{number, std::string(line), {}});
    });
  }

  // One JSON line's fields; throws std::runtime_error with what is wrong (flush() adds the file and line).
  void parse_json(RawDocument& document) const {
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(document.json);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(std::string("not a JSON object: ") + e.what() +
                               " (JSON lines input wants one object per line; plain text is --input-format text)");
    }
    if (!object.is_object()) throw std::runtime_error("the line is JSON but not an object");
    for (const std::string& key : config_.json_keys) {
      const auto field = object.find(key);
      if (field == object.end()) {
        std::vector<std::string> present;
        for (const auto& item : object.items()) present.push_back(item.key());
        throw std::runtime_error("no field \"" + key + "\" (the line has: " + bridge::utils::join(present, ", ") +
                                 "); choose the fields with --json-keys");
      }
      if (field->is_string()) {
        document.pieces.push_back({field->get<std::string>()});
      } else if (field->is_array() &&
                 std::all_of(field->begin(), field->end(), [](const auto& v) { return v.is_string(); })) {
        document.pieces.push_back(field->get<std::vector<std::string>>());
      } else {
        throw std::runtime_error("field \"" + key + "\" must be a string or a list of strings, got " +
                                 field->type_name());
      }
    }
    document.json.clear();
    document.json.shrink_to_fit();
  }

  void text_paragraphs(std::istream& in, const Take& take) const {
    std::string paragraph;
    int64_t number = 0, first_line = 0;
    const auto flush_paragraph = [&] {
      take(RawDocument{first_line, {}, {{paragraph}}});
      paragraph.clear();
    };
    for_each_line(in, config_.input, [&](std::string_view line) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t") == std::string_view::npos) {
        if (!paragraph.empty()) flush_paragraph();
        return;
      }
      if (paragraph.empty()) {
        first_line = number;
      } else {
        paragraph += '\n';
      }
      paragraph += line;
    });
    if (!paragraph.empty()) flush_paragraph();
  }

  // Megatron's Encoder: each piece (or, split, each sentence of it) one sequence.
  std::vector<EncodedDocument> encode(RawDocument& document) const {
    if (config_.input_format == InputFormat::kJsonLines) parse_json(document);
    std::vector<EncodedDocument> encoded;
    for (const std::vector<std::string>& pieces : document.pieces) {
      if (!config_.split_sentences) {
        encoded.push_back(encode_pieces(*tokenizer_, pieces, config_.append_eod, dtype_));
        continue;
      }
      std::vector<std::string> sentences;
      for (const std::string& piece : pieces) {
        for (std::string& sentence : split_sentences(piece, config_.keep_newlines)) {
          sentences.push_back(std::move(sentence));
        }
      }
      encoded.push_back(encode_pieces(*tokenizer_, sentences, config_.append_eod, dtype_));
    }
    std::vector<std::vector<std::string>>().swap(document.pieces);  // the text is freed here, not by the writer
    return encoded;
  }

  // The batch read so far goes to the workers; the oldest of those they have is written once more than
  // kBatchesInFlight are out (or, at the end, every one).
  void hand_over(bool last = false) {
    if (!reading_.empty()) {
      tokenizing_.push_back(pool_->submit(std::move(reading_)));
      reading_.clear();
    }
    while (!tokenizing_.empty() && (last || tokenizing_.size() > kBatchesInFlight)) {
      const std::shared_ptr<Batch> batch = std::move(tokenizing_.front());
      tokenizing_.pop_front();
      batch->finished.wait();
      write(*batch);
    }
  }

  // Writes `batch` in input order; the first bad document in input order is the error, as one worker would report
  // it. (Batches still being tokenized are finished before pool_ is destroyed.)
  void write(const Batch& batch) {
    for (std::size_t i = 0; i < batch.documents.size(); ++i) {
      if (!batch.errors[i].empty()) throw error(batch.documents[i].line, batch.errors[i]);
      for (std::size_t k = 0; k < builders_.size(); ++k) {
        const EncodedDocument& document = batch.encoded[i][k];
        builders_[k]->add_document_bytes(document.token_bytes, document.lengths);
        outputs_[k].tokens += static_cast<int64_t>(document.token_bytes.size() / dtype_size(dtype_));
      }
      progress();
    }
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
  DType dtype_ = DType::kUInt16;  // the outputs' token type, from the tokenizer's vocabulary size
  std::vector<PreprocessedDataset> outputs_;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders_;
  std::vector<RawDocument> reading_;
  std::deque<std::shared_ptr<Batch>> tokenizing_;  // handed to the pool, in input order
  int64_t documents_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::unique_ptr<TokenizingPool> pool_;  // last: its workers stop before what they read is destroyed
};

}  // namespace

std::vector<PreprocessedDataset> preprocess_data(const PreprocessConfig& config) { return Preprocessor(config).run(); }

}  // namespace bridge::training::datasets
