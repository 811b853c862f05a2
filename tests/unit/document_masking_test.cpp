// Documents packed into one sample (Megatron's reset_position_ids, reset_attention_mask, eod_mask_loss): the masks
// and positions of Megatron's _get_ltor_masks_and_position_ids on its worked example, and the model under them: with
// both resets, a document after an end-of-document token gets exactly the logits it gets alone, in either attention
// backend. The DataIterator's context-parallel split of such batches. Also the tanh GeLU (openai_gelu) against its
// formula.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "bridge/models/gpt_model.h"
#include "bridge/models/transformer_layer.h"
#include "parallel/context_parallel/utils.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/data.h"

namespace bridge::training {
namespace {

GPTBatch batch_of(std::vector<int64_t> tokens) {
  GPTBatch batch;
  const auto s = static_cast<int64_t>(tokens.size());
  batch.tokens = torch::tensor(tokens, torch::kLong).reshape({1, s});
  return batch;
}

std::vector<int64_t> values(const torch::Tensor& tensor) {
  const torch::Tensor flat = tensor.to(torch::kLong).flatten().contiguous();
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

// Megatron's example (eod = 9, every option on): what its dataset returns for these input tokens.
TEST(DocumentMasking, MatchesMegatronsWorkedExample) {
  GPTBatch batch = batch_of({5, 6, 9, 7, 8, 1, 9, 9, 3});
  apply_document_masking(batch, {9, true, true, true});
  EXPECT_EQ(values(batch.loss_mask), (std::vector<int64_t>{1, 1, 0, 1, 1, 1, 0, 0, 1}));
  EXPECT_EQ(values(batch.position_ids), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 0, 0}));
  ASSERT_EQ(batch.attention_mask.sizes(), (std::vector<int64_t>{1, 1, 9, 9}));
  // Row q may see keys [first, q]: rows 0-2 from 0, rows 3-6 from 3, row 7 only 7, row 8 only 8.
  const std::vector<int64_t> first = {0, 0, 0, 3, 3, 3, 3, 7, 8};
  for (int64_t q = 0; q < 9; ++q) {
    for (int64_t k = 0; k < 9; ++k) {
      const bool visible = k >= first[static_cast<std::size_t>(q)] && k <= q;
      EXPECT_EQ(batch.attention_mask[0][0][q][k].item<bool>(), !visible) << "query " << q << " key " << k;
    }
  }
}

TEST(DocumentMasking, EachOptionAlone) {
  GPTBatch loss_only = batch_of({5, 9, 7});
  apply_document_masking(loss_only, {9, false, false, true});
  EXPECT_EQ(values(loss_only.loss_mask), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(values(loss_only.position_ids), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_FALSE(loss_only.attention_mask.defined()) << "the causal mask is the model's own";
  GPTBatch positions_only = batch_of({5, 9, 7});
  apply_document_masking(positions_only, {9, true, false, false});
  EXPECT_EQ(values(positions_only.loss_mask), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(values(positions_only.position_ids), (std::vector<int64_t>{0, 1, 0}));
}

// Context parallelism: each rank of the cp group gets the same samples as the whole run would, cut to its chunks
// r and 2cp-1-r along the sequence (Megatron-Core's get_batch_on_this_cp_rank), after the document masking of the
// whole sequence: the ranks' batches put back together are the cp-1 batch, positions global and per document.
TEST(DataIterator, ContextParallelRanksKeepTheirChunksOfTheWholeBatch) {
  const int64_t s = 16, eod = 7;
  auto dataset = std::make_shared<MockGPTDataset>(/*vocab_size=*/8, s, /*seed=*/3);  // many eod tokens
  DocumentMasking masking;
  masking.eod_token = eod;
  masking.reset_position_ids = true;
  masking.eod_mask_loss = true;
  for (const int cp : {2, 4}) {
    DataIterator whole(dataset, /*micro_batch_size=*/2, /*dp_rank=*/1, /*dp_size=*/2, /*consumed_samples=*/6,
                       torch::kCPU, masking);
    std::vector<DataIterator> ranks;
    for (int r = 0; r < cp; ++r) ranks.emplace_back(dataset, 2, 1, 2, 6, torch::kCPU, masking, r, cp);
    for (int step = 0; step < 2; ++step) {
      const GPTBatch expected = whole.next();
      std::vector<GPTBatch> parts;
      for (DataIterator& rank : ranks) parts.push_back(rank.next());
      for (int r = 0; r < cp; ++r) {
        EXPECT_EQ(parts[static_cast<std::size_t>(r)].tokens.sizes(), (std::vector<int64_t>{2, s / cp}));
        // Rank r holds global positions [r c, (r+1) c) and [(2cp-1-r) c, (2cp-r) c), c = s / 2cp.
        const torch::Tensor global = parallel::context_parallel::positions_on_this_cp_rank(s, cp, r);
        EXPECT_TRUE(parts[static_cast<std::size_t>(r)].tokens.equal(expected.tokens.index_select(1, global)))
            << "cp " << cp << " rank " << r;
      }
      for (const auto member : {&GPTBatch::tokens, &GPTBatch::labels, &GPTBatch::loss_mask, &GPTBatch::position_ids}) {
        std::vector<torch::Tensor> locals;
        for (const GPTBatch& part : parts) locals.push_back(part.*member);
        EXPECT_TRUE(parallel::context_parallel::restore_from_cp_ranks(locals, 1).equal(expected.*member))
            << "cp " << cp << " step " << step;
      }
      EXPECT_FALSE(parts[0].attention_mask.defined());
    }
    EXPECT_EQ(ranks[0].consumed_samples(), whole.consumed_samples());
  }
  // The document masking above did something: positions restart and eod's successors carry no loss.
  DataIterator whole(dataset, 2, 0, 1, 0, torch::kCPU, masking);
  const GPTBatch batch = whole.next();
  EXPECT_LT(batch.loss_mask.sum().item<double>(), 2.0 * s);
  EXPECT_FALSE(batch.position_ids.equal(torch::arange(s).unsqueeze(0).expand({2, s})));

  EXPECT_THROW(DataIterator(dataset, 2, 0, 1, 0, torch::kCPU, {}, /*cp_rank=*/2, /*cp_size=*/2), std::invalid_argument);
  try {
    DataIterator(dataset, 2, 0, 1, 0, torch::kCPU, {}, 0, /*cp_size=*/3);  // 16 is not a multiple of 6
    ADD_FAILURE() << "seq_length 16 split over cp 3";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("not divisible by 2 x context_parallel_size (6)"), std::string::npos)
        << error.what();
  }
  DocumentMasking documents;
  documents.eod_token = eod;
  documents.reset_attention_mask = true;
  EXPECT_THROW(DataIterator(dataset, 2, 0, 1, 0, torch::kCPU, documents, 0, 2), std::invalid_argument);
}

class PackedDocuments : public ::testing::TestWithParam<models::AttnBackend> {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

TEST_P(PackedDocuments, ADocumentAfterAnEodSeesWhatItSeesAlone) {
  models::GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 32;
  config.num_attention_heads = 4;
  config.vocab_size = 64;
  config.seq_length = 16;
  config.hidden_dropout = 0.0;
  config.attention_dropout = 0.0;
  config.attention_backend = GetParam();
  models::GPTModel model = models::build_gpt_model(config).front();
  model->eval();
  const std::vector<int64_t> first = {3, 14, 15, 9, 2}, second = {6, 5, 35, 8, 9, 7};
  const int64_t eod = 63;
  std::vector<int64_t> packed = first;
  packed.push_back(eod);
  packed.insert(packed.end(), second.begin(), second.end());

  torch::NoGradGuard no_grad;
  GPTBatch batch = batch_of(packed);
  apply_document_masking(batch, {eod, true, true, false});
  const torch::Tensor together = model->forward(batch.tokens, batch.position_ids, {}, batch.attention_mask);
  GPTBatch alone = batch_of(second);
  alone.position_ids = torch::arange(6, torch::kLong).unsqueeze(0);
  const torch::Tensor by_itself = model->forward(alone.tokens, alone.position_ids);
  const torch::Tensor after_eod = together.slice(1, 6, 12);
  EXPECT_TRUE(torch::allclose(after_eod, by_itself, 1e-5, 1e-5)) << (after_eod - by_itself).abs().max();
  // Without the masks the second document sees the first.
  GPTBatch plain = batch_of(packed);
  plain.position_ids = torch::arange(12, torch::kLong).unsqueeze(0);
  const torch::Tensor causal = model->forward(plain.tokens, plain.position_ids).slice(1, 6, 12);
  EXPECT_FALSE(torch::allclose(causal, by_itself, 1e-3, 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Backends, PackedDocuments,
                         ::testing::Values(models::AttnBackend::kAuto, models::AttnBackend::kUnfused));

TEST(OpenaiGelu, IsTheTanhApproximation) {
  parallel::init_distributed(parallel::LaunchEnv{}, {});
  parallel::initialize_model_parallel(1);
  models::GPTConfig config;
  config.hidden_size = 16;
  config.activation_func = models::ActivationFunc::kOpenaiGelu;
  models::MLP mlp(config, "decoder.layers.0.mlp.");
  // Inputs large enough for the two GeLUs to differ (they agree to 1e-6 near 0).
  const torch::Tensor x = 200.0 * torch::randn({4, 2, 16});
  const torch::Tensor h = torch::nn::functional::linear(x, mlp->linear_fc1->weight, mlp->linear_fc1->bias);
  // GPT-2's gelu_new, written out.
  const torch::Tensor gelu_new =
      0.5 * h * (1.0 + torch::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (h + 0.044715 * h.pow(3))));
  const torch::Tensor expected =
      torch::nn::functional::linear(gelu_new, mlp->linear_fc2->weight, mlp->linear_fc2->bias);
  EXPECT_TRUE(torch::allclose(mlp(x), expected, 1e-5, 1e-6));
  config.activation_func = models::ActivationFunc::kGelu;
  models::MLP exact(config, "decoder.layers.0.mlp.");
  EXPECT_FALSE(torch::allclose(exact(x), expected, 1e-6, 1e-7)) << "the exact GeLU differs from the tanh one";
  parallel::destroy_distributed();
}

}  // namespace
}  // namespace bridge::training
