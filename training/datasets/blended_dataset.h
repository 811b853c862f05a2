// Megatron-Core's blending of several GPT datasets (BlendedDataset and the blend arithmetic of
// BlendedMegatronDatasetBuilder): Megatron's data_path list "0.3 a 0.7 b" trains on a's and b's samples interleaved in
// the proportions of the weights, in the order megatron-core's helpers.cpp gives, so a blended run sees the samples a
// Megatron run sees. Without weights ("a b") every sample of every dataset is used once, interleaved by their sizes.
//
//   Blend blend = parse_blend({"0.3", "/data/a_text_document", "0.7", "/data/b_text_document"});
//   BlendedDataset train({a_train, b_train}, normalize_weights(blend.weights), /*size=*/8000);
//   torch::Tensor tokens = train.sample(0);  // b's first sample: b is furthest behind its share at step 0
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "training/data.h"

namespace bridge::training::datasets {

/// The datasets of a data_path and their weights (empty: no weights).
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};

/// Megatron's data_path list read as get_blend_from_list does: pairs `weight prefix ...` when it has an even length
/// and every weight reads as a number, else every entry is a prefix. An entry holding spaces that does not name a
/// dataset (no <entry>.idx) is split at them first, so "0.3 a 0.7 b" in one string is the weighted list too. Throws
/// std::invalid_argument naming dataset.data_path for a weight that is not finite and positive, or no prefix.
Blend parse_blend(const std::vector<std::string>& data_path);

/// `weights` divided by their sum, the sum taken as NumPy's pairwise sum, so the result has Megatron's last bits.
std::vector<double> normalize_weights(const std::vector<double>& weights);

/// Which dataset each sample of a blend comes from and which of that dataset's samples it is.
struct BlendingIndices {
  std::vector<int16_t> dataset_index;
  std::vector<int64_t> dataset_sample_index;
};

/// helpers.cpp's build_blending_indices: sample s comes from the dataset furthest behind its share
/// (weight x max(s, 1) minus the samples it has given), the lowest index on a tie.
BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size);

/// helpers.cpp's build_exhaustive_blending_indices: every sample of datasets of `sizes` once, each drawn when it is
/// furthest behind its share of the total, until all are spent.
BlendingIndices build_exhaustive_blending_indices(const std::vector<int64_t>& sizes);

class BlendedDataset : public training::GPTDataset {
 public:
  /// `size` samples in the proportions of `weights` (normalised here again, as Megatron's BlendedDataset does).
  /// Throws std::invalid_argument when the blend asks a dataset for more samples than it has.
  BlendedDataset(std::vector<std::shared_ptr<const training::GPTDataset>> datasets, const std::vector<double>& weights,
                 int64_t size);
  /// Unweighted: every sample of every dataset once (Megatron's weights = the datasets' sizes), at most `size`.
  BlendedDataset(std::vector<std::shared_ptr<const training::GPTDataset>> datasets, int64_t size);

  int64_t size() const override { return static_cast<int64_t>(indices_.dataset_index.size()); }
  int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  torch::Tensor sample(int64_t index) const override;

  const BlendingIndices& indices() const { return indices_; }
  const std::vector<std::shared_ptr<const training::GPTDataset>>& datasets() const { return datasets_; }

 private:
  void check();

  std::vector<std::shared_ptr<const training::GPTDataset>> datasets_;
  BlendingIndices indices_;
};

}  // namespace bridge::training::datasets
