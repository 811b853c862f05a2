// Megatron indexed dataset reader (memory-mapped, validated) and builder.
#include "training/datasets/indexed_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "utils/mapped_file.h"

namespace bridge::training::datasets {
namespace {

// The .idx header: magic, version (uint64), dtype code (uint8), sequence count (uint64), document count (uint64).
constexpr char kMagic[] = "MMIDIDX\x00\x00";
constexpr std::size_t kMagicSize = 9;
constexpr uint64_t kVersion = 1;
constexpr std::size_t kHeaderSize = kMagicSize + 8 + 1 + 8 + 8;  // 34: the arrays start unaligned

std::string errno_text() { return std::strerror(errno); }

// Maps one of a dataset's files; a missing file is most often a wrong dataset.data_path.
std::unique_ptr<const bridge::utils::MappedFile> map_file(const std::string& path) {
  try {
    return std::make_unique<const bridge::utils::MappedFile>(path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("indexed dataset: ") + e.what() +
                             " (a dataset is the pair <prefix>.bin and <prefix>.idx; check dataset.data_path)");
  }
}

template <class T>
T load(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));  // unaligned-safe; the format and every supported host are little-endian
  return value;
}

template <class T>
std::vector<T> load_array(const unsigned char* at, uint64_t count) {
  std::vector<T> values(static_cast<std::size_t>(count));
  if (count > 0) std::memcpy(values.data(), at, static_cast<std::size_t>(count) * sizeof(T));
  return values;
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw std::runtime_error("indexed dataset: " + path + " is damaged or not a Megatron .idx file: " + what +
                           "; rebuild it with bridge-preprocess-data (or Megatron's tools/preprocess_data.py)");
}

// ", which fits <name> tokens (the dtype code at byte 17 is damaged?)" when `bytes` is exactly `tokens` elements of
// another width than `item`; empty otherwise.
std::string other_dtype_hint(uint64_t bytes, uint64_t tokens, uint64_t item) {
  if (tokens == 0 || bytes % tokens != 0 || bytes / tokens == item) return "";
  switch (bytes / tokens) {
    case 1:
    case 2:
    case 4:
    case 8:
      return " (" + std::to_string(bytes) + " bytes would be " + std::to_string(bytes / tokens) +
             "-byte tokens: is the dtype code at byte 17 damaged, or were the files written with another dtype?)";
    default:
      return "";
  }
}

bool is_valid_code(uint8_t code) { return code >= 1 && code <= 8; }

bool is_integer(DType dtype) { return dtype != DType::kFloat32 && dtype != DType::kFloat64; }

// A float token as an id: truncated toward zero as numpy's astype(int64) does, but a NaN, an infinity or a value past
// int64 (undefined behaviour for a plain cast) reads as kNotAToken, which no vocabulary holds.
int64_t float_token(double value) {
  constexpr double kTwoTo63 = 9223372036854775808.0;
  return value >= -kTwoTo63 && value < kTwoTo63 ? static_cast<int64_t>(value) : kNotAToken;
}

// Converts `count` elements of `dtype` at `src` (any alignment) to int64.
void convert(DType dtype, const unsigned char* src, int64_t count, int64_t* out) {
  switch (dtype) {
    case DType::kUInt8:
      for (int64_t i = 0; i < count; ++i) out[i] = src[i];
      return;
    case DType::kInt8:
      for (int64_t i = 0; i < count; ++i) out[i] = load<int8_t>(src + i);
      return;
    case DType::kInt16:
      for (int64_t i = 0; i < count; ++i) out[i] = load<int16_t>(src + 2 * i);
      return;
    case DType::kUInt16:
      for (int64_t i = 0; i < count; ++i) out[i] = load<uint16_t>(src + 2 * i);
      return;
    case DType::kInt32:
      for (int64_t i = 0; i < count; ++i) out[i] = load<int32_t>(src + 4 * i);
      return;
    case DType::kInt64:
      std::memcpy(out, src, static_cast<std::size_t>(count) * 8);
      return;
    case DType::kFloat32:
      for (int64_t i = 0; i < count; ++i) out[i] = float_token(load<float>(src + 4 * i));
      return;
    case DType::kFloat64:
      for (int64_t i = 0; i < count; ++i) out[i] = float_token(load<double>(src + 8 * i));
      return;
  }
}

// The smallest and largest value `dtype` holds, for the builder's range check.
std::pair<int64_t, int64_t> integer_range(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return {0, 255};
    case DType::kInt8:
      return {-128, 127};
    case DType::kInt16:
      return {-32768, 32767};
    case DType::kUInt16:
      return {0, 65535};
    case DType::kInt32:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default:
      return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

void write_all(std::FILE* file, const void* data, std::size_t bytes, const std::string& path) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file) != bytes) {
    throw std::runtime_error("IndexedDatasetBuilder: writing " + path + " failed: " + errno_text() +
                             " (is the disk full?)");
  }
}

}  // namespace

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
      return 1;
    case DType::kInt16:
    case DType::kUInt16:
      return 2;
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  throw std::invalid_argument("dtype_size: unknown DType code " + std::to_string(static_cast<int>(dtype)));
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat32:
      return "float32";
    case DType::kUInt16:
      return "uint16";
  }
  return "unknown(" + std::to_string(static_cast<int>(dtype)) + ")";
}

DType optimal_dtype(int64_t vocab_size) {
  if (vocab_size < 1) {
    throw std::invalid_argument("optimal_dtype: vocab_size must be >= 1, got " + std::to_string(vocab_size));
  }
  return vocab_size < 65500 ? DType::kUInt16 : DType::kInt32;
}

namespace {

template <typename T>
void narrow(const int64_t* tokens, std::size_t count, unsigned char* out) {
  for (std::size_t i = 0; i < count; ++i) {
    const auto value = static_cast<T>(tokens[i]);
    std::memcpy(out + i * sizeof(T), &value, sizeof(T));
  }
}

}  // namespace

void append_token_bytes(const int64_t* tokens, std::size_t count, DType dtype, std::vector<unsigned char>& out) {
  if (!is_valid_code(static_cast<uint8_t>(dtype)) || !is_integer(dtype)) {
    throw std::invalid_argument("append_token_bytes: tokens need an integer dtype, got " + dtype_name(dtype));
  }
  const auto [lowest, highest] = integer_range(dtype);
  for (std::size_t i = 0; i < count; ++i) {
    if (tokens[i] < lowest || tokens[i] > highest) {
      throw std::invalid_argument("token " + std::to_string(tokens[i]) + " (position " + std::to_string(i) +
                                  ") does not fit " + dtype_name(dtype));
    }
  }
  const std::size_t at = out.size();
  out.resize(at + count * dtype_size(dtype));
  switch (dtype_size(dtype)) {
    case 1:
      return narrow<uint8_t>(tokens, count, out.data() + at);
    case 2:
      return narrow<uint16_t>(tokens, count, out.data() + at);
    case 4:
      return narrow<uint32_t>(tokens, count, out.data() + at);
    default:
      return narrow<uint64_t>(tokens, count, out.data() + at);
  }
}

IndexedDataset::IndexedDataset(std::string path_prefix) : path_prefix_(std::move(path_prefix)) {
  const std::string idx_path = path_prefix_ + ".idx";
  const std::unique_ptr<const bridge::utils::MappedFile> idx = map_file(idx_path);
  const unsigned char* p = idx->data();
  const uint64_t idx_size = idx->size();
  const auto expect_size = [&](const char* field, uint64_t needed) {
    if (idx_size < needed) {
      corrupt(idx_path, std::string(field) + " needs the file to hold at least " + std::to_string(needed) +
                            " bytes, but it has " + std::to_string(idx_size) + " (truncated?)");
    }
  };

  expect_size("the header", kHeaderSize);
  if (std::memcmp(p, kMagic, kMagicSize) != 0) corrupt(idx_path, "bad magic (expected \"MMIDIDX\\0\\0\")");
  const auto version = load<uint64_t>(p + 9);
  if (version != kVersion) {
    corrupt(idx_path, "version is " + std::to_string(version) + ", expected " + std::to_string(kVersion));
  }
  const uint8_t code = p[17];
  if (!is_valid_code(code)) {
    corrupt(idx_path, "dtype code is " + std::to_string(code) + ", expected 1..8 (Megatron's DType codes)");
  }
  dtype_ = static_cast<DType>(code);
  const auto sequence_count = load<uint64_t>(p + 18);
  const auto document_count = load<uint64_t>(p + 26);

  // Compare counts against what the file can hold before any multiplication, so huge counts cannot overflow.
  const uint64_t room = idx_size - kHeaderSize;
  if (sequence_count > room / 12) {
    corrupt(idx_path, "sequence_count " + std::to_string(sequence_count) + " needs " +
                          (sequence_count > room ? std::string("more") : std::to_string(sequence_count * 12)) +
                          " bytes of lengths and pointers, but only " + std::to_string(room) +
                          " bytes follow the header (truncated?)");
  }
  const uint64_t after_sequences = room - sequence_count * 12;
  if (document_count > after_sequences / 8) {
    corrupt(idx_path,
            "document_count " + std::to_string(document_count) + " needs " +
                (document_count > after_sequences ? std::string("more") : std::to_string(document_count * 8)) +
                " bytes of document indices, but only " + std::to_string(after_sequences) +
                " bytes are left (truncated?)");
  }
  const uint64_t expected = kHeaderSize + sequence_count * 12 + document_count * 8;
  if (idx_size != expected && idx_size != expected + sequence_count) {
    corrupt(idx_path, "the file has " + std::to_string(idx_size) + " bytes, but its counts (" +
                          std::to_string(sequence_count) + " sequences, " + std::to_string(document_count) +
                          " document indices) give " + std::to_string(expected) + " (or " +
                          std::to_string(expected + sequence_count) + " with sequence modes)");
  }
  if (document_count < 1) corrupt(idx_path, "document_count is 0; it counts the leading 0 of document_indices");

  sequence_lengths_ = load_array<int32_t>(p + kHeaderSize, sequence_count);
  sequence_pointers_ = load_array<int64_t>(p + kHeaderSize + 4 * sequence_count, sequence_count);
  document_indices_ = load_array<int64_t>(p + kHeaderSize + 12 * sequence_count, document_count);

  bin_ = map_file(path_prefix_ + ".bin");
  const uint64_t bin_size = bin_->size();
  const auto item = static_cast<uint64_t>(dtype_size(dtype_));
  // Megatron writes the sequences back to back: each pointer is the bytes of the sequences before it, and the .bin
  // ends with the last one. Holding the files to exactly that catches a flipped bit in any length or pointer and a
  // dtype code that does not match the .bin, which would otherwise train on in-range garbage.
  uint64_t tokens_before = 0;
  for (std::size_t i = 0; i < sequence_lengths_.size(); ++i) {
    const int32_t length = sequence_lengths_[i];
    const int64_t pointer = sequence_pointers_[i];
    if (length < 0) corrupt(idx_path, "sequence_lengths[" + std::to_string(i) + "] is " + std::to_string(length));
    if (pointer < 0 || static_cast<uint64_t>(pointer) > bin_size ||
        static_cast<uint64_t>(length) * item > bin_size - static_cast<uint64_t>(pointer)) {
      const uint64_t end = static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * item;
      throw std::runtime_error("indexed dataset: sequence " + std::to_string(i) + " of " + idx_path + " spans bytes [" +
                               std::to_string(pointer) + ", " + (pointer < 0 ? std::string("?") : std::to_string(end)) +
                               ") of " + bin_->path() + ", which has " + std::to_string(bin_size) +
                               " bytes (truncated .bin, or .bin and .idx from different runs?); rebuild the dataset");
    }
    if (static_cast<uint64_t>(pointer) != tokens_before * item) {
      corrupt(idx_path, "sequence_pointers[" + std::to_string(i) + "] is " + std::to_string(pointer) +
                            ", but the sequences before it hold " + std::to_string(tokens_before) +
                            " tokens = " + std::to_string(tokens_before * item) + " bytes of " + dtype_name(dtype_) +
                            other_dtype_hint(static_cast<uint64_t>(pointer), tokens_before, item) +
                            " (a damaged sequence length or pointer)");
    }
    tokens_before += static_cast<uint64_t>(length);
  }
  if (tokens_before * item != bin_size) {
    corrupt(idx_path, "its sequences hold " + std::to_string(tokens_before) +
                          " tokens = " + std::to_string(tokens_before * item) + " bytes of " + dtype_name(dtype_) +
                          ", but " + bin_->path() + " has " + std::to_string(bin_size) + " bytes" +
                          other_dtype_hint(bin_size, tokens_before, item));
  }
  const auto n = static_cast<int64_t>(sequence_count);
  if (document_indices_.front() != 0) {
    corrupt(idx_path, "document_indices[0] is " + std::to_string(document_indices_.front()) + ", expected 0");
  }
  for (std::size_t d = 1; d < document_indices_.size(); ++d) {
    if (document_indices_[d] < document_indices_[d - 1] || document_indices_[d] > n) {
      corrupt(idx_path, "document_indices[" + std::to_string(d) + "] is " + std::to_string(document_indices_[d]) +
                            "; document indices must be non-decreasing sequence numbers in [0, " + std::to_string(n) +
                            "]");
    }
  }
}

IndexedDataset::~IndexedDataset() = default;

int64_t IndexedDataset::read(int64_t index, int64_t offset, int64_t length, int64_t* out) const {
  if (index < 0 || index >= size()) {
    throw std::out_of_range("IndexedDataset::get: sequence " + std::to_string(index) + " is not in [0, " +
                            std::to_string(size()) + ") in " + path_prefix_ + ".idx");
  }
  const int64_t sequence_length = sequence_lengths_[static_cast<std::size_t>(index)];
  if (offset < 0 || length < 0 || offset > sequence_length || length > sequence_length - offset) {
    throw std::out_of_range("IndexedDataset::get: tokens [" + std::to_string(offset) + ", " +
                            std::to_string(offset + length) + ") are not inside sequence " + std::to_string(index) +
                            " of " + path_prefix_ + ", which has " + std::to_string(sequence_length) + " tokens");
  }
  const std::size_t item = dtype_size(dtype_);
  const auto start = static_cast<std::size_t>(sequence_pointers_[static_cast<std::size_t>(index)]) +
                     static_cast<std::size_t>(offset) * item;
  if (length > 0) convert(dtype_, bin_->data() + start, length, out);
  return length;
}

std::size_t IndexedDataset::num_bytes() const { return bin_->size(); }

std::optional<TokenLocation> IndexedDataset::find_token_outside(int64_t limit) const {
  // Chunks converted to int64 and reduced to their minimum and maximum (both loops vectorize); a chunk is searched
  // token by token only when it holds a bad one.
  constexpr int64_t kChunk = 4096;
  std::vector<int64_t> buffer(kChunk);
  const auto item = static_cast<int64_t>(dtype_size(dtype_));
  for (int64_t s = 0; s < size(); ++s) {
    const int64_t length = sequence_lengths_[static_cast<std::size_t>(s)];
    const unsigned char* at = bin_->data() + sequence_pointers_[static_cast<std::size_t>(s)];
    for (int64_t begin = 0; begin < length; begin += kChunk) {
      const int64_t count = std::min(kChunk, length - begin);
      convert(dtype_, at + begin * item, count, buffer.data());
      int64_t lowest = buffer[0], highest = buffer[0];
      for (int64_t i = 1; i < count; ++i) {
        lowest = std::min(lowest, buffer[static_cast<std::size_t>(i)]);
        highest = std::max(highest, buffer[static_cast<std::size_t>(i)]);
      }
      if (lowest >= 0 && highest < limit) continue;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t value = buffer[static_cast<std::size_t>(i)];
        if (value >= 0 && value < limit) continue;
        const auto after = std::upper_bound(document_indices_.begin(), document_indices_.end(), s);
        return TokenLocation{s, static_cast<int64_t>(after - document_indices_.begin()) - 1, begin + i, value};
      }
    }
  }
  return std::nullopt;
}

std::vector<int64_t> IndexedDataset::get(int64_t index, int64_t offset, int64_t length) const {
  if (length == -1 && index >= 0 && index < size())
    length = sequence_lengths_[static_cast<std::size_t>(index)] - offset;
  std::vector<int64_t> tokens(static_cast<std::size_t>(std::max<int64_t>(length, 0)));
  read(index, offset, length, tokens.data());
  return tokens;
}

IndexedDatasetBuilder::IndexedDatasetBuilder(std::string path_prefix, DType dtype)
    : path_prefix_(std::move(path_prefix)), dtype_(dtype) {
  if (!is_valid_code(static_cast<uint8_t>(dtype)) || !is_integer(dtype)) {
    throw std::invalid_argument("IndexedDatasetBuilder: tokens need an integer dtype, got " + dtype_name(dtype));
  }
  // Temporary names unique to this host, process and builder, so concurrent builders of the same prefix (ranks
  // preparing one corpus, on one machine or on a shared file system) never write into each other's files.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string suffix = ".tmp." + std::string(host) + "." + std::to_string(::getpid()) + "." +
                             std::to_string(reinterpret_cast<uintptr_t>(this));
  bin_tmp_ = path_prefix_ + ".bin" + suffix;
  idx_tmp_ = path_prefix_ + ".idx" + suffix;
  bin_buffer_ = std::make_unique<char[]>(kBinBufferBytes);
  bin_file_ = std::fopen(bin_tmp_.c_str(), "wb");
  if (bin_file_ == nullptr) {
    throw std::runtime_error("IndexedDatasetBuilder: cannot create " + bin_tmp_ + ": " + errno_text() +
                             " (does the output folder exist and is it writable?)");
  }
  // Documents are a few KB: a 1 MiB buffer writes them in a few large calls rather than one per 4 KB. (glibc ignores
  // the size unless it is given the buffer, allocated above so that nothing can throw after the file is open.)
  std::setvbuf(bin_file_, bin_buffer_.get(), _IOFBF, kBinBufferBytes);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (!finalized_) remove_temporaries();
}

void IndexedDatasetBuilder::remove_temporaries() noexcept {
  if (bin_file_ != nullptr) std::fclose(bin_file_);
  bin_file_ = nullptr;
  std::remove(bin_tmp_.c_str());
  std::remove(idx_tmp_.c_str());
}

void IndexedDatasetBuilder::write_tokens(const std::vector<int64_t>& tokens) {
  if (finalized_) throw std::logic_error("IndexedDatasetBuilder: " + path_prefix_ + " was already finalized");
  bytes_.clear();
  try {
    append_token_bytes(tokens.data(), tokens.size(), dtype_, bytes_);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("IndexedDatasetBuilder: document " + std::to_string(num_documents()) + ": " + e.what() +
                                "; use a wider dtype (optimal_dtype of the tokenizer's vocab_size)");
  }
  write_all(bin_file_, bytes_.data(), bytes_.size(), bin_tmp_);
}

void IndexedDatasetBuilder::add_item(const std::vector<int64_t>& tokens) {
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<int32_t>::max())) {
    throw std::invalid_argument("IndexedDatasetBuilder: a sequence of " + std::to_string(tokens.size()) +
                                " tokens exceeds the format's int32 sequence length; split the document");
  }
  write_tokens(tokens);
  sequence_lengths_.push_back(static_cast<int32_t>(tokens.size()));
}

void IndexedDatasetBuilder::end_document() {
  if (finalized_) throw std::logic_error("IndexedDatasetBuilder: " + path_prefix_ + " was already finalized");
  document_indices_.push_back(num_sequences());
}

void IndexedDatasetBuilder::add_document(const std::vector<int64_t>& tokens) {
  add_item(tokens);
  end_document();
}

void IndexedDatasetBuilder::check_lengths(const char* caller, const std::vector<int64_t>& lengths,
                                          int64_t tokens) const {
  int64_t total = 0;
  for (const int64_t length : lengths) {
    if (length < 0 || length > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument(std::string("IndexedDatasetBuilder::") + caller + ": sequence length " +
                                  std::to_string(length) + " is not in [0, 2^31)");
    }
    total += length;
  }
  if (total != tokens) {
    throw std::invalid_argument(std::string("IndexedDatasetBuilder::") + caller + ": the lengths sum to " +
                                std::to_string(total) + " but the document has " + std::to_string(tokens) + " tokens");
  }
}

void IndexedDatasetBuilder::add_document(const std::vector<int64_t>& tokens, const std::vector<int64_t>& lengths) {
  if (finalized_) throw std::logic_error("IndexedDatasetBuilder: " + path_prefix_ + " was already finalized");
  check_lengths("add_document", lengths, static_cast<int64_t>(tokens.size()));
  write_tokens(tokens);
  for (const int64_t length : lengths) sequence_lengths_.push_back(static_cast<int32_t>(length));
  end_document();
}

void IndexedDatasetBuilder::add_document_bytes(const std::vector<unsigned char>& bytes,
                                               const std::vector<int64_t>& lengths) {
  if (finalized_) throw std::logic_error("IndexedDatasetBuilder: " + path_prefix_ + " was already finalized");
  const std::size_t item = dtype_size(dtype_);
  if (bytes.size() % item != 0) {
    throw std::invalid_argument("IndexedDatasetBuilder::add_document_bytes: " + std::to_string(bytes.size()) +
                                " bytes are not whole " + dtype_name(dtype_) + " tokens");
  }
  check_lengths("add_document_bytes", lengths, static_cast<int64_t>(bytes.size() / item));
  write_all(bin_file_, bytes.data(), bytes.size(), bin_tmp_);
  for (const int64_t length : lengths) sequence_lengths_.push_back(static_cast<int32_t>(length));
  end_document();
}

void IndexedDatasetBuilder::finalize() {
  if (finalized_) throw std::logic_error("IndexedDatasetBuilder: " + path_prefix_ + " was already finalized");
  const int close_status = std::fclose(bin_file_);
  bin_file_ = nullptr;
  if (close_status != 0) {
    remove_temporaries();
    throw std::runtime_error("IndexedDatasetBuilder: closing " + bin_tmp_ + " failed (is the disk full?)");
  }

  // Megatron's _IndexWriter: header, lengths (int32), byte pointers (int64, exclusive prefix sum), document indices.
  const auto n = static_cast<uint64_t>(sequence_lengths_.size());
  const auto d = static_cast<uint64_t>(document_indices_.size());
  std::vector<unsigned char> idx(kHeaderSize + 12 * n + 8 * d);
  unsigned char* at = idx.data();
  const auto put = [&at](const void* data, std::size_t bytes) {
    std::memcpy(at, data, bytes);
    at += bytes;
  };
  put(kMagic, kMagicSize);
  put(&kVersion, 8);
  const auto code = static_cast<uint8_t>(dtype_);
  put(&code, 1);
  put(&n, 8);
  put(&d, 8);
  if (n > 0) put(sequence_lengths_.data(), 4 * n);
  int64_t pointer = 0;
  const auto item = static_cast<int64_t>(dtype_size(dtype_));
  for (const int32_t length : sequence_lengths_) {
    put(&pointer, 8);
    pointer += length * item;
  }
  put(document_indices_.data(), 8 * d);

  try {
    std::FILE* file = std::fopen(idx_tmp_.c_str(), "wb");
    if (file == nullptr)
      throw std::runtime_error("IndexedDatasetBuilder: cannot create " + idx_tmp_ + ": " + errno_text());
    write_all(file, idx.data(), idx.size(), idx_tmp_);
    if (std::fclose(file) != 0) throw std::runtime_error("IndexedDatasetBuilder: closing " + idx_tmp_ + " failed");
    // The old .idx goes first, then the old .bin, then the new .bin and .idx are renamed in: a reader never pairs a
    // new .bin with an old .idx (whose sizes might happen to fit). Removing the old .bin, rather than renaming over
    // it, also spares the run ext4's synchronous write-back of a file that replaces another (auto_da_alloc: 15 ms per
    // 10 MB here), a flush that an output written for the first time never got either. Nothing is fsync'd, as in
    // Megatron's builder: after a crash the reader's size checks name a .bin cut short.
    std::remove((path_prefix_ + ".idx").c_str());
    std::remove((path_prefix_ + ".bin").c_str());
    for (const auto& [from, to] :
         {std::pair{bin_tmp_, path_prefix_ + ".bin"}, std::pair{idx_tmp_, path_prefix_ + ".idx"}}) {
      if (std::rename(from.c_str(), to.c_str()) != 0) {
        throw std::runtime_error("IndexedDatasetBuilder: cannot rename " + from + " to " + to + ": " + errno_text());
      }
    }
  } catch (...) {
    remove_temporaries();
    throw;
  }
  finalized_ = true;
}

}  // namespace bridge::training::datasets
