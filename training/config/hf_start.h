// An hf:<dir> start (checkpoint.pretrained_checkpoint=hf:<dir>) takes the model's architecture from <dir>/config.json,
// as Megatron-Bridge's AutoBridge builds its model provider from it: the sizes a recipe writes (the embedded one, a
// --config file) give way, so `--config tiny.yaml` and no config stay the same run. Only what the user set on the
// command line must agree with the directory.
//
//   ConfigContainer config = load_config_yaml("examples/recipes/tiny.yaml");
//   const std::set<std::string> user_keys =
//       apply_overrides(config, {"checkpoint.pretrained_checkpoint=hf:/models/llama", "model.seq_length=512"});
//   adopt_hf_architecture(config, user_keys);  // num_layers, hidden_size, ... from /models/llama/config.json
#pragma once

#include <set>
#include <string>

#include "training/config/config.h"

namespace bridge::training {

/// With checkpoint.pretrained_checkpoint = hf:<dir>: config.model's architecture (sizes, groups, head width, norm,
/// positions and RoPE, MLP, biases, q/k norms, tied embeddings) becomes <dir>/config.json's; the rest of the model
/// (seq_length, dropout, initialisation, ...) stays. A key of that architecture in `user_keys` whose value differs is
/// a ConfigError naming both values; an unreadable config.json is one naming the file. Nothing otherwise.
void adopt_hf_architecture(ConfigContainer& config, const std::set<std::string>& user_keys);

}  // namespace bridge::training
