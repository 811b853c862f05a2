// setup_tokenizer: the tokenizer section deciding model.vocab_size (Megatron-Bridge's _validate_and_set_vocab_size
// with bridge's automatic null), dataset.eod_token_id, and an hf:<dir> start's own tokenizer.json; then the
// TextGenerator following the run's tokenizer. Tokenizers that need no files (ByteLevel, NullTokenizer) and a
// hand-written three-token tokenizer.json keep every expected value derivable by hand.
#include "training/tokenizer_setup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/datasets_test_support.h"
#include "training/config/config_yaml.h"
#include "training/tokenizers/build_tokenizer.h"

namespace bridge::training {
namespace {

namespace fs = std::filesystem;
using datasets::testing::ScratchDir;
using datasets::testing::write_bytes;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A BPE over "a", "b" and their merge "ab"; with `eos`, the added token "</s>" (id 3) as tokenizer_config.json's
// eos_token.
std::string tiny_hf_tokenizer(const fs::path& dir, bool eos) {
  fs::create_directories(dir);
  const std::string added =
      eos ? R"([{"id": 3, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true}])"
          : "[]";
  write_bytes((dir / "tokenizer.json").string(),
              R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": )" + added +
                  R"(, "normalizer": null, "pre_tokenizer": null,
      "post_processor": null, "decoder": null,
      "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  if (eos) write_bytes((dir / "tokenizer_config.json").string(), R"({"eos_token": "</s>"})");
  return dir.string();
}

std::string error_of_validate(const ConfigContainer& config) {
  try {
    config.validate(1);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

std::string error_of(ConfigContainer& config) {
  try {
    setup_tokenizer(config);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SetupTokenizer, NoTokenizerChangesNothing) {
  ConfigContainer config;
  config.model.vocab_size = 1000;
  EXPECT_EQ(setup_tokenizer(config), nullptr);
  EXPECT_EQ(config.model.vocab_size, 1000);
  EXPECT_FALSE(config.dataset.eod_token_id.has_value());
}

TEST(SetupTokenizer, AModelFromScratchTakesTheTokenizersVocabularyAndEod) {
  ConfigContainer config;  // model.vocab_size keeps its default, 256
  config.tokenizer.tokenizer_type = "ByteLevel";
  const auto tokenizer = setup_tokenizer(config);
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(config.model.vocab_size, 257);
  EXPECT_EQ(config.dataset.eod_token_id, 256);
  // A second call (pretrain() after bridge-pretrain) changes nothing.
  setup_tokenizer(config);
  EXPECT_EQ(config.model.vocab_size, 257);
  EXPECT_EQ(config.dataset.eod_token_id, 256);
}

// bridge-pretrain's config resolution, pretrain() and the TextGenerator share one load of the run's tokenizer; a
// changed file is loaded anew.
TEST(SetupTokenizer, TheRunsTokenizerIsLoadedOnceUntilItsFilesChange) {
  ScratchDir scratch;
  ConfigContainer config;
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  config.tokenizer.tokenizer_model = tiny_hf_tokenizer(scratch.path() / "tok", /*eos=*/false);
  const auto first = setup_tokenizer(config);
  ConfigContainer again = config;
  EXPECT_EQ(setup_tokenizer(again).get(), first.get());
  EXPECT_EQ(tokenizers::shared_tokenizer(config.tokenizer).get(), first.get());
  EXPECT_THROW(first->eod(), std::logic_error);  // no eos_token yet

  tiny_hf_tokenizer(scratch.path() / "tok", /*eos=*/true);  // adds tokenizer_config.json and the added token
  const auto changed = tokenizers::shared_tokenizer(config.tokenizer);
  EXPECT_NE(changed.get(), first.get());
  EXPECT_EQ(changed->eod(), 3);
  EXPECT_EQ(tokenizers::shared_tokenizer(config.tokenizer).get(), changed.get());
}

TEST(SetupTokenizer, UseTokenizerVocabSizeAsMegatronBridge) {
  ConfigContainer config;
  config.tokenizer.tokenizer_type = "NullTokenizer";
  config.tokenizer.vocab_size = 1000;
  config.model.vocab_size = 2048;  // larger: kept, the extra ids unused (Megatron-Bridge's "dummy tokens")
  setup_tokenizer(config);
  EXPECT_EQ(config.model.vocab_size, 2048);
  EXPECT_EQ(config.dataset.eod_token_id, 999);

  config.tokenizer.use_tokenizer_vocab_size = true;
  setup_tokenizer(config);
  EXPECT_EQ(config.model.vocab_size, 1000);

  config.tokenizer.use_tokenizer_vocab_size = false;
  config.model.vocab_size = 500;
  EXPECT_THAT(error_of(config), AllOf(HasSubstr("model.vocab_size (500) is smaller than the 1000 ids"),
                                      HasSubstr("tokenizer.use_tokenizer_vocab_size: true")));
}

TEST(SetupTokenizer, APretrainedModelKeepsItsVocabularyAndMustHoldTheTokenizers) {
  ConfigContainer config;
  config.checkpoint.pretrained_checkpoint = "/checkpoints/base";
  config.tokenizer.tokenizer_type = "NullTokenizer";
  config.tokenizer.vocab_size = 300;
  EXPECT_THAT(error_of(config), AllOf(HasSubstr("model.vocab_size (256) is smaller than the 300 ids"),
                                      HasSubstr("checkpoint.pretrained_checkpoint")));
  config.model.vocab_size = 320;
  setup_tokenizer(config);
  EXPECT_EQ(config.model.vocab_size, 320);
}

TEST(SetupTokenizer, AnEodIdWrittenInTheConfigIsKept) {
  ConfigContainer config;
  config.tokenizer.tokenizer_type = "ByteLevel";
  config.dataset.eod_token_id = 10;
  setup_tokenizer(config);
  EXPECT_EQ(config.dataset.eod_token_id, 10);
}

TEST(SetupTokenizer, BadTokenizersAreNamedByTheirKeys) {
  ConfigContainer config;
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  EXPECT_THAT(error_of(config), HasSubstr("needs tokenizer.tokenizer_model"));
  config.tokenizer.tokenizer_type = "Bytelevel";
  EXPECT_THAT(error_of(config), HasSubstr("tokenizer.tokenizer_type: unknown tokenizer type \"Bytelevel\""));
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  config.tokenizer.tokenizer_model = "/nonexistent/llama";
  EXPECT_THAT(error_of(config), AllOf(HasSubstr("tokenizer (HuggingFaceTokenizer)"), HasSubstr("/nonexistent/llama")));
  // ConfigContainer::validate names the key as well, without reading files.
  config.tokenizer.tokenizer_model.clear();
  EXPECT_THROW(
      {
        try {
          config.validate(1);
        } catch (const std::invalid_argument& e) {
          EXPECT_THAT(e.what(), HasSubstr("tokenizer.tokenizer_model"));
          throw;
        }
      },
      std::invalid_argument);
}

TEST(SetupTokenizer, TokenizerFieldsWithoutATypeAreAnError) {
  ConfigContainer config;
  config.tokenizer.vocab_size = 32000;  // Megatron-Bridge's NullTokenizer size, without the NullTokenizer
  try {
    config.validate(1);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("tokenizer.vocab_size is set but tokenizer.tokenizer_type is not"),
                                HasSubstr("NullTokenizer")));
  }
  // Every other field, named as the user wrote it.
  const std::vector<std::pair<std::string, void (*)(ConfigContainer&)>> others = {
      {"tokenizer_model", [](ConfigContainer& c) { c.tokenizer.tokenizer_model = "tok"; }},
      {"vocab_file", [](ConfigContainer& c) { c.tokenizer.vocab_file = "vocab.json"; }},
      {"merge_file", [](ConfigContainer& c) { c.tokenizer.merge_file = "merges.txt"; }},
      {"null_tokenizer_eod_id", [](ConfigContainer& c) { c.tokenizer.null_tokenizer_eod_id = 0; }}};
  for (const auto& [name, set] : others) {
    ConfigContainer other;
    set(other);
    EXPECT_THAT(error_of_validate(other), HasSubstr("tokenizer." + name + " is set but tokenizer.tokenizer_type"));
  }
}

TEST(SetupTokenizer, AnHfStartUsesItsDirectorysTokenizer) {
  ScratchDir scratch;
  const std::string dir = tiny_hf_tokenizer(scratch.path() / "model", /*eos=*/true);
  ConfigContainer config;
  config.checkpoint.pretrained_checkpoint = "hf:" + dir;
  config.model.vocab_size = 8;  // from the directory's config.json in bridge-pretrain
  setup_tokenizer(config);
  EXPECT_EQ(config.tokenizer.tokenizer_type, "HuggingFaceTokenizer");
  EXPECT_EQ(config.tokenizer.tokenizer_model, dir);
  EXPECT_EQ(config.model.vocab_size, 8);
  EXPECT_EQ(config.dataset.eod_token_id, 3);

  // A tokenizer section wins over the directory's.
  ConfigContainer own;
  own.checkpoint.pretrained_checkpoint = "hf:" + dir;
  own.model.vocab_size = 300;
  own.tokenizer.tokenizer_type = "ByteLevel";
  setup_tokenizer(own);
  EXPECT_EQ(own.tokenizer.tokenizer_type, "ByteLevel");
  EXPECT_EQ(own.dataset.eod_token_id, 256);
}

TEST(SetupTokenizer, MaskingWithoutAnEodIdIsAnError) {
  ScratchDir scratch;
  ConfigContainer config;
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  config.tokenizer.tokenizer_model = tiny_hf_tokenizer(scratch.path() / "model", /*eos=*/false);
  setup_tokenizer(config);                  // nothing looks for an EOD id
  EXPECT_EQ(config.model.vocab_size, 256);  // already holds the 3 ids
  EXPECT_FALSE(config.dataset.eod_token_id.has_value());
  config.dataset.eod_mask_loss = true;
  EXPECT_THAT(error_of(config), AllOf(HasSubstr("no eos_token"), HasSubstr("set dataset.eod_token_id")));
}

TEST(SetupTokenizer, MegatronBridgeRecipesTokenizerSectionLoads) {
  ConfigContainer config = load_config_yaml_string(R"(
tokenizer:
  _target_: megatron.bridge.training.tokenizers.config.TokenizerConfig
  tokenizer_type: NullTokenizer
  vocab_size: 32000
  use_tokenizer_vocab_size: true
  legacy_tokenizer: false
  vocab_extra_ids: 0
  special_tokens: null
  hf_tokenizer_kwargs: {}
  tiktoken_num_special_tokens: 1000
  make_vocab_size_divisible_by: 1
model:
  vocab_size: null
)");
  setup_tokenizer(config);
  EXPECT_EQ(config.model.vocab_size, 32000);
  EXPECT_EQ(config.dataset.eod_token_id, 31999);
}

}  // namespace
}  // namespace bridge::training
