// Checkpoints of another model (part of checkpoint_test): refused before anything changes, naming the tensor, both
// shapes and, from the config the checkpoint saved, the model.* keys that change a tensor's shape with the overrides
// that load it (and, for learned absolute positions at another seq_length, why that model cannot go on at it); a
// checkpoint whose config is missing or unreadable is still one of another model, not a damaged one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "training/checkpointing/checkpoint_state.h"
#include "training/checkpointing/checkpointing.h"
#include "utils/torch_pickle.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

ConfigContainer tiny_config(int64_t steps) {
  ConfigContainer config;
  config.model.num_layers = 2;
  config.model.hidden_size = 16;
  config.model.num_attention_heads = 2;
  config.model.vocab_size = 64;
  config.model.seq_length = 8;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 4;
  config.train.train_iters = steps;
  config.train.num_threads = 1;
  return config;
}

fs::path fresh_directory(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / ("bridge_checkpoint_mismatch_test_" + name);
  fs::remove_all(path);
  return path;
}

void train(const ConfigContainer& config) { pretrain(config, gpt_forward_step, std::make_shared<CallbackManager>()); }

// The error names the tensor or file (and each of `also`), and nothing (tracker, on_checkpoint_load) happened.
void expect_refused(const ConfigContainer& config, const std::string& message,
                    const std::vector<std::string>& also = {}, const std::vector<std::string>& not_named = {}) {
  auto manager = std::make_shared<CallbackManager>();
  int loads = 0, steps = 0;
  manager->register_callback(Event::kCheckpointLoad, [&](CallbackContext&) { ++loads; });
  manager->register_callback(Event::kTrainStepStart, [&](CallbackContext&) { ++steps; });
  try {
    pretrain(config, gpt_forward_step, manager);
    ADD_FAILURE() << "loaded a checkpoint that does not fit; expected: " << message;
  } catch (const std::exception& error) {
    EXPECT_THAT(error.what(), HasSubstr(message));
    for (const std::string& part : also) EXPECT_THAT(error.what(), HasSubstr(part));
    for (const std::string& part : not_named) EXPECT_THAT(error.what(), Not(HasSubstr(part)));
  }
  EXPECT_EQ(loads, 0);
  EXPECT_EQ(steps, 0);
}

// In both formats: torch_dist names Megatron-Core's keys (the layers stacked on a leading axis), so a deeper model
// differs in a stacked tensor's shape where the legacy files lack a layer's tensors.
TEST(Checkpoint, CheckpointOfAnotherModelIsRefusedBeforeAnythingChanges) {
  for (const std::string format : {"torch", "torch_dist"}) {
    SCOPED_TRACE(format);
    const bool dist = format == "torch_dist";
    const fs::path saved = fresh_directory("mismatch_saved_" + format);
    ConfigContainer config = tiny_config(2);
    config.checkpoint.save = saved.string();
    config.checkpoint.ckpt_format = format;
    train(config);

    ConfigContainer wider = tiny_config(4);
    wider.checkpoint.load = saved.string();
    wider.model.ffn_hidden_size = 48;
    expect_refused(wider, dist ? "decoder.layers.mlp.linear_fc1.weight has the global shape [2, 64, 16]"
                               : "decoder.layers.0.mlp.linear_fc1.weight");
    const std::string no_layer_2 = dist ? " has the global shape [" : "the checkpoint has no tensor decoder.layers.2.";
    ConfigContainer deeper = tiny_config(4);
    deeper.checkpoint.load = saved.string();
    deeper.model.num_layers = 3;
    // Which sizes differ, read from the config the checkpoint saved, and the override that loads it.
    expect_refused(deeper, no_layer_2, {"model.num_layers 2 (this run: 3)", "model.num_layers=2"});
    ConfigContainer broader = tiny_config(4);
    broader.checkpoint.load = saved.string();
    broader.model.hidden_size = 32;
    expect_refused(broader, " has the global shape [",
                   {"16] in the checkpoint", "32] in this run's model", "model.hidden_size 16 (this run: 32)",
                    "model.hidden_size=16", "another checkpoint.save"});
    // Only the keys that change a tensor's shape: a dropout or an initialisation that differs loads as it is and is
    // not named; seq_length sizes a learned positions' table, as tiny_config's default positions are.
    ConfigContainer also_dropout = deeper;
    also_dropout.model.hidden_dropout = 0.25;
    also_dropout.model.init_method_std = 0.05;
    also_dropout.model.seq_length = 16;
    expect_refused(also_dropout, no_layer_2,
                   {"model.num_layers 2 (this run: 3)", "model.seq_length 8 (this run: 16)",
                    "(model.num_layers=2 model.seq_length=8)"},
                   {"hidden_dropout", "init_method_std"});
    ConfigContainer sgd = tiny_config(4);
    sgd.checkpoint.load = saved.string();
    sgd.optimizer.optimizer = "sgd";
    expect_refused(sgd, "optimizer.optimizer");

    // A missing rank file, then a missing index (common.pt; torch_dist's .metadata), each named.
    const fs::path copy = fresh_directory("mismatch_copy_" + format);
    fs::copy(saved, copy, fs::copy_options::recursive);
    const fs::path rank_file = copy / "iter_0000002" / (dist ? "__0_0.distcp" : "mp_rank_00/model_optim_rng.pt");
    ASSERT_TRUE(fs::remove(rank_file));
    ConfigContainer missing = tiny_config(4);
    missing.checkpoint.load = copy.string();
    expect_refused(missing, rank_file.string());
    const std::string index = dist ? ".metadata" : "common.pt";
    ASSERT_TRUE(fs::remove(copy / "iter_0000002" / index));
    expect_refused(missing, index + " is missing");
    fs::remove_all(saved);
    fs::remove_all(copy);
  }
}

// Learned absolute positions have one trained row per position, model.seq_length of them: a resume at twice the
// length is refused before anything changes, saying why the model cannot be extended and what can (a RoPE model
// resumes at any length: checkpoint_test's ResumeAtALongerSeqLength...).
TEST(Checkpoint, ALearnedPositionsModelIsRefusedAtALongerSeqLength) {
  const fs::path saved = fresh_directory("learned_positions");
  ConfigContainer config = tiny_config(2);
  config.checkpoint.save = saved.string();
  train(config);
  ConfigContainer longer = tiny_config(4);
  longer.checkpoint.load = saved.string();
  longer.model.seq_length = 16;
  expect_refused(longer, "embedding.position_embeddings.weight has the global shape [8, 16] in the checkpoint",
                 {"[16, 16] in this run's model", "model.seq_length 8 (this run: 16)",
                  "have one trained row per position, model.seq_length of them (8 in the checkpoint)",
                  "goes on at model.seq_length 8 only",
                  "needs a model with rotary positions (model.position_embedding_type rope or yarn)"});
  // Another mismatch of the same model at its own length says nothing of positions.
  ConfigContainer deeper = tiny_config(4);
  deeper.checkpoint.load = saved.string();
  deeper.model.num_layers = 3;
  expect_refused(deeper, "model.num_layers 2 (this run: 3)", {}, {"Learned absolute position embeddings"});
  fs::remove_all(saved);
}

// A checkpoint's config without a readable "config" (another version's, or edited): the mismatch keeps its own
// message and the generic fix instead of turning into "damaged or not a bridge checkpoint".
TEST(Checkpoint, AMismatchWithoutTheSavedConfigIsStillOneOfAnotherModel) {
  const fs::path saved = fresh_directory("no_config");
  ConfigContainer config = tiny_config(2);
  config.checkpoint.save = saved.string();
  config.checkpoint.ckpt_format = "torch";  // its common.pt is edited below
  train(config);
  const fs::path common_path = saved / "iter_0000002" / "common.pt";
  const c10::impl::GenericDict original = bridge::utils::load_torch_pickle(common_path).toGenericDict();
  for (const bool present : {false, true}) {
    SCOPED_TRACE(present ? "config not a string" : "no config");
    c10::impl::GenericDict common = original.copy();
    if (present) {
      common.insert_or_assign(c10::IValue(std::string("config")), c10::IValue(int64_t{7}));
    } else {
      EXPECT_EQ(common.erase(c10::IValue(std::string("config"))), 1U);
    }
    bridge::utils::save_torch_pickle(common_path, common);
    ConfigContainer deeper = tiny_config(4);
    deeper.checkpoint.load = saved.string();
    deeper.model.num_layers = 3;
    expect_refused(deeper, "the checkpoint has no tensor decoder.layers.2.",
                   {"make model.* match the checkpoint's config"}, {"damaged", "not a bridge checkpoint"});
  }
}

// The hint names only what changes a tensor's shape, whatever else differs; seq_length only where it sizes the
// learned positions' table.
TEST(ModelDifferences, NameOnlyTheKeysThatChangeATensorsShape) {
  ConfigContainer saved = tiny_config(2);
  saved.model.position_embedding_type = models::PositionEmbeddingType::kRope;
  ConfigContainer run = saved;
  run.model.hidden_dropout = 0.3;
  run.model.attention_dropout = 0.3;
  run.model.init_method_std = 0.5;
  run.model.layernorm_epsilon = 1e-3;
  run.model.rotary_base = 500000;
  run.model.seq_length = 32;
  EXPECT_EQ(model_differences(to_yaml(saved), run), "") << "nothing that changes a shape differs";
  run.model.hidden_size = 32;
  run.model.add_qkv_bias = true;
  const std::string hint = model_differences(to_yaml(saved), run);
  EXPECT_THAT(hint, HasSubstr("model.hidden_size 16 (this run: 32); model.add_qkv_bias false (this run: true)"));
  EXPECT_THAT(hint, HasSubstr("(model.hidden_size=16 model.add_qkv_bias=false)"));
  for (const char* key : {"dropout", "init_method_std", "layernorm_epsilon", "rotary_base", "seq_length"}) {
    EXPECT_THAT(hint, Not(HasSubstr(key))) << hint;
  }
  // Learned absolute positions (either side): their table is [seq_length, hidden_size].
  run.model.position_embedding_type = models::PositionEmbeddingType::kLearnedAbsolute;
  EXPECT_THAT(model_differences(to_yaml(saved), run),
              HasSubstr("model.position_embedding_type rope (this run: learned_absolute); model.seq_length 8 (this "
                        "run: 32)"));
  EXPECT_EQ(model_differences("not: [yaml", run), "") << "an unreadable config gives no hint";
}

}  // namespace
}  // namespace bridge::training
