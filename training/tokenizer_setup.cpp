// setup_tokenizer: the tokenizer section applied to the rest of the config (see the header).
#include "training/tokenizer_setup.h"

#include <fmt/format.h>

#include <filesystem>
#include <stdexcept>

#include "training/tokenizers/build_tokenizer.h"
#include "utils/exception_message.h"

namespace bridge::training {
namespace {

constexpr char kHuggingFacePrefix[] = "hf:";

// An hf:<dir> start with no tokenizer section takes <dir>'s tokenizer.json, as Megatron-Bridge's recipes name the
// Hugging Face directory as their tokenizer_model.
void adopt_hf_tokenizer(ConfigContainer& config) {
  const std::string& source = config.checkpoint.pretrained_checkpoint;
  if (!config.tokenizer.tokenizer_type.empty() || source.rfind(kHuggingFacePrefix, 0) != 0) return;
  const std::string dir = source.substr(sizeof(kHuggingFacePrefix) - 1);
  if (!std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json")) return;
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  config.tokenizer.tokenizer_model = dir;
}

void set_vocab_size(ConfigContainer& config, const tokenizers::Tokenizer& tokenizer) {
  const int64_t ids = tokenizer.vocab_size();
  int64_t& vocab_size = config.model.vocab_size;
  const bool pretrained = !config.checkpoint.pretrained_checkpoint.empty();
  // Megatron-Bridge's model.vocab_size may be unset (None) and then comes from the tokenizer; bridge's always has a
  // value, so "unset" is read as "smaller than the tokenizer" for a model that starts from scratch.
  const bool use_tokenizer = config.tokenizer.use_tokenizer_vocab_size.value_or(!pretrained && vocab_size < ids);
  if (use_tokenizer) {
    vocab_size = ids;
    return;
  }
  if (vocab_size < ids) {
    throw std::invalid_argument(fmt::format(
        "model.vocab_size ({}) is smaller than the {} ids of the tokenizer ({}); {}", vocab_size, ids, tokenizer.name(),
        pretrained
            ? "checkpoint.pretrained_checkpoint's vocabulary cannot hold its ids: use the tokenizer the "
              "checkpoint was trained with"
            : fmt::format("set model.vocab_size to at least {} or tokenizer.use_tokenizer_vocab_size: true", ids)));
  }
}

void set_eod_token_id(ConfigContainer& config, const tokenizers::Tokenizer& tokenizer) {
  DatasetConfig& dataset = config.dataset;
  if (dataset.eod_token_id) return;
  try {
    dataset.eod_token_id = tokenizer.eod();
  } catch (const std::logic_error& error) {
    // Without an EOD id nothing looks for one, unless a masking option does.
    if (dataset.reset_position_ids || dataset.reset_attention_mask || dataset.eod_mask_loss) {
      throw std::invalid_argument(
          fmt::format("dataset.reset_position_ids, reset_attention_mask and eod_mask_loss look for an end-of-document "
                      "id, but {}; set dataset.eod_token_id",
                      error.what()));
    }
  }
}

}  // namespace

std::shared_ptr<const tokenizers::Tokenizer> setup_tokenizer(ConfigContainer& config) {
  adopt_hf_tokenizer(config);
  if (config.tokenizer.tokenizer_type.empty()) return nullptr;
  tokenizers::validate_tokenizer_config(config.tokenizer, "tokenizer.");
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer;
  try {
    tokenizer = tokenizers::shared_tokenizer(config.tokenizer);  // loaded once for bridge-pretrain and pretrain()
  } catch (const std::exception& error) {
    throw std::invalid_argument("tokenizer (" + config.tokenizer.tokenizer_type +
                                "): " + bridge::utils::describe(error));
  }
  set_vocab_size(config, *tokenizer);
  set_eod_token_id(config, *tokenizer);
  return tokenizer;
}

}  // namespace bridge::training
