// What a Hugging Face copy of a run's checkpoint carries beside the weights (bridge/hf/hf_artifacts.h), found from
// what the checkpoint recorded of the run: its checkpoint.pretrained_checkpoint=hf:<dir> start (generation_config.json,
// token ids, context) and its tokenizer section (the tokenizer files AutoTokenizer.from_pretrained loads). Shared by
// bridge-export and checkpoint.also_save_hf_checkpoint, so both write the same directory from the same checkpoint.
//
//   HfArtifacts artifacts = hf_artifacts_of_run(saved.config, "", "", warn, note);
//   hf::save_hf("out", saved.tensors, saved.config.model, "", hf::kMaxShardBytes, artifacts);
#pragma once

#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

#include "bridge/hf/hf_artifacts.h"
#include "training/config/config.h"

namespace bridge::training {

/// A tokenizer whose ids the model cannot embed (more ids than model.vocab_size).
struct TokenizerTooLarge : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Checks that `path` is a tokenizer directory (what save_pretrained wrote), a tokenizer.json or a tokenizer.model;
/// std::invalid_argument naming `what` (the flag or key that gave it) otherwise.
void check_tokenizer_path(const std::filesystem::path& path, const std::string& what);

/// The artifacts of the run `run` (a checkpoint's recorded config): the source is `hf_source` (bridge-export's
/// --hf-source) or the run's hf:<dir>; the tokenizer `tokenizer` (--tokenizer), else the run's tokenizer section, else
/// the source's files. What cannot be found goes to `warn` naming the flag that supplies it (the weights are written
/// anyway), what is only worth saying to `note`. Throws TokenizerTooLarge for a tokenizer the model cannot embed.
hf::HfArtifacts hf_artifacts_of_run(const ConfigContainer& run, const std::string& hf_source,
                                    const std::string& tokenizer, const std::function<void(const std::string&)>& warn,
                                    const std::function<void(const std::string&)>& note);

}  // namespace bridge::training
