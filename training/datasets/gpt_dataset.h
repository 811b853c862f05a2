// GPT samples drawn from a Megatron indexed dataset exactly as Megatron-Core's GPTDataset draws them
// (megatron/core/datasets/gpt_dataset.py and helpers.cpp): the train/valid/test split over sequences, epochs with a
// separate final epoch, and the document, sample and shuffle indices shuffled by NumPy's RandomState(seed), so the
// same data and seed give Megatron's sample order. The indices are cached as .npy files named after an MD5 of the
// dataset's description, so a second run (and every other rank) loads them instead of rebuilding.
//
//   auto indexed = std::make_shared<const IndexedDataset>("/data/corpus_text_document");
//   GPTDatasetConfig config;
//   config.seq_length = 1024;
//   config.random_seed = 1234;
//   IndexedGPTDataset train(indexed, Split::kTrain, {0, 969}, /*num_samples=*/8000, config);
//   torch::Tensor tokens = train.sample(0);  // 1025 int64 tokens
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "training/data.h"
#include "training/datasets/indexed_dataset.h"

namespace bridge::training {
struct ConfigContainer;
}

namespace bridge::training::datasets {

/// Megatron's Split.
enum class Split { kTrain = 0, kValid = 1, kTest = 2 };

/// "train", "valid" or "test" (the names in cache files).
std::string split_name(Split split);

/// Megatron's parse_and_normalize_split: "969,30,1" (or "969/30/1", fewer parts padded with 0) -> proportions summing
/// to 1. Throws std::invalid_argument naming dataset.split when it is malformed, negative or all zero.
std::vector<double> parse_split(const std::string& split);

/// A half-open range of sequence numbers.
struct SequenceRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

/// Each split's sequences out of `num_sequences`: bounds round(cumulative proportion x num_sequences) with Python's
/// round (half to even), as Megatron's split matrix gives them.
std::array<SequenceRange, 3> split_ranges(const std::vector<double>& proportions, int64_t num_sequences);

/// What identifies a GPT dataset besides its data: Megatron's GPTDatasetConfig fields that the indices depend on.
struct GPTDatasetConfig {
  int64_t seq_length = 0;
  uint64_t random_seed = 1234;  ///< must be < 2^32 (NumPy's RandomState)
  /// Where the indices are cached; empty = <folder of the dataset prefix>/cache/GPTDataset_indices.
  std::string path_to_cache;
  /// Cache the indices (load them when present); false = build in memory every time.
  bool use_cache = true;
  /// Token ids must be below this; sample() throws on a larger one. 0 = unchecked.
  int64_t vocab_size = 0;
  /// The split string, recorded in the cache description.
  std::string split;
};

/// A GPTDataset over sequences `range` of an indexed dataset, holding Megatron's three indices:
/// - document_index: the range's sequence numbers tiled once per epoch and shuffled (the final epoch on its own when
///   it would be less than 80% used);
/// - sample_index: [size() + 1, 2] (position in document_index, token offset) where each sample starts; consecutive
///   samples share one token;
/// - shuffle_index: the order in which the samples are served.
class IndexedGPTDataset : public training::GPTDataset {
 public:
  /// At least `num_samples` samples of seq_length + 1 tokens (whole epochs, so usually more). Throws
  /// std::invalid_argument when the range holds fewer than two tokens or the seed is out of range.
  IndexedGPTDataset(std::shared_ptr<const IndexedDataset> dataset, Split split, SequenceRange range,
                    int64_t num_samples, GPTDatasetConfig config);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  int64_t seq_length() const override { return config_.seq_length; }
  /// Sample `index` in [0, size()): seq_length + 1 int64 tokens.
  torch::Tensor sample(int64_t index) const override;

  /// The samples asked for (0: one epoch).
  int64_t num_samples() const { return num_samples_; }
  int64_t num_epochs() const { return num_epochs_; }
  const std::vector<int64_t>& document_index() const { return document_index_; }
  /// Row-major [size() + 1, 2].
  const std::vector<int64_t>& sample_index() const { return sample_index_; }
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }
  /// Megatron's unique_description (JSON); its MD5 names the cache files.
  const std::string& description() const { return description_; }
  /// The cache files' common path, "<cache dir>/<md5>-GPTDataset-<split>-"; empty without caching.
  const std::string& cache_path_prefix() const { return cache_path_prefix_; }
  /// Whether the indices came from the cache rather than being built.
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  void build_indices(int64_t tokens_per_epoch, bool separate_final_epoch, int64_t samples_sans_final_epoch);
  /// Loads and validates the cached indices; false (with a warning) when they are missing or unusable.
  bool load_cache();
  void save_cache() const;

  std::shared_ptr<const IndexedDataset> dataset_;
  Split split_;
  SequenceRange range_;
  int64_t num_samples_;
  GPTDatasetConfig config_;
  int64_t num_epochs_ = 1;
  std::vector<int64_t> document_index_, sample_index_, shuffle_index_;
  std::string description_, cache_path_prefix_;
  bool loaded_from_cache_ = false;
};

/// Megatron's train/valid/test sample counts: train_iters x gbs; (train_iters / eval_interval + 1) x eval_iters x gbs
/// (one evaluation when eval_interval is 0); eval_iters x gbs.
std::array<int64_t, 3> train_valid_test_num_samples(const ConfigContainer& config);

/// The datasets pretrain() uses when dataset.data_path is set, as megatron-core's BlendedMegatronDatasetBuilder
/// builds them: one indexed dataset, or a blend (BlendedDataset) of several, weighted ("0.3 a 0.7 b", also "1.0 a")
/// or not ("a b"); each split by dataset.split, sampled with rng.seed and model.seq_length, indices cached in
/// dataset.path_to_cache. A split with no samples requested (eval_iters 0) or a zero proportion is null. Throws
/// std::invalid_argument naming the config field for a bad weight, an empty split that samples were requested from,
/// or a seed NumPy cannot take.
training::GPTDatasets build_gpt_datasets(const ConfigContainer& config);

}  // namespace bridge::training::datasets
