// Documents packed into one sample (Megatron's reset_position_ids, reset_attention_mask, eod_mask_loss): the masks
// and positions of Megatron's _get_ltor_masks_and_position_ids on its worked example, and the model under them: with
// both resets, a document after an end-of-document token gets exactly the logits it gets alone, in either attention
// backend. Also the tanh GeLU (openai_gelu) against its formula.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "bridge/models/gpt_model.h"
#include "bridge/models/transformer_layer.h"
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
