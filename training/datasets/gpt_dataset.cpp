// Megatron's GPTDataset indices, their cache, and the train/valid/test builder.
#include "training/datasets/gpt_dataset.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "training/config/config.h"
#include "training/datasets/blended_dataset.h"
#include "training/datasets/md5.h"
#include "training/datasets/npy.h"
#include "training/datasets/numpy_random_state.h"
#include "utils/durable_file.h"
#include "utils/logging.h"

namespace bridge::training::datasets {
namespace {

constexpr int64_t kExtraToken = 1;  // Megatron's add_extra_token_to_sequence: the label after the last input

int64_t tokens_in(const IndexedDataset& dataset, SequenceRange range) {
  int64_t tokens = 0;
  for (int64_t i = range.begin; i < range.end; ++i) tokens += dataset.sequence_lengths()[static_cast<std::size_t>(i)];
  return tokens;
}

// Megatron's _get_num_epochs: the fewest epochs holding num_samples samples plus the extra token.
int64_t num_epochs_for(int64_t num_samples, int64_t seq_length, int64_t tokens_per_epoch) {
  const int64_t requested = num_samples * seq_length + kExtraToken;
  return std::max<int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
}

// The MD5 of the sequence lengths, which with the config determine the indices: a dataset rebuilt with different
// documents gets new cache files instead of stale ones.
std::string lengths_digest(const IndexedDataset& dataset) {
  const auto& lengths = dataset.sequence_lengths();
  return md5_hex(std::string_view(reinterpret_cast<const char*>(lengths.data()), lengths.size() * sizeof(int32_t)));
}

// The cache's MD5 digests of its .npy files, next to them.
constexpr const char* kDigestsName = "indices.md5";

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

std::string default_cache_dir(const std::string& path_prefix) {
  const std::filesystem::path folder = std::filesystem::path(path_prefix).parent_path();
  return (folder / "cache" / "GPTDataset_indices").string();
}

}  // namespace

std::string split_name(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kValid:
      return "valid";
    case Split::kTest:
      return "test";
  }
  return "unknown";
}

std::vector<double> parse_split(const std::string& split) {
  // Megatron: re.findall(r"[.0-9]+", split), padded with zeros to three parts, normalised by their sum.
  std::vector<double> parts;
  for (std::size_t i = 0; i < split.size();) {
    const auto is_part = [&](std::size_t k) { return split[k] == '.' || (split[k] >= '0' && split[k] <= '9'); };
    if (!is_part(i)) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < split.size() && is_part(end)) ++end;
    const std::string text = split.substr(i, end - i);
    char* parsed = nullptr;
    const double value = std::strtod(text.c_str(), &parsed);
    if (parsed != text.c_str() + text.size()) {
      throw std::invalid_argument("dataset.split \"" + split + "\": \"" + text + "\" is not a number");
    }
    parts.push_back(value);
    i = end;
  }
  if (split.find('-') != std::string::npos) {
    throw std::invalid_argument("dataset.split \"" + split + "\" must not hold negative proportions");
  }
  if (parts.empty() || parts.size() > 3) {
    throw std::invalid_argument("dataset.split \"" + split +
                                "\" must hold one to three train/valid/test proportions, like \"969,30,1\"");
  }
  parts.resize(3, 0.0);
  const double sum = parts[0] + parts[1] + parts[2];
  if (!(sum > 0.0) || !std::isfinite(sum)) {
    throw std::invalid_argument("dataset.split \"" + split + "\" must have a positive sum, like \"969,30,1\"");
  }
  for (double& part : parts) part /= sum;
  return parts;
}

std::array<SequenceRange, 3> split_ranges(const std::vector<double>& proportions, int64_t num_sequences) {
  if (proportions.size() != 3) throw std::invalid_argument("split_ranges: expected three proportions");
  // Megatron's convert_split_vector_to_split_matrix sums left to right, then int(round(bound * float(N))); Python's
  // round goes half to even, which std::nearbyint does in the default rounding mode.
  std::array<SequenceRange, 3> ranges;
  double cumulative = 0.0;
  for (std::size_t i = 0; i < 3; ++i) {
    const double begin = cumulative;
    cumulative += proportions[i];
    if (begin == cumulative) continue;  // a zero proportion: Megatron's split matrix holds None, no dataset
    ranges[i].begin = static_cast<int64_t>(std::nearbyint(begin * static_cast<double>(num_sequences)));
    ranges[i].end = static_cast<int64_t>(std::nearbyint(cumulative * static_cast<double>(num_sequences)));
  }
  return ranges;
}

IndexedGPTDataset::IndexedGPTDataset(std::shared_ptr<const IndexedDataset> dataset, Split split, SequenceRange range,
                                     int64_t num_samples, GPTDatasetConfig config)
    : dataset_(std::move(dataset)),
      split_(split),
      range_(range),
      num_samples_(num_samples),
      config_(std::move(config)) {
  if (!dataset_) throw std::invalid_argument("IndexedGPTDataset: no indexed dataset");
  const std::string where = "the " + split_name(split_) + " split of " + dataset_->path_prefix();
  if (config_.seq_length < 1) {
    throw std::invalid_argument("IndexedGPTDataset: seq_length must be >= 1 (model.seq_length), got " +
                                std::to_string(config_.seq_length));
  }
  if (num_samples_ < 0) throw std::invalid_argument("IndexedGPTDataset: num_samples must be >= 0 for " + where);
  const DType dtype = dataset_->dtype();
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64) {
    throw std::invalid_argument("IndexedGPTDataset: " + dataset_->path_prefix() + ".idx holds " +
                                std::string(dtype_name(dtype)) +
                                " values, not token ids; preprocess the text with bridge-preprocess-data");
  }
  if (range_.begin < 0 || range_.end > dataset_->size() || range_.begin > range_.end) {
    throw std::invalid_argument("IndexedGPTDataset: sequences [" + std::to_string(range_.begin) + ", " +
                                std::to_string(range_.end) + ") are not inside the " +
                                std::to_string(dataset_->size()) + " sequences of " + dataset_->path_prefix());
  }
  if (range_.end > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("IndexedGPTDataset: " + dataset_->path_prefix() +
                                " has more sequences than Megatron's int32 document index holds");
  }
  if (config_.random_seed > 0xFFFFFFFFULL) {
    throw std::invalid_argument("rng.seed " + std::to_string(config_.random_seed) +
                                " is not in [0, 2^32), which Megatron's sample shuffling (NumPy's RandomState) needs");
  }
  const int64_t tokens_per_epoch = tokens_in(*dataset_, range_);
  if (tokens_per_epoch < 2) {
    throw std::invalid_argument("IndexedGPTDataset: " + where + " holds " + std::to_string(range_.size()) +
                                " sequences with " + std::to_string(tokens_per_epoch) +
                                " tokens, but a sample needs at least 2; give more data or change dataset.split");
  }
  const int64_t seq = config_.seq_length;
  num_epochs_ = num_epochs_for(num_samples_, seq, tokens_per_epoch);

  // Megatron's separate final epoch: when the last epoch would be used less than 80%, its documents are shuffled on
  // their own (and its samples too), so the partial epoch does not take documents from the earlier ones.
  bool separate_final_epoch = false;
  int64_t samples_sans_final_epoch = 0;
  if (num_epochs_ > 1) {
    samples_sans_final_epoch = ((num_epochs_ - 1) * tokens_per_epoch - kExtraToken) / seq;
    const int64_t samples_from_final_epoch = num_samples_ - samples_sans_final_epoch;
    const int64_t samples_per_epoch = (tokens_per_epoch - kExtraToken) / seq;
    if (samples_from_final_epoch < 0 || samples_from_final_epoch > samples_per_epoch + 1) {
      throw std::logic_error("IndexedGPTDataset: inconsistent epoch arithmetic for " + where);
    }
    separate_final_epoch =
        samples_from_final_epoch < static_cast<int64_t>(0.80 * static_cast<double>(samples_per_epoch));
  }

  nlohmann::ordered_json description;
  description["class"] = "GPTDataset";
  description["dataset_path"] = dataset_->path_prefix();
  description["num_samples"] = num_samples_;
  description["index_split"] = split_name(split_);
  description["indices"] = {range_.begin, range_.end};
  description["random_seed"] = config_.random_seed;
  description["sequence_length"] = seq;
  description["split"] = config_.split;
  description["add_extra_token_to_sequence"] = true;
  description["sequence_lengths_md5"] = lengths_digest(*dataset_);
  description_ = description.dump(4);

  if (config_.use_cache) {
    const std::string dir =
        config_.path_to_cache.empty() ? default_cache_dir(dataset_->path_prefix()) : config_.path_to_cache;
    cache_path_prefix_ =
        (std::filesystem::path(dir) / (md5_hex(description_) + "-GPTDataset-" + split_name(split_) + "-")).string();
    if (load_cache()) {
      loaded_from_cache_ = true;
      bridge::utils::logger().info("loaded the GPTDataset {} indices from {}*: {} samples, {} epochs",
                                   split_name(split_), cache_path_prefix_, size(), num_epochs_);
      return;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  build_indices(tokens_per_epoch, separate_final_epoch, samples_sans_final_epoch);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bridge::utils::logger().info("built the GPTDataset {} indices of {}: {} samples, {} epochs{}, {:.3f} s",
                               split_name(split_), dataset_->path_prefix(), size(), num_epochs_,
                               separate_final_epoch ? " (final epoch separate)" : "", seconds);
  if (size() == 0) {
    throw std::invalid_argument("IndexedGPTDataset: " + where + " holds " + std::to_string(tokens_per_epoch) +
                                " tokens, too few for one sample of seq_length + 1 = " + std::to_string(seq + 1) +
                                " tokens, and no samples were requested to repeat it; ask for num_samples >= 1");
  }
  if (config_.use_cache) save_cache();
}

void IndexedGPTDataset::build_indices(int64_t tokens_per_epoch, bool separate_final_epoch,
                                      int64_t samples_sans_final_epoch) {
  // One RandomState stream, in Megatron's order: the document index (all epochs, or the first e-1 then the last),
  // then the shuffle index (the same split).
  NumpyRandomState random(config_.random_seed);
  const auto tiled = [&](int64_t epochs) {
    std::vector<int64_t> index;
    index.reserve(static_cast<std::size_t>(epochs * range_.size()));
    for (int64_t e = 0; e < epochs; ++e) {
      for (int64_t i = range_.begin; i < range_.end; ++i) index.push_back(i);
    }
    random.shuffle(index);
    return index;
  };
  if (separate_final_epoch) {
    document_index_ = tiled(num_epochs_ - 1);
    const std::vector<int64_t> last = tiled(1);
    document_index_.insert(document_index_.end(), last.begin(), last.end());
  } else {
    document_index_ = tiled(num_epochs_);
  }

  // helpers.cpp build_sample_idx: each sample consumes seq_length + 1 tokens across documents and the next one
  // starts on its last token.
  const int64_t seq = config_.seq_length;
  const int64_t samples = (num_epochs_ * tokens_per_epoch - kExtraToken) / seq;
  const auto& lengths = dataset_->sequence_lengths();
  sample_index_.assign(static_cast<std::size_t>(2 * (samples + 1)), 0);
  int64_t position = 0, offset = 0;
  for (int64_t s = 1; s <= samples; ++s) {
    int64_t remaining = seq + kExtraToken;
    while (remaining != 0) {
      const int64_t length =
          lengths[static_cast<std::size_t>(document_index_[static_cast<std::size_t>(position)])] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - kExtraToken;
        remaining = 0;
      } else {
        if (position + 1 == static_cast<int64_t>(document_index_.size())) {
          throw std::logic_error("IndexedGPTDataset: ran out of documents building the sample index");
        }
        ++position;
        offset = 0;
      }
    }
    sample_index_[static_cast<std::size_t>(2 * s)] = position;
    sample_index_[static_cast<std::size_t>(2 * s + 1)] = offset;
  }

  const auto arange = [](int64_t begin, int64_t end) {
    std::vector<int64_t> values(static_cast<std::size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) values[static_cast<std::size_t>(i - begin)] = i;
    return values;
  };
  const int64_t first = separate_final_epoch ? samples_sans_final_epoch : samples;
  shuffle_index_ = arange(0, first);
  random.shuffle(shuffle_index_);
  if (first != samples) {
    std::vector<int64_t> last = arange(first, samples);
    random.shuffle(last);
    shuffle_index_.insert(shuffle_index_.end(), last.begin(), last.end());
  }
}

torch::Tensor IndexedGPTDataset::sample(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw std::out_of_range("IndexedGPTDataset::sample: index " + std::to_string(index) + " is not in [0, " +
                            std::to_string(size()) + ")");
  }
  const auto at = [](const std::vector<int64_t>& values, int64_t i) { return values[static_cast<std::size_t>(i)]; };
  const int64_t j = at(shuffle_index_, index);
  const int64_t d0 = at(sample_index_, 2 * j), o0 = at(sample_index_, 2 * j + 1);
  const int64_t d1 = at(sample_index_, 2 * j + 2), o1 = at(sample_index_, 2 * j + 3);
  const int64_t total = config_.seq_length + kExtraToken;
  torch::Tensor tokens = torch::empty({total}, torch::kLong);
  int64_t* out = tokens.data_ptr<int64_t>();
  int64_t filled = 0;
  const auto take = [&](int64_t position, int64_t offset, int64_t length) {
    if (filled + length > total) {
      throw std::runtime_error("IndexedGPTDataset: sample " + std::to_string(index) + " of " + dataset_->path_prefix() +
                               " overflows seq_length + 1 tokens; the index cache " + cache_path_prefix_ +
                               "* is inconsistent, delete it");
    }
    filled += dataset_->read(at(document_index_, position), offset, length, out + filled);
  };
  if (d0 == d1) {
    take(d0, o0, o1 - o0 + kExtraToken);
  } else {
    const auto& lengths = dataset_->sequence_lengths();
    take(d0, o0, lengths[static_cast<std::size_t>(at(document_index_, d0))] - o0);
    for (int64_t d = d0 + 1; d < d1; ++d) take(d, 0, lengths[static_cast<std::size_t>(at(document_index_, d))]);
    take(d1, 0, o1 + kExtraToken);
  }
  if (filled != total) {
    throw std::runtime_error("IndexedGPTDataset: sample " + std::to_string(index) + " of " + dataset_->path_prefix() +
                             " has " + std::to_string(filled) +
                             " tokens instead of seq_length + 1 = " + std::to_string(total));
  }
  if (config_.vocab_size > 0) {
    for (int64_t i = 0; i < total; ++i) {
      if (out[i] < 0 || out[i] >= config_.vocab_size) {
        throw std::runtime_error("IndexedGPTDataset: " + dataset_->path_prefix() + " holds token id " +
                                 std::to_string(out[i]) + ", which is not below model.vocab_size (" +
                                 std::to_string(config_.vocab_size) +
                                 "); set model.vocab_size to at least the tokenizer's vocabulary size");
      }
    }
  }
  return tokens;
}

bool IndexedGPTDataset::load_cache() {
  const std::string description_path = cache_path_prefix_ + "description.txt";
  const std::string digests_path = cache_path_prefix_ + kDigestsName;
  const std::array<std::string, 3> names = {"document_index.npy", "sample_index.npy", "shuffle_index.npy"};
  std::array<std::string, 3> paths;
  for (std::size_t i = 0; i < 3; ++i) paths[i] = cache_path_prefix_ + names[i];
  std::error_code error;
  if (!std::filesystem::is_regular_file(description_path, error)) return false;
  const auto reject = [&](const std::string& why) {
    bridge::utils::logger().warn("the cached GPTDataset {} indices {}* are unusable ({}); rebuilding them",
                                 split_name(split_), cache_path_prefix_, why);
    document_index_.clear();
    sample_index_.clear();
    shuffle_index_.clear();
    return false;
  };
  try {
    const std::string cached = bridge::utils::read_file(description_path);
    if (cached != description_) return reject(description_path + " describes another dataset");
    // Values can be damaged in range (a flipped bit that still names a valid sample): the digests written with the
    // files catch what the range checks below cannot.
    const std::string digests = bridge::utils::read_file(digests_path);
    std::array<std::string, 3> bytes;
    for (std::size_t i = 0; i < 3; ++i) {
      bytes[i] = bridge::utils::read_file(paths[i]);
      const std::string line = md5_hex(bytes[i]) + "  " + file_name(paths[i]) + "\n";
      if (digests.find(line) == std::string::npos) {
        return reject(paths[i] + " does not match its MD5 in " + digests_path + " (changed after it was written)");
      }
    }
    NpyArray document = parse_npy(bytes[0], paths[0]);
    NpyArray samples = parse_npy(bytes[1], paths[1]);
    NpyArray shuffle = parse_npy(bytes[2], paths[2]);
    // The indices must be exactly what this description builds: shapes from the epoch arithmetic, every value in
    // range, so a damaged cache cannot make sample() read outside the dataset.
    const int64_t expected_documents = num_epochs_ * range_.size();
    const int64_t expected_samples = (num_epochs_ * tokens_in(*dataset_, range_) - kExtraToken) / config_.seq_length;
    if (document.shape != std::vector<int64_t>{expected_documents}) return reject(paths[0] + " has the wrong shape");
    if (samples.shape != std::vector<int64_t>{expected_samples + 1, 2})
      return reject(paths[1] + " has the wrong shape");
    if (shuffle.shape != std::vector<int64_t>{expected_samples}) return reject(paths[2] + " has the wrong shape");
    for (const int64_t d : document.values) {
      if (d < range_.begin || d >= range_.end) return reject(paths[0] + " holds a sequence outside the split");
    }
    const auto& lengths = dataset_->sequence_lengths();
    for (int64_t s = 0; s <= expected_samples; ++s) {
      const int64_t position = samples.values[static_cast<std::size_t>(2 * s)];
      const int64_t offset = samples.values[static_cast<std::size_t>(2 * s + 1)];
      if (position < 0 || position >= expected_documents || offset < 0 ||
          offset >= std::max<int64_t>(
                        1, lengths[static_cast<std::size_t>(document.values[static_cast<std::size_t>(position)])])) {
        return reject(paths[1] + " row " + std::to_string(s) + " points outside the documents");
      }
      if (s > 0) {
        const int64_t previous = samples.values[static_cast<std::size_t>(2 * s - 2)];
        const int64_t previous_offset = samples.values[static_cast<std::size_t>(2 * s - 1)];
        if (position < previous || (position == previous && offset <= previous_offset)) {
          return reject(paths[1] + " is not increasing at row " + std::to_string(s));
        }
      }
    }
    for (const int64_t s : shuffle.values) {
      if (s < 0 || s >= expected_samples) return reject(paths[2] + " holds a sample outside the index");
    }
    document_index_ = std::move(document.values);
    sample_index_ = std::move(samples.values);
    shuffle_index_ = std::move(shuffle.values);
    return true;
  } catch (const std::exception& e) {
    return reject(e.what());
  }
}

void IndexedGPTDataset::save_cache() const {
  const std::filesystem::path dir = std::filesystem::path(cache_path_prefix_).parent_path();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw std::runtime_error("IndexedGPTDataset: cannot create the index cache folder " + dir.string() + ": " +
                             error.message() + "; set dataset.path_to_cache to a writable folder");
  }
  // Megatron's dtypes: int32 document index; int32 sample index unless its values may not fit; uint32 shuffle index
  // unless the sample count reaches 2^32 - 2.
  int64_t max_length = 0;
  for (const int32_t length : dataset_->sequence_lengths()) max_length = std::max<int64_t>(max_length, length);
  const int64_t sample_max = std::max<int64_t>(static_cast<int64_t>(document_index_.size()), max_length);
  const NpyType sample_type = sample_max <= std::numeric_limits<int32_t>::max() ? NpyType::kInt32 : NpyType::kInt64;
  const NpyType shuffle_type =
      size() >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1 ? NpyType::kInt64 : NpyType::kUInt32;

  // Every rank may build the same dataset at once; each file is written to a temporary name and renamed, so a
  // reader sees a whole file, and the description (which marks the set complete) comes last. The digests are in
  // md5sum's format: `md5sum -c` checks the cache by hand.
  std::string digests;
  const auto save = [&](const std::string& name, NpyType type, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& values) {
    const std::string bytes = npy_bytes(type, shape, values, cache_path_prefix_ + name);
    write_file_atomically(cache_path_prefix_ + name, bytes);
    digests += md5_hex(bytes) + "  " + file_name(cache_path_prefix_ + name) + "\n";
  };
  save("document_index.npy", NpyType::kInt32, {static_cast<int64_t>(document_index_.size())}, document_index_);
  save("sample_index.npy", sample_type, {size() + 1, 2}, sample_index_);
  save("shuffle_index.npy", shuffle_type, {size()}, shuffle_index_);
  write_file_atomically(cache_path_prefix_ + kDigestsName, digests);
  write_file_atomically(cache_path_prefix_ + "description.txt", description_);
}

std::array<int64_t, 3> train_valid_test_num_samples(const ConfigContainer& config) {
  const TrainingConfig& t = config.train;
  const int64_t evaluations = t.eval_interval > 0 ? t.train_iters / t.eval_interval + 1 : 1;
  return {t.train_iters * t.global_batch_size, evaluations * t.eval_iters * t.global_batch_size,
          t.eval_iters * t.global_batch_size};
}

namespace {

// One dataset of data_path.
std::shared_ptr<const IndexedDataset> open_indexed(std::string prefix) {
  if (prefix.size() > 4 && (prefix.substr(prefix.size() - 4) == ".bin" || prefix.substr(prefix.size() - 4) == ".idx")) {
    prefix.resize(prefix.size() - 4);  // a file name instead of the prefix is an easy slip
  }
  return std::make_shared<const IndexedDataset>(prefix);
}

// Every token id of `indexed` is below model.vocab_size, or an error naming the first that is not.
void check_tokens(const IndexedDataset& indexed, const ConfigContainer& config) {
  if (config.model.vocab_size <= 0) return;
  const std::string& prefix = indexed.path_prefix();
  const auto start = std::chrono::steady_clock::now();
  if (const std::optional<TokenLocation> bad = indexed.find_token_outside(config.model.vocab_size)) {
    throw std::invalid_argument(
        "dataset.data_path: " + prefix + " holds token id " +
        (bad->value == kNotAToken ? "NaN or past int64 (a float token)" : std::to_string(bad->value)) + " (document " +
        std::to_string(bad->document) + ", sequence " + std::to_string(bad->sequence) + ", token " +
        std::to_string(bad->position) +
        "), which is not in [0, model.vocab_size = " + std::to_string(config.model.vocab_size) +
        "); set model.vocab_size to the tokenizer's vocabulary size, or preprocess the data with the model's "
        "tokenizer (dataset.validate_tokens=false skips this check)");
  }
  bridge::utils::logger().info("checked the {} tokens of {}: every id is below model.vocab_size, {:.3f} s",
                               tokens_in(indexed, {0, indexed.size()}), prefix,
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace

training::GPTDatasets build_gpt_datasets(const ConfigContainer& config) {
  // Megatron's --data-path: "prefix ...", or "weight prefix weight prefix ..." for a blend.
  const Blend blend = parse_blend(config.dataset.data_path);
  std::vector<std::shared_ptr<const IndexedDataset>> indexed;
  uint64_t bytes = 0;
  for (const std::string& prefix : blend.prefixes) {
    indexed.push_back(open_indexed(prefix));
    bytes += indexed.back()->num_bytes();
  }
  if (config.dataset.validate_tokens.value_or(bytes <= DatasetConfig::kValidateTokensAutoBytes)) {
    for (const auto& dataset : indexed) check_tokens(*dataset, config);
  }

  const std::vector<double> proportions = parse_split(config.dataset.split);
  const std::array<int64_t, 3> num_samples = train_valid_test_num_samples(config);
  GPTDatasetConfig dataset_config;
  dataset_config.seq_length = config.model.seq_length;
  dataset_config.random_seed = config.rng.seed;
  dataset_config.path_to_cache = config.dataset.path_to_cache;
  dataset_config.vocab_size = config.model.vocab_size;
  dataset_config.split = config.dataset.split;

  // Megatron's sizes: each dataset of a weighted blend is built for its share of the split's samples and a surplus,
  // the blend takes the sum of the shares; an unweighted blend uses one epoch of each.
  const bool weighted = !blend.weights.empty();
  const std::vector<double> weights = weighted ? normalize_weights(blend.weights) : std::vector<double>();
  const double surplus = config.dataset.mid_level_dataset_surplus;
  std::array<std::shared_ptr<const training::GPTDataset>, 3> built;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto split = static_cast<Split>(i);
    if (num_samples[i] == 0 || proportions[i] == 0.0) continue;
    std::vector<std::shared_ptr<const training::GPTDataset>> parts;
    int64_t blend_size = 0;
    for (std::size_t d = 0; d < indexed.size(); ++d) {
      const SequenceRange range = split_ranges(proportions, indexed[d]->size())[i];
      if (range.size() == 0) {
        throw std::invalid_argument("dataset.split \"" + config.dataset.split + "\" gives the " + split_name(split) +
                                    " split none of the " + std::to_string(indexed[d]->size()) + " sequences of " +
                                    indexed[d]->path_prefix() + ", but " + std::to_string(num_samples[i]) +
                                    " samples are needed from it; give it a larger share, more documents, or set its "
                                    "proportion to 0 (no " +
                                    split_name(split) + " data)");
      }
      int64_t wanted = indexed.size() == 1 && !weighted ? num_samples[i] : 0;  // 0: one epoch
      if (weighted) {
        const double share = std::ceil(static_cast<double>(num_samples[i]) * weights[d]);
        blend_size += static_cast<int64_t>(share);
        wanted = static_cast<int64_t>(std::ceil(share * (1.0 + surplus)));
      }
      parts.push_back(std::make_shared<IndexedGPTDataset>(indexed[d], split, range, wanted, dataset_config));
    }
    if (indexed.size() == 1 && !weighted) {
      built[i] = parts.front();  // Megatron's one unweighted prefix: no blend
    } else if (weighted) {
      built[i] = std::make_shared<BlendedDataset>(std::move(parts), weights, blend_size);
    } else {
      built[i] = std::make_shared<BlendedDataset>(std::move(parts), num_samples[i]);
    }
  }
  return {built[0], built[1], built[2]};
}

}  // namespace bridge::training::datasets
