// The blend: data_path parsing, weight normalisation and megatron-core's two index builders.
#include "training/datasets/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include "utils/strings.h"

namespace bridge::training::datasets {
namespace {

// NumPy's pairwise summation of doubles (numpy/core/src/umath/loops_utils.h.src): a plain loop below 8 values, 8
// running sums up to 128, halves (at a multiple of 8) beyond.
double pairwise_sum(const double* values, std::size_t n) {
  if (n < 8) {
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += values[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (std::size_t j = 0; j < 8; ++j) r[j] = values[j];
    std::size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (std::size_t j = 0; j < 8; ++j) r[j] += values[i + j];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += values[i];
    return sum;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(values, half) + pairwise_sum(values + half, n - half);
}

// Python's float() on a weight: the whole text, surrounding spaces allowed.
bool read_number(std::string_view text, double& value) {
  const std::string trimmed(bridge::utils::trim(text));
  if (trimmed.empty()) return false;
  char* end = nullptr;
  value = std::strtod(trimmed.c_str(), &end);
  return end == trimmed.c_str() + trimmed.size();
}

bool names_a_dataset(const std::string& entry) {
  std::error_code error;
  return std::filesystem::exists(entry + ".idx", error) || std::filesystem::exists(entry, error);
}

}  // namespace

Blend parse_blend(const std::vector<std::string>& data_path) {
  std::vector<std::string> entries;
  for (const std::string& entry : data_path) {
    if (entry.find_first_of(" \t\n") == std::string::npos || names_a_dataset(entry)) {
      entries.push_back(entry);
      continue;
    }
    std::istringstream words(entry);
    for (std::string word; words >> word;) entries.push_back(word);
  }
  if (entries.empty()) throw std::invalid_argument("dataset.data_path names no dataset");
  Blend blend;
  bool weighted = entries.size() % 2 == 0;
  std::vector<double> weights;
  for (std::size_t i = 0; weighted && i < entries.size(); i += 2) {
    double weight = 0.0;
    weighted = read_number(entries[i], weight);
    weights.push_back(weight);
  }
  if (!weighted) {
    for (const std::string& entry : entries) blend.prefixes.emplace_back(bridge::utils::trim(entry));
    return blend;
  }
  for (std::size_t i = 0; i < entries.size(); i += 2) {
    const double weight = weights[i / 2];
    if (!std::isfinite(weight) || weight <= 0.0) {
      throw std::invalid_argument("dataset.data_path: the weight '" + entries[i] + "' of " + entries[i + 1] +
                                  " must be a finite number above 0 (Megatron's \"0.3 a 0.7 b\")");
    }
    blend.prefixes.emplace_back(bridge::utils::trim(entries[i + 1]));
  }
  blend.weights = std::move(weights);
  return blend;
}

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  const double total = pairwise_sum(weights.data(), weights.size());
  std::vector<double> normalized;
  normalized.reserve(weights.size());
  for (const double weight : weights) normalized.push_back(weight / total);
  return normalized;
}

BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size) {
  BlendingIndices indices;
  indices.dataset_index.resize(static_cast<std::size_t>(size));
  indices.dataset_sample_index.resize(static_cast<std::size_t>(size));
  std::vector<int64_t> taken(weights.size(), 0);
  for (int64_t s = 0; s < size; ++s) {
    const double progress = std::max(static_cast<double>(s), 1.0);
    std::size_t best = 0;
    double best_error = weights[0] * progress - static_cast<double>(taken[0]);
    for (std::size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * progress - static_cast<double>(taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    indices.dataset_index[static_cast<std::size_t>(s)] = static_cast<int16_t>(best);
    indices.dataset_sample_index[static_cast<std::size_t>(s)] = taken[best]++;
  }
  return indices;
}

BlendingIndices build_exhaustive_blending_indices(const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (const int64_t size : sizes) total += size;
  std::vector<double> weights;
  for (const int64_t size : sizes) weights.push_back(static_cast<double>(size) / static_cast<double>(total));
  std::vector<int64_t> taken(sizes.size(), 0);
  std::set<std::size_t> unspent;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] > 0) unspent.insert(d);
  }
  BlendingIndices indices;
  indices.dataset_index.reserve(static_cast<std::size_t>(total));
  indices.dataset_sample_index.reserve(static_cast<std::size_t>(total));
  for (int64_t s = 0; !unspent.empty(); ++s) {
    const double progress = std::max(static_cast<double>(s), 1.0);
    std::size_t best = *unspent.begin();
    double best_error = -std::numeric_limits<double>::infinity();
    for (const std::size_t d : unspent) {
      const double error = weights[d] * progress - static_cast<double>(taken[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    indices.dataset_index.push_back(static_cast<int16_t>(best));
    indices.dataset_sample_index.push_back(taken[best]++);
    if (taken[best] == sizes[best]) unspent.erase(best);
  }
  return indices;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const training::GPTDataset>> datasets,
                               const std::vector<double>& weights, int64_t size)
    : datasets_(std::move(datasets)) {
  if (weights.size() != datasets_.size()) {
    throw std::invalid_argument("BlendedDataset: " + std::to_string(weights.size()) + " weights for " +
                                std::to_string(datasets_.size()) + " datasets");
  }
  check();
  indices_ = build_blending_indices(normalize_weights(weights), size);
  std::vector<int64_t> drawn(datasets_.size(), 0);
  for (const int16_t d : indices_.dataset_index) ++drawn[static_cast<std::size_t>(d)];
  for (std::size_t d = 0; d < datasets_.size(); ++d) {
    if (drawn[d] > datasets_[d]->size()) {
      throw std::invalid_argument("the blend draws " + std::to_string(drawn[d]) + " samples from dataset " +
                                  std::to_string(d) + " of dataset.data_path, which has " +
                                  std::to_string(datasets_[d]->size()) + "; raise dataset.mid_level_dataset_surplus");
    }
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const training::GPTDataset>> datasets, int64_t size)
    : datasets_(std::move(datasets)) {
  check();
  std::vector<int64_t> sizes;
  for (const auto& dataset : datasets_) sizes.push_back(dataset->size());
  indices_ = build_exhaustive_blending_indices(sizes);
  if (size < this->size()) {
    indices_.dataset_index.resize(static_cast<std::size_t>(size));
    indices_.dataset_sample_index.resize(static_cast<std::size_t>(size));
  }
}

void BlendedDataset::check() {
  if (datasets_.empty()) throw std::invalid_argument("BlendedDataset: no datasets");
  if (datasets_.size() >= static_cast<std::size_t>(std::numeric_limits<int16_t>::max())) {
    throw std::invalid_argument("dataset.data_path blends " + std::to_string(datasets_.size()) +
                                " datasets; Megatron's blend indices hold fewer than 32767");
  }
  for (const auto& dataset : datasets_) {
    if (!dataset) throw std::invalid_argument("BlendedDataset: a dataset is null");
    if (dataset->seq_length() != datasets_.front()->seq_length()) {
      throw std::invalid_argument("BlendedDataset: the datasets' seq_length differ");
    }
  }
}

torch::Tensor BlendedDataset::sample(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw std::out_of_range("BlendedDataset: sample " + std::to_string(index) + " is not in [0, " +
                            std::to_string(size()) + ")");
  }
  const auto i = static_cast<std::size_t>(index);
  return datasets_[static_cast<std::size_t>(indices_.dataset_index[i])]->sample(indices_.dataset_sample_index[i]);
}

}  // namespace bridge::training::datasets
