// The run's tokenizer and what follows from it, as Megatron-Bridge's setup() does before building the model: the
// tokenizer section (or an hf:<dir> start's own tokenizer.json) is loaded once, and then
//   - model.vocab_size holds the tokenizer's ids (Megatron-Bridge's _validate_and_set_vocab_size, with bridge's
//     null = automatic for tokenizer.use_tokenizer_vocab_size, since model.vocab_size always has a value),
//   - a null dataset.eod_token_id becomes the tokenizer's end-of-document id,
//   - and a TextGenerator without a tokenizer of its own uses this one (it reads config.tokenizer).
// bridge-pretrain calls it while resolving the config (so --print-config shows the outcome and a bad tokenizer is
// exit 2 before any rank starts); pretrain() calls it again on its copy, which changes nothing the second time.
//
//   ConfigContainer config;
//   config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
//   config.tokenizer.tokenizer_model = "checkpoints/llama3";
//   setup_tokenizer(config);  // config.model.vocab_size = 128256, config.dataset.eod_token_id = 128001
#pragma once

#include <memory>

#include "training/config/config.h"
#include "training/tokenizers/tokenizer.h"

namespace bridge::training {

/// Loads the tokenizer `config` names and makes `config` follow it (above). Returns it; null when the config names
/// none (then nothing changes). Throws std::invalid_argument naming the key and the fix: an unknown type, a missing
/// or bad file, a model.vocab_size too small for the tokenizer's ids, a masking option without an EOD id.
std::shared_ptr<const tokenizers::Tokenizer> setup_tokenizer(ConfigContainer& config);

}  // namespace bridge::training
