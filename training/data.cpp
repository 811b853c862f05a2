// Datasets and the data-parallel micro-batch iterator.
#include "training/data.h"

#include <stdexcept>
#include <utility>

#include "parallel/context_parallel/utils.h"

namespace bridge::training {

MockGPTDataset::MockGPTDataset(int64_t vocab_size, int64_t seq_length, uint64_t seed, int64_t size)
    : vocab_size_(vocab_size), seq_length_(seq_length), seed_(seed), size_(size) {
  if (vocab_size < 2) throw std::invalid_argument("MockGPTDataset: vocab_size must be >= 2");
  if (seq_length < 1) throw std::invalid_argument("MockGPTDataset: seq_length must be >= 1");
  if (size < 1) throw std::invalid_argument("MockGPTDataset: size must be >= 1");
}

torch::Tensor MockGPTDataset::sample(int64_t index) const {
  auto generator =
      at::make_generator<at::CPUGeneratorImpl>(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(index));
  return torch::randint(vocab_size_, {seq_length_ + 1}, generator, torch::kLong);
}

TokenStreamDataset::TokenStreamDataset(std::vector<int64_t> tokens, int64_t seq_length) : seq_length_(seq_length) {
  if (seq_length < 1) throw std::invalid_argument("TokenStreamDataset: seq_length must be >= 1");
  if (static_cast<int64_t>(tokens.size()) < seq_length + 1) {
    throw std::invalid_argument("TokenStreamDataset: " + std::to_string(tokens.size()) +
                                " tokens cannot fill one sample of seq_length + 1 = " + std::to_string(seq_length + 1) +
                                " tokens; give more text or a shorter seq_length");
  }
  tokens_ = torch::tensor(tokens, torch::kLong);
}

int64_t TokenStreamDataset::size() const { return (tokens_.size(0) - 1) / seq_length_; }

torch::Tensor TokenStreamDataset::sample(int64_t index) const {
  return tokens_.slice(0, index * seq_length_, index * seq_length_ + seq_length_ + 1);
}

DataIterator::DataIterator(std::shared_ptr<const GPTDataset> dataset, int64_t micro_batch_size, int dp_rank,
                           int dp_size, int64_t consumed_samples, torch::Device device, DocumentMasking masking,
                           int cp_rank, int cp_size)
    : dataset_(std::move(dataset)),
      micro_batch_size_(micro_batch_size),
      dp_rank_(dp_rank),
      dp_size_(dp_size),
      consumed_samples_(consumed_samples),
      device_(device),
      masking_(masking),
      cp_rank_(cp_rank),
      cp_size_(cp_size) {
  if (!dataset_) throw std::invalid_argument("DataIterator: no dataset");
  if (micro_batch_size < 1) throw std::invalid_argument("DataIterator: micro_batch_size must be >= 1");
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw std::invalid_argument("DataIterator: dp_rank " + std::to_string(dp_rank) + " is not in [0, " +
                                std::to_string(dp_size) + ")");
  }
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    throw std::invalid_argument("DataIterator: cp_rank " + std::to_string(cp_rank) + " is not in [0, " +
                                std::to_string(cp_size) + ")");
  }
  if (cp_size > 1) {
    const int64_t s = dataset_->seq_length();
    if (s % (2 * int64_t{cp_size}) != 0) {
      throw std::invalid_argument("DataIterator: the dataset's seq_length (" + std::to_string(s) +
                                  ") is not divisible by 2 x context_parallel_size (" + std::to_string(2 * cp_size) +
                                  "); each context-parallel rank keeps two equal chunks of every sequence");
    }
    // A document mask is [s, s] over the whole sequence; the context-parallel attention takes none (config.cpp
    // refuses dataset.reset_attention_mask with cp > 1 before the world starts).
    if (masking_.reset_attention_mask) {
      throw std::invalid_argument(
          "DataIterator: reset_attention_mask (document attention masks) cannot be split over context-parallel ranks; "
          "turn it off or use context_parallel_size 1");
    }
  }
}

GPTBatch DataIterator::next() {
  std::vector<torch::Tensor> samples;
  samples.reserve(static_cast<std::size_t>(micro_batch_size_));
  const int64_t first = consumed_samples_ + dp_rank_ * micro_batch_size_;
  for (int64_t i = 0; i < micro_batch_size_; ++i) samples.push_back(dataset_->sample((first + i) % dataset_->size()));
  consumed_samples_ += micro_batch_size_ * dp_size_;
  torch::Tensor text = torch::stack(samples);
  const int64_t s = dataset_->seq_length();
  GPTBatch batch;
  batch.tokens = text.slice(1, 0, s).contiguous();
  batch.labels = text.slice(1, 1, s + 1).contiguous();
  batch.loss_mask = torch::ones({micro_batch_size_, s}, torch::kFloat);
  batch.position_ids = torch::arange(s, torch::kLong).unsqueeze(0).expand({micro_batch_size_, s}).contiguous();
  if (masking_.any()) apply_document_masking(batch, masking_);
  if (cp_size_ > 1) {
    // After the masking, which needs the whole sequence: positions stay global (and per document with
    // reset_position_ids), so RoPE and the learned position table need no change.
    namespace cp = parallel::context_parallel;
    for (torch::Tensor* tensor : {&batch.tokens, &batch.labels, &batch.loss_mask, &batch.position_ids}) {
      *tensor = cp::get_tensor_on_this_cp_rank(*tensor, /*seq_dim=*/1, cp_size_, cp_rank_).contiguous();
    }
  }
  if (!device_.is_cpu()) {
    for (torch::Tensor* tensor :
         {&batch.tokens, &batch.labels, &batch.loss_mask, &batch.position_ids, &batch.attention_mask}) {
      if (tensor->defined()) *tensor = tensor->to(device_);
    }
  }
  return batch;
}

void apply_document_masking(GPTBatch& batch, const DocumentMasking& masking) {
  const int64_t b = batch.tokens.size(0);
  const int64_t s = batch.tokens.size(1);
  const torch::Tensor eod = batch.tokens.eq(masking.eod_token);
  batch.loss_mask = torch::ones({b, s}, torch::kFloat);
  if (masking.eod_mask_loss) batch.loss_mask.masked_fill_(eod, 0.0);
  batch.position_ids = torch::arange(s, torch::kLong).unsqueeze(0).repeat({b, 1});
  if (masking.reset_attention_mask) batch.attention_mask = torch::ones({b, 1, s, s}, torch::kBool).triu(1);
  if (!masking.reset_position_ids && !masking.reset_attention_mask) return;
  // Per sample, a loop over its (few) end-of-document tokens, as Megatron's.
  const torch::Tensor eod_cpu = eod.cpu();
  for (int64_t row = 0; row < b; ++row) {
    const torch::Tensor where = eod_cpu[row].nonzero().flatten().contiguous();
    const auto* index = where.data_ptr<int64_t>();
    int64_t previous = 0;
    for (int64_t n = 0; n < where.numel(); ++n) {
      const int64_t i = index[n];
      if (masking.reset_attention_mask) batch.attention_mask[row][0].slice(0, i + 1).slice(1, 0, i + 1).fill_(true);
      if (masking.reset_position_ids) {
        batch.position_ids[row].slice(0, i + 1).sub_(i + 1 - previous);
        previous = i + 1;
      }
    }
  }
}

}  // namespace bridge::training
