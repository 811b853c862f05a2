// adopt_hf_architecture: the directory's model over the recipe's, checked against the command line's.
#include "training/config/hf_start.h"

#include <stdexcept>

#include "bridge/hf/auto_bridge.h"
#include "training/config/config_table.h"
#include "training/config/config_yaml.h"
#include "utils/exception_message.h"
#include "utils/strings.h"

namespace bridge::training {

void adopt_hf_architecture(ConfigContainer& config, const std::set<std::string>& user_keys) {
  const std::string& source = config.checkpoint.pretrained_checkpoint;
  if (source.rfind("hf:", 0) != 0) return;
  models::GPTConfig theirs;
  try {
    theirs = hf::hf_model_config(source.substr(3));
  } catch (const std::exception& error) {
    throw ConfigError("checkpoint.pretrained_checkpoint=" + source + ": " + bridge::utils::describe(error));
  }
  ConfigContainer adopted = config;
  adopted.model = hf::with_hf_architecture(config.model, theirs);
  // The directory's model with the user's own model.* values on top: only those can disagree with it.
  ConfigContainer users = adopted;
  for (const std::string& key : user_keys) {
    const detail::Field* f = detail::find_field(key);
    if (f != nullptr && detail::section_of(key) == "model") f->copy(users, config);
  }
  const std::vector<std::string> differences = hf::architecture_differences(users.model, adopted.model);
  if (!differences.empty()) {
    throw ConfigError("checkpoint.pretrained_checkpoint=" + source + " takes the model from its config.json, but " +
                      bridge::utils::join(differences, ", ") + (differences.size() == 1 ? " disagrees" : " disagree") +
                      ", as set on the command line; drop those overrides (the directory sets them) or make them "
                      "match");
  }
  // What the run chooses beside the architecture (model.seq_length past GPT-2's n_positions, a sliding window shorter
  // than it, ...) is checked against the directory here too, so it stops before any rank starts (exit 2), not when
  // the weights load.
  try {
    hf::check_hf_config(source.substr(3), adopted.model);
  } catch (const std::invalid_argument& error) {
    throw ConfigError("checkpoint.pretrained_checkpoint=" + source + ": " + error.what());
  }
  config = std::move(adopted);
}

}  // namespace bridge::training
