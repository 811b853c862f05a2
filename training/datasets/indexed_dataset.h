// Megatron-Core's indexed datasets: a `<prefix>.bin` file of raw token arrays and a `<prefix>.idx` file describing
// them (megatron/core/datasets/indexed_dataset.py). The reader memory-maps both files, checks every header field
// against the file sizes before trusting it, and reads the index arrays with memcpy because none of them is
// naturally aligned. The builder writes files byte-identical to Megatron-Core's IndexedDatasetBuilder.
//
//   IndexedDatasetBuilder builder("/data/corpus_text_document", optimal_dtype(tokenizer.vocab_size()));
//   builder.add_document(tokenizer.encode("Hello"));
//   builder.finalize();  // corpus_text_document.bin/.idx appear now, atomically
//
//   IndexedDataset dataset("/data/corpus_text_document");
//   std::vector<int64_t> tokens = dataset.get(/*index=*/0, /*offset=*/1, /*length=*/3);
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace bridge::utils {
class MappedFile;
}

namespace bridge::training::datasets {

/// Token element types, with the codes Megatron stores in the .idx header.
enum class DType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

/// Bytes per element.
std::size_t dtype_size(DType dtype);
/// NumPy's name for the type ("uint16", "int32", ...), for messages.
std::string dtype_name(DType dtype);
/// Megatron's DType.optimal_dtype: uint16 when every id fits (vocab_size < 65500), else int32.
DType optimal_dtype(int64_t vocab_size);

/// Appends `count` tokens to `out` in `dtype`'s bytes, as a .bin holds them (IndexedDatasetBuilder::add_document_bytes
/// takes them). Throws std::invalid_argument naming the first token `dtype` cannot hold and its position, appending
/// nothing, or when `dtype` is not an integer type.
void append_token_bytes(const int64_t* tokens, std::size_t count, DType dtype, std::vector<unsigned char>& out);

/// Where a token was found: sequence `sequence` (of document `document`), token `position` of it, and its value.
/// What a float32/float64 token that is NaN, infinite or outside int64 reads as: an id no vocabulary holds, so
/// dataset.validate_tokens and the sample check report it instead of training on an arbitrary id.
inline constexpr int64_t kNotAToken = std::numeric_limits<int64_t>::min();

struct TokenLocation {
  int64_t sequence = 0, document = 0, position = 0, value = 0;
};

/// A read-only, memory-mapped Megatron indexed dataset of `size()` token sequences.
///
/// The constructor validates the .idx header and arrays against both files' sizes (magic, version, dtype code,
/// counts, pointers that are the running sum of the lengths, a .bin of exactly the tokens the lengths and dtype give,
/// monotonic document indices) and throws std::runtime_error naming the file, the field, and the expected versus
/// actual value, so damaged files are errors and never out-of-bounds reads. A .bin that shrinks after opening is
/// reported by name when read (utils::MappedFile's SIGBUS handler).
/// Multimodal files (a trailing sequence_modes array) are accepted; the modes are ignored.
class IndexedDataset {
 public:
  /// Opens `<path_prefix>.idx` and `<path_prefix>.bin`.
  explicit IndexedDataset(std::string path_prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& path_prefix() const { return path_prefix_; }
  DType dtype() const { return dtype_; }
  /// Number of sequences (Megatron's len(dataset)).
  int64_t size() const { return static_cast<int64_t>(sequence_lengths_.size()); }
  /// Tokens per sequence.
  const std::vector<int32_t>& sequence_lengths() const { return sequence_lengths_; }
  /// Byte offset of each sequence in the .bin file.
  const std::vector<int64_t>& sequence_pointers() const { return sequence_pointers_; }
  /// Sequence boundaries of the documents: document d is sequences [document_indices[d], document_indices[d + 1]).
  const std::vector<int64_t>& document_indices() const { return document_indices_; }

  /// Tokens [offset, offset + length) of sequence `index`; length -1 = to the end of the sequence. Throws
  /// std::out_of_range when the range is not inside the sequence.
  std::vector<int64_t> get(int64_t index, int64_t offset = 0, int64_t length = -1) const;
  /// get() into caller memory: writes `length` (>= 0) tokens to `out` and returns the number written.
  int64_t read(int64_t index, int64_t offset, int64_t length, int64_t* out) const;

  /// Bytes of token data (the .bin's size).
  std::size_t num_bytes() const;
  /// The first token, in file order, that is negative or not below `limit`; nullopt when every token is in
  /// [0, limit). Reads the whole .bin once, in order (about 1 s per GB from the page cache).
  std::optional<TokenLocation> find_token_outside(int64_t limit) const;

 private:
  std::string path_prefix_;
  DType dtype_ = DType::kUInt8;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> sequence_pointers_;
  std::vector<int64_t> document_indices_;
  std::unique_ptr<const bridge::utils::MappedFile> bin_;
};

/// Writes a Megatron indexed dataset, byte-identical to Megatron-Core's IndexedDatasetBuilder: tokens go to a
/// temporary .bin as they come, and finalize() writes the .idx and renames both into place, so readers never see a
/// half-written dataset. Destroying an unfinalized builder removes its temporary files.
class IndexedDatasetBuilder {
 public:
  /// Writes `<path_prefix>.bin` and `<path_prefix>.idx` with tokens stored as `dtype` (an integer type).
  IndexedDatasetBuilder(std::string path_prefix, DType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  /// One document of one sequence (Megatron's add_item + end_document). Throws std::invalid_argument when a token
  /// does not fit the dtype.
  void add_document(const std::vector<int64_t>& tokens);
  /// One document of several sequences whose lengths sum to tokens.size() (Megatron's add_document(tensor, lengths);
  /// no lengths = an empty document, as Megatron's preprocess_data.py writes for empty text).
  void add_document(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths);
  /// add_document for tokens already in the builder's dtype (append_token_bytes), so that threads other than the
  /// writing one can convert them: preprocess_data's workers do.
  void add_document_bytes(const std::vector<unsigned char>& bytes, const std::vector<int64_t>& lengths);
  /// One sequence, not yet ending a document (Megatron's add_item).
  void add_item(const std::vector<int64_t>& tokens);
  /// Ends the current document (Megatron's end_document).
  void end_document();
  /// Writes the index and moves both files into place. The builder accepts nothing afterwards.
  void finalize();

  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(sequence_lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }

 private:
  void write_tokens(const std::vector<int64_t>& tokens);
  void check_lengths(const char* caller, const std::vector<int64_t>& lengths, int64_t tokens) const;
  void remove_temporaries() noexcept;

  std::string path_prefix_, bin_tmp_, idx_tmp_;
  DType dtype_;
  std::FILE* bin_file_ = nullptr;
  std::vector<int32_t> sequence_lengths_;
  std::vector<int64_t> document_indices_{0};
  std::vector<unsigned char> bytes_;  // write_tokens' conversion, kept between documents
  static constexpr std::size_t kBinBufferBytes = std::size_t{1} << 20;
  std::unique_ptr<char[]> bin_buffer_;  // bin_file_'s; closed before this member goes
  bool finalized_ = false;
};

}  // namespace bridge::training::datasets
