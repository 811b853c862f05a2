// The MoE math against direct computations (Megatron-Core's formulas, moe_ep.md 1.4-1.5): every router variant,
// the load-balancing and z losses on a hand-checked case, capacity dropping, permutation, the auxiliary-loss
// gradient, the expert-bias update; then the MoE layer in one process against a per-token loop over its experts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "bridge/models/gpt_config.h"
#include "bridge/models/moe/moe_layer.h"
#include "bridge/models/moe/moe_logging.h"
#include "bridge/models/moe/moe_utils.h"
#include "bridge/models/transformer_layer.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"

namespace bridge::models::moe {
namespace {

using torch::indexing::Slice;

// Per row: softmax over all, the k largest, renormalised (Hugging Face's Qwen-MoE/Mixtral router).
torch::Tensor reference_softmax_topk(const torch::Tensor& logits, int64_t k, bool renormalise) {
  const torch::Tensor scores = torch::softmax(logits, -1);
  const auto [top, idx] = torch::topk(scores, k, 1);
  torch::Tensor probs = renormalise ? top / top.sum(-1, true) : top;
  return torch::zeros_like(logits).scatter(1, idx, probs);
}

TEST(MoERouting, SoftmaxAfterTopkEqualsSoftmaxTopkRenormalisedAndPreSoftmaxDoesNotRenormalise) {
  torch::manual_seed(0);
  const torch::Tensor logits = torch::randn({16, 8});
  const Routing post = topk_routing_with_score_function(logits, 2, false, {}, {}, {}, MoERouterScoreFunction::kSoftmax);
  EXPECT_TRUE(torch::allclose(post.probs, reference_softmax_topk(logits, 2, true), 1e-6, 1e-7));
  EXPECT_TRUE(post.routing_map.sum(1).eq(2).all().item<bool>());
  EXPECT_TRUE(post.routing_map.equal(post.probs.gt(0)));
  const Routing pre = topk_routing_with_score_function(logits, 2, true, {}, {}, {}, MoERouterScoreFunction::kSoftmax);
  EXPECT_TRUE(torch::allclose(pre.probs, reference_softmax_topk(logits, 2, false), 1e-6, 1e-7));
  const Routing scaled =
      topk_routing_with_score_function(logits, 2, true, {}, {}, 2.5, MoERouterScoreFunction::kSoftmax);
  EXPECT_TRUE(torch::allclose(scaled.probs, pre.probs * 2.5));
}

TEST(MoERouting, SigmoidChoosesWithTheBiasButWeighsWithoutItRenormalised) {
  const torch::Tensor logits = torch::tensor({{2.0f, 1.0f, 0.0f, -1.0f}});
  const torch::Tensor bias = torch::tensor({0.0f, 0.0f, 0.0f, 5.0f});
  const Routing r =
      topk_routing_with_score_function(logits, 2, false, {}, {}, {}, MoERouterScoreFunction::kSigmoid, bias);
  // The bias moves expert 3 in; expert 0 (highest score) stays; the weights are the unbiased sigmoids renormalised.
  EXPECT_TRUE(r.routing_map.equal(torch::tensor({{true, false, false, true}})));
  const double s0 = 1.0 / (1.0 + std::exp(-2.0));
  const double s3 = 1.0 / (1.0 + std::exp(1.0));
  EXPECT_NEAR(r.probs[0][0].item<double>(), s0 / (s0 + s3), 1e-6);
  EXPECT_NEAR(r.probs[0][3].item<double>(), s3 / (s0 + s3), 1e-6);
}

TEST(MoERouting, GroupLimitedRoutingPicksOnlyFromTheBestGroups) {
  // Two groups of 4; group 0's best two sum to 1.0 + 0.9, group 1's to 1.5 + 0.1: with one group, k = 2 comes from
  // group 1 although expert 1 (0.9) beats expert 5 (0.1).
  const torch::Tensor logits = torch::tensor({{1.0f, 0.9f, 0.0f, 0.0f, 1.5f, 0.1f, 0.0f, -1.0f}});
  const Routing r = topk_routing_with_score_function(logits, 2, true, 2, 1, {}, MoERouterScoreFunction::kSoftmax);
  EXPECT_TRUE(r.routing_map.equal(torch::tensor({{false, false, false, false, true, true, false, false}})));
}

TEST(MoELosses, AuxSeqAuxAndZLossEqualMegatronsFormulasOnAHandCheckedCase) {
  // 3 tokens, 2 experts, k = 1: softmax scores per token, top-1 counts N = [2, 1].
  const torch::Tensor logits = torch::tensor({{1.0, 0.0}, {2.0, 0.0}, {0.0, 1.0}}, torch::kDouble);
  const Routing aux = compute_routing_scores_for_aux_loss(logits, 1, MoERouterScoreFunction::kSoftmax);
  const torch::Tensor counts = aux.routing_map.sum(0);
  EXPECT_EQ(counts[0].item<int64_t>(), 2);
  EXPECT_EQ(counts[1].item<int64_t>(), 1);
  const auto sm = [](double a, double b) { return std::exp(a) / (std::exp(a) + std::exp(b)); };
  const double p0 = sm(1, 0) + sm(2, 0) + sm(0, 1);  // sum of expert 0's scores
  const double p1 = 3.0 - p0;
  // L = c * E / (k * T^2) * sum_i P_i * N_i
  const double expected = 0.01 * 2.0 / (1.0 * 9.0) * (p0 * 2.0 + p1 * 1.0);
  EXPECT_NEAR(switch_load_balancing_loss_func(aux.probs, counts, 3, 1, 2, 0.01).item<double>(), expected, 1e-12);
  // A uniform router balances perfectly at E / (k * T^2) * (T / E) * (T k / E) * E... = coeff * 1.
  const torch::Tensor uniform = torch::full({4, 4}, 0.25, torch::kDouble);
  EXPECT_NEAR(
      switch_load_balancing_loss_func(uniform, torch::full({4}, 2.0, torch::kDouble), 4, 2, 4, 1.0).item<double>(), 1.0,
      1e-12);
  double z = 0.0;
  for (const auto& row : std::vector<std::pair<double, double>>{{1, 0}, {2, 0}, {0, 1}}) {
    z += std::pow(std::log(std::exp(row.first) + std::exp(row.second)), 2);
  }
  EXPECT_NEAR(z_loss_func(logits, 1e-3).item<double>(), 1e-3 * z / 3.0, 1e-12);
}

TEST(MoECapacity, ProbsKeepsTheMostProbablePositionKeepsTheEarliestAndPadFillsToCapacity) {
  // 4 tokens all routed to expert 0 (k = 1, 2 experts): capacity ceil(4 / 2 * 0.5) = 1.
  const torch::Tensor probs = torch::tensor({{0.6f, 0.0f}, {0.9f, 0.0f}, {0.7f, 0.0f}, {0.8f, 0.0f}});
  const Routing routing{probs, probs.gt(0)};
  ASSERT_EQ(get_capacity(4, 2, 0.5), 1);
  const Routing by_probs = apply_router_token_dropping(routing, 1, MoETokenDropPolicy::kProbs, false);
  EXPECT_TRUE(by_probs.routing_map.select(1, 0).equal(torch::tensor({false, true, false, false})));
  const Routing by_position = apply_router_token_dropping(routing, 1, MoETokenDropPolicy::kPosition, false);
  EXPECT_TRUE(by_position.routing_map.select(1, 0).equal(torch::tensor({true, false, false, false})));
  EXPECT_FLOAT_EQ(by_position.probs.sum().item<float>(), 0.6f);
  // Padding: capacity 2, expert 1 had none: it takes two zero-weight tokens, expert 0 its two best.
  const Routing padded = apply_router_token_dropping(routing, 2, MoETokenDropPolicy::kProbs, true);
  EXPECT_TRUE(padded.routing_map.sum(0).equal(torch::tensor({2, 2}, torch::kLong)));
  EXPECT_FLOAT_EQ(padded.probs.select(1, 1).sum().item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(padded.probs.select(1, 0).sum().item<float>(), 0.9f + 0.8f);
  const Routing padded_position = apply_router_token_dropping(routing, 2, MoETokenDropPolicy::kPosition, true);
  EXPECT_TRUE(padded_position.routing_map.sum(0).equal(torch::tensor({2, 2}, torch::kLong)));
  EXPECT_TRUE(padded_position.routing_map.select(1, 0).equal(torch::tensor({true, true, false, false})));
}

TEST(MoEPermutation, GroupsTokensByExpertAndUnpermuteSumsThemBack) {
  torch::manual_seed(1);
  const torch::Tensor tokens = torch::randn({5, 3});
  const torch::Tensor map = torch::tensor(
      {{true, false, true}, {false, true, false}, {true, true, false}, {false, false, true}, {false, true, false}});
  const torch::Tensor probs = torch::rand({5, 3}) * map;
  const Permutation p = permute(tokens, probs, map);
  EXPECT_TRUE(p.sorted_indices.equal(torch::tensor({0, 2, 1, 2, 4, 0, 3}, torch::kLong)));
  EXPECT_TRUE(p.tokens_per_expert.equal(torch::tensor({2, 3, 2}, torch::kLong)));
  EXPECT_TRUE(p.tokens.equal(tokens.index_select(0, p.sorted_indices)));
  // Unpermute sums a token's copies: with weights 1 each token comes back times its number of experts.
  const torch::Tensor back = unpermute(p.tokens, p.sorted_indices, 5);
  EXPECT_TRUE(torch::allclose(back, tokens * map.sum(1, true).to(torch::kFloat)));
}

TEST(MoEAuxLoss, AttachedLossGetsTheBackwardScaleAndTheOutputItsOwnGradient) {
  const torch::Tensor x = torch::randn({3}).requires_grad_(true);
  const torch::Tensor w = torch::tensor(2.0).requires_grad_(true);
  const torch::Tensor aux = w * w;  // d aux / d w = 2 w = 4
  set_aux_loss_backward_scale(0.25);
  const torch::Tensor y = attach_aux_loss(x, aux);
  y.sum().backward();
  set_aux_loss_backward_scale(1.0);
  EXPECT_TRUE(x.grad().equal(torch::ones({3})));
  EXPECT_FLOAT_EQ(w.grad().item<float>(), 0.25f * 4.0f);
}

// Megatron-Core's schedule: loss_scale x cp / micro-batches. Each cp rank's aux loss is its share of the sequences'
// loss (the shares add over tp x cp) and the gradient mean over dp x cp divides by cp: the factor puts it back.
TEST(MoEAuxLoss, TheBackwardScaleIsTheLossScaleTimesContextParallelOverMicroBatches) {
  EXPECT_DOUBLE_EQ(main_loss_backward_scale(1.0, 4, 1), 0.25);
  EXPECT_DOUBLE_EQ(main_loss_backward_scale(1024.0, 4, 1), 256.0);
  EXPECT_DOUBLE_EQ(main_loss_backward_scale(1.0, 4, 2), 0.5);
  EXPECT_THAT([] { main_loss_backward_scale(1.0, 0, 1); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("num_microbatches (0)")));
}

TEST(MoEExpertBias, ExpertsBelowTheMeanAreRaisedAndBusierOnesLowered) {
  const torch::Tensor bias = torch::zeros({4});
  const torch::Tensor updated = get_updated_expert_bias(torch::tensor({1.0f, 5.0f, 3.0f, 3.0f}), bias, 1e-3);
  EXPECT_TRUE(torch::allclose(updated, torch::tensor({1e-3f, -1e-3f, 0.0f, 0.0f})));
}

class MoELayerSingleProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1);
  }
  void TearDown() override { parallel::destroy_distributed(); }
};

GPTConfig tiny_moe(MoETokenDispatcherType dispatcher) {
  GPTConfig config;
  config.num_layers = 2;
  config.hidden_size = 16;
  config.num_attention_heads = 2;
  config.ffn_hidden_size = 24;
  config.gated_linear_unit = true;
  config.activation_func = ActivationFunc::kSilu;
  config.add_bias_linear = false;
  config.num_moe_experts = 4;
  config.moe_ffn_hidden_size = 12;
  config.moe_router_topk = 2;
  config.moe_shared_expert_intermediate_size = 8;
  config.moe_shared_expert_gate = true;
  config.moe_aux_loss_coeff = 1e-2;
  config.moe_z_loss_coeff = 1e-3;
  config.moe_token_dispatcher_type = dispatcher;
  config.gradient_accumulation_fusion = false;
  return config;
}

// out[t] = sum over its k experts of p * expert(x[t]) + sigmoid(x[t] . g) * shared(x[t]), token by token.
torch::Tensor per_token_reference(MoELayerImpl& layer, const torch::Tensor& hidden) {
  torch::NoGradGuard no_grad;
  const torch::Tensor x = hidden.reshape({-1, hidden.size(-1)});
  const Routing routing = topk_routing_with_score_function(layer.router->gating(hidden), 2, false, {}, {}, {},
                                                           MoERouterScoreFunction::kSoftmax);
  torch::Tensor out = torch::zeros_like(x);
  for (int64_t t = 0; t < x.size(0); ++t) {
    for (int64_t e = 0; e < 4; ++e) {
      if (!routing.routing_map[t][e].item<bool>()) continue;
      const auto& expert = layer.experts->local_experts[static_cast<std::size_t>(e)]->as<ExpertMLPImpl>();
      const torch::Tensor h = torch::matmul(x[t], expert->linear_fc1->weight.t());
      const torch::Tensor a = torch::silu(h.narrow(0, 0, 12)) * h.narrow(0, 12, 12);
      out[t] += routing.probs[t][e] * torch::matmul(a, expert->linear_fc2->weight.t());
    }
  }
  out += layer.shared_experts->forward(x.unsqueeze(1)).squeeze(1);
  return out.view(hidden.sizes());
}

TEST_F(MoELayerSingleProcess, BothDispatchersEqualThePerTokenLoopAndTheLossesAreLogged) {
  for (MoETokenDispatcherType dispatcher : {MoETokenDispatcherType::kAllgather, MoETokenDispatcherType::kAlltoall}) {
    const GPTConfig config = tiny_moe(dispatcher);
    MoELayer layer(config, /*layer_number=*/0);
    torch::manual_seed(3);
    const torch::Tensor hidden = torch::randn({6, 2, 16}).requires_grad_(true);
    MoEMetricsTracker::get().clear();
    const torch::Tensor out = layer(hidden);
    EXPECT_TRUE(torch::allclose(out, per_token_reference(*layer, hidden), 1e-5, 1e-6)) << to_string(dispatcher);
    out.sum().backward();
    for (const auto& param : layer->named_parameters()) {
      EXPECT_TRUE(param.value().grad().defined()) << param.key();
    }
    EXPECT_GT(layer->router->weight.grad().abs().sum().item<double>(), 0.0);
    const MoEReport report = MoEMetricsTracker::get().report(config, /*num_microbatches=*/1);
    ASSERT_EQ(report.losses.count("load_balancing_loss"), 1u);
    ASSERT_EQ(report.losses.count("z_loss"), 1u);
    // One of two layers is recorded: the average over the config's 2 MoE layers halves it.
    const Routing aux = compute_routing_scores_for_aux_loss(layer->router->gating(hidden).detach(), 2,
                                                            MoERouterScoreFunction::kSoftmax);
    const double lb = switch_load_balancing_loss_func(aux.probs, aux.routing_map.sum(0), 12, 2, 4, 1.0).item<double>();
    EXPECT_NEAR(report.losses.at("load_balancing_loss"), lb / 2.0, 1e-6);
    double routed = 0;
    for (double count : report.tokens_per_expert[0]) routed += count;
    EXPECT_EQ(routed, 12.0 * 2.0);
  }
}

TEST_F(MoELayerSingleProcess, TransformerLayersFollowMoeLayerFreqAndNameTheirWeightsAsMegatronCore) {
  GPTConfig config = tiny_moe(MoETokenDispatcherType::kAllgather);
  config.moe_layer_freq.pattern = {0, 1};
  TransformerLayer dense(config, 0);
  TransformerLayer sparse(config, 1);
  EXPECT_TRUE(dense->mlp);
  EXPECT_FALSE(dense->moe_layer);
  EXPECT_TRUE(sparse->moe_layer);
  std::vector<std::string> names;
  for (const auto& item : sparse->named_parameters()) names.push_back(item.key());
  EXPECT_THAT(names, ::testing::IsSupersetOf({"mlp.router.weight", "mlp.experts.local_experts.0.linear_fc1.weight",
                                              "mlp.experts.local_experts.3.linear_fc2.weight",
                                              "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.gate_weight",
                                              "pre_mlp_layernorm.weight"}));
}

TEST(MoEConfig, MegatronCoresRulesNameTheFieldAndTheFix) {
  GPTConfig config = tiny_moe(MoETokenDispatcherType::kAllgather);
  const auto message = [](const GPTConfig& c, int tp = 1, int ep = 1) {
    try {
      c.validate(tp, 1, std::nullopt, ep);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(config), "");
  GPTConfig top1 = config;
  top1.moe_router_topk = 1;
  EXPECT_THAT(message(top1), ::testing::HasSubstr("model.moe_router_pre_softmax: true"));
  GPTConfig bias = config;
  bias.moe_router_enable_expert_bias = true;
  EXPECT_THAT(message(bias), ::testing::HasSubstr("moe_router_score_function: sigmoid"));
  EXPECT_THAT(message(config, /*tp=*/2), ::testing::HasSubstr("model.sequence_parallel: true"));
  EXPECT_THAT(message(config, 1, /*ep=*/3),
              ::testing::HasSubstr("divisible by parallelism.expert_model_parallel_size"));
  GPTConfig freq = config;
  freq.moe_layer_freq.pattern = {1, 0, 1};
  EXPECT_THAT(message(freq), ::testing::HasSubstr("one 0 or 1 per layer"));
  GPTConfig pad = config;
  pad.moe_pad_expert_input_to_capacity = true;
  EXPECT_THAT(message(pad), ::testing::HasSubstr("moe_expert_capacity_factor"));
  GPTConfig dense;
  EXPECT_THAT(message(dense, 1, 2), ::testing::HasSubstr("the model has no experts"));
}

}  // namespace
}  // namespace bridge::models::moe
