// What a Hugging Face export carries beside the weights (Megatron-Bridge's save_artifacts): the model it started
// from, whose generation_config.json and token ids it keeps, and the tokenizer files, so that AutoTokenizer,
// AutoModelForCausalLM and generate() read the export as they read that model, and a run started from the export
// (hf:<dir>) has its tokenizer. bridge-export fills it from what the checkpoint recorded of the run.
//
//   HfArtifacts artifacts;
//   artifacts.source = "llama-dir";                                      // checkpoint.pretrained_checkpoint=hf:...
//   artifacts.files["tokenizer.json"] = "llama-dir/tokenizer.json";      // copied as it is
//   hf::save_hf("out", weights, config, "", kMaxShardBytes, artifacts);
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

namespace bridge::hf {

struct HfArtifacts {
  /// The Hugging Face directory the run started from (hf:<dir>); empty for a model trained from scratch. Its
  /// generation_config.json is copied, and config.json keeps its bos/eos/pad token ids and its
  /// max_position_embeddings (the Llama family's context; the training seq_length when that is longer). GPT-2's
  /// n_positions stays the position table's rows, which the export writes.
  std::filesystem::path source;
  /// Files copied as they are, by the name each takes in the export: tokenizer.json, tokenizer_config.json, ...
  std::map<std::string, std::filesystem::path> files;
  /// Files written with this text, by name (a tokenizer_config.json made for a tokenizer whose files lack one).
  std::map<std::string, std::string> texts;
  /// The BOS and EOS ids of a tokenizer that is not the source's (or of a model trained from scratch): they replace
  /// the source's in config.json and generation_config.json.
  std::optional<int64_t> bos_token_id, eos_token_id;
};

}  // namespace bridge::hf
