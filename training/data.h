// Data for GPT pretraining: datasets of fixed-length token samples and the iterator a step function draws
// micro-batches from. The iterator follows Megatron's pretraining sampler: each micro-batch step takes the next
// micro_batch_size * dp sample indices and data-parallel rank r gets the r-th slice, so every tensor-parallel rank
// of a replica sees the same tokens and the global batch does not depend on the layout. Under context parallelism
// each rank of the cp group then keeps its two chunks of every sequence (Megatron-Bridge's get_batch calling
// get_batch_on_this_cp_rank), position ids included, so the model sees global positions.
//
//   auto dataset = std::make_shared<MockGPTDataset>(/*vocab_size=*/1024, /*seq_length=*/128, /*seed=*/7);
//   DataIterator it(dataset, /*micro_batch_size=*/4, /*dp_rank=*/0, /*dp_size=*/1);
//   GPTBatch batch = it.next();  // tokens, labels, loss_mask, position_ids: [4, 128]
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bridge::training {

/// One micro-batch, [micro_batch_size, seq_length] each (seq_length / cp on a context-parallel rank, its two chunks):
/// labels are the tokens shifted by one.
struct GPTBatch {
  torch::Tensor tokens;        ///< int64
  torch::Tensor labels;        ///< int64
  torch::Tensor loss_mask;     ///< float, 1 where the label counts
  torch::Tensor position_ids;  ///< int64
  /// bool [micro_batch_size, 1, s, s], true where a token may not attend (Megatron's sense); undefined = causal.
  torch::Tensor attention_mask;
};

/// Megatron's GPTDatasetConfig options for documents packed into one sample: each end-of-document token (in the
/// inputs) ends a document for the positions, the attention and the loss.
struct DocumentMasking {
  int64_t eod_token = -1;             ///< the end-of-document id (read only when an option is on)
  bool reset_position_ids = false;    ///< positions restart at 0 after each end-of-document token
  bool reset_attention_mask = false;  ///< tokens after an end-of-document token cannot see it or anything before
  bool eod_mask_loss = false;         ///< no loss on predicting the token after an end-of-document token
  bool any() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
};

/// Megatron's _get_ltor_masks_and_position_ids over a micro-batch: sets `batch`'s loss_mask, position_ids and (with
/// reset_attention_mask) attention_mask from its tokens [b, s]. Token i = eod with all three on:
///   positions 0..i, then 0, 1, ...; queries after i see keys after i only; the loss of label i (the token after
///   the eod) is masked, the eod's own prediction counts.
void apply_document_masking(GPTBatch& batch, const DocumentMasking& masking);

/// Samples of seq_length + 1 tokens (inputs and the label after the last one).
class GPTDataset {
 public:
  virtual ~GPTDataset() = default;
  /// Number of distinct samples; the iterator wraps around past it.
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  /// Sample `index` in [0, size()): seq_length + 1 int64 tokens.
  virtual torch::Tensor sample(int64_t index) const = 0;
};

/// Random tokens, a pure function of (seed, index): Megatron-Bridge's mock data, for benchmarks and tests.
class MockGPTDataset : public GPTDataset {
 public:
  MockGPTDataset(int64_t vocab_size, int64_t seq_length, uint64_t seed, int64_t size = int64_t{1} << 40);
  int64_t size() const override { return size_; }
  int64_t seq_length() const override { return seq_length_; }
  torch::Tensor sample(int64_t index) const override;

 private:
  int64_t vocab_size_, seq_length_;
  uint64_t seed_;
  int64_t size_;
};

/// Consecutive windows over one token stream; window i starts at token i * seq_length, so neighbours share one token
/// (as Megatron's GPTDataset samples do).
class TokenStreamDataset : public GPTDataset {
 public:
  /// `tokens` holds at least seq_length + 1 tokens.
  TokenStreamDataset(std::vector<int64_t> tokens, int64_t seq_length);
  int64_t size() const override;
  int64_t seq_length() const override { return seq_length_; }
  torch::Tensor sample(int64_t index) const override;

 private:
  torch::Tensor tokens_;
  int64_t seq_length_;
};

/// Turns samples into micro-batches for one data-parallel rank (Megatron's MegatronPretrainingSampler).
class DataIterator {
 public:
  /// Batches are moved to `device` (the model's), as Megatron's get_batch moves them to the current GPU.
  /// `masking` splits samples at end-of-document tokens (none by default). With `cp_size` > 1 (context parallelism)
  /// each batch keeps context-parallel rank `cp_rank`'s chunks of the sequence (parallel/context_parallel/utils.h),
  /// which needs the dataset's seq_length divisible by 2 x cp_size and no attention mask (reset_attention_mask).
  DataIterator(std::shared_ptr<const GPTDataset> dataset, int64_t micro_batch_size, int dp_rank, int dp_size,
               int64_t consumed_samples = 0, torch::Device device = torch::kCPU, DocumentMasking masking = {},
               int cp_rank = 0, int cp_size = 1);
  /// The next micro-batch of this rank, on the iterator's device; advances by micro_batch_size * dp_size samples.
  /// Document masking sees the whole sequence before the context-parallel split.
  GPTBatch next();
  int64_t consumed_samples() const { return consumed_samples_; }
  const GPTDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const GPTDataset> dataset_;
  int64_t micro_batch_size_;
  int dp_rank_, dp_size_;
  int64_t consumed_samples_;
  torch::Device device_;
  DocumentMasking masking_;
  int cp_rank_, cp_size_;
};

/// The datasets pretrain() draws from; valid and test may be null (no evaluation then).
struct GPTDatasets {
  std::shared_ptr<const GPTDataset> train, valid, test;
};

}  // namespace bridge::training
