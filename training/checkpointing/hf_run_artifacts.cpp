// hf_artifacts_of_run: the tokenizer files and the source model a run's checkpoint records, as a Hugging Face export
// of it carries them (moved from bridge-export, which checkpoint.also_save_hf_checkpoint shares).
#include "training/checkpointing/hf_run_artifacts.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "training/tokenizers/build_tokenizer.h"
#include "utils/exception_message.h"

namespace bridge::training {
namespace {

namespace fs = std::filesystem;
using tokenizers::TokenizerConfig;

constexpr char kHuggingFacePrefix[] = "hf:";

// The tokenizer files save_pretrained writes, copied from a directory that has them; the first three also beside a
// tokenizer.json or tokenizer.model named alone (they name its special tokens and its class).
constexpr const char* kTokenizerFiles[] = {"tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "added_tokens.json",
                                           "tokenizer.json",
                                           "tokenizer.model",
                                           "vocab.json",
                                           "merges.txt"};
constexpr int kSideFiles = 3;

// A JSON file's object; an empty one when it is missing or not an object.
nlohmann::json read_object(const fs::path& file) {
  std::ifstream in(file);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() ? config : nlohmann::json::object();
}

// A tokenizer's files, by the name each takes in the export, and the config that loads them (for BOS and EOS).
struct TokenizerFiles {
  std::map<std::string, fs::path> files;
  std::map<std::string, std::string> texts;
  TokenizerConfig config;
  fs::path directory;
};

void add_side_files(TokenizerFiles& tokenizer, const fs::path& directory) {
  for (int i = 0; i < kSideFiles; ++i) {
    if (fs::is_regular_file(directory / kTokenizerFiles[i]))
      tokenizer.files[kTokenizerFiles[i]] = directory / kTokenizerFiles[i];
  }
  tokenizer.directory = directory;
}

// A tokenizer given as a directory (what save_pretrained wrote), a tokenizer.json or a tokenizer.model; `what` names
// where it was given in errors (std::invalid_argument).
TokenizerFiles tokenizer_at(const fs::path& path, const std::string& what) {
  TokenizerFiles tokenizer;
  if (fs::is_directory(path)) {
    for (const char* name : kTokenizerFiles) {
      if (fs::is_regular_file(path / name)) tokenizer.files[name] = path / name;
    }
    tokenizer.directory = path;
    const auto has = [&](const char* name) { return tokenizer.files.count(name) > 0; };
    if (has("tokenizer.json")) {
      tokenizer.config = tokenizers::tokenizer_config_of("HuggingFaceTokenizer");
      tokenizer.config.tokenizer_model = fs::absolute(path).string();
    } else if (has("tokenizer.model")) {
      tokenizer.config = tokenizers::tokenizer_config_of("SentencePieceTokenizer");
      tokenizer.config.tokenizer_model = (path / "tokenizer.model").string();
    } else if (has("vocab.json") && has("merges.txt")) {
      tokenizer.config = tokenizers::tokenizer_config_of("GPT2BPETokenizer");
      tokenizer.config.vocab_file = (path / "vocab.json").string();
      tokenizer.config.merge_file = (path / "merges.txt").string();
    } else {
      throw std::invalid_argument(what + " " + path.string() +
                                  " holds no tokenizer.json, tokenizer.model or vocab.json + merges.txt: name the "
                                  "directory that save_pretrained wrote the tokenizer to, or the file");
    }
    return tokenizer;
  }
  const std::string extension = path.extension().string();
  if (!fs::is_regular_file(path) || (extension != ".json" && extension != ".model")) {
    throw std::invalid_argument(
        what + " " + path.string() +
        (fs::exists(path) ? " is neither a directory nor a tokenizer.json or tokenizer.model" : " does not exist") +
        ": name a tokenizer directory (tokenizer.json, tokenizer_config.json, ...) or the file");
  }
  add_side_files(tokenizer, path.parent_path().empty() ? fs::path(".") : path.parent_path());
  const bool json_file = extension == ".json";
  tokenizer.files[json_file ? "tokenizer.json" : "tokenizer.model"] = path;
  tokenizer.config = tokenizers::tokenizer_config_of(json_file ? "HuggingFaceTokenizer" : "SentencePieceTokenizer");
  // Absolute, so that the loader's messages name a real folder (a bare "my-tokenizer.json" has parent "").
  tokenizer.config.tokenizer_model = fs::absolute(path).lexically_normal().string();
  return tokenizer;
}

// The run's tokenizer section as files (null for ByteLevel and NullTokenizer, which have none). GPT-2's vocab.json
// and merges.txt without a tokenizer_config.json get one naming GPT2Tokenizer and Megatron's <|endoftext|>, since
// transformers would otherwise take the tokenizer class from the model_type.
std::optional<TokenizerFiles> run_tokenizer(const TokenizerConfig& config) {
  if (config.tokenizer_type == "ByteLevel" || config.tokenizer_type == "NullTokenizer") return std::nullopt;
  if (config.tokenizer_type != "GPT2BPETokenizer") {
    TokenizerFiles tokenizer = tokenizer_at(config.tokenizer_model, "tokenizer.tokenizer_model");
    tokenizer.config = config;
    return tokenizer;
  }
  TokenizerFiles tokenizer;
  for (const auto& [name, file] :
       {std::pair<const char*, std::string>{"vocab.json", config.vocab_file}, {"merges.txt", config.merge_file}}) {
    if (!fs::is_regular_file(file)) {
      throw std::invalid_argument(std::string("tokenizer.") + (name[0] == 'v' ? "vocab_file " : "merge_file ") + file +
                                  " does not exist");
    }
    tokenizer.files[name] = file;
  }
  add_side_files(tokenizer, fs::path(config.vocab_file).parent_path());
  if (tokenizer.files.count("tokenizer_config.json") == 0) {
    tokenizer.texts["tokenizer_config.json"] =
        R"({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", )"
        R"("unk_token": "<|endoftext|>", "add_prefix_space": false})"
        "\n";
  }
  tokenizer.config = config;
  return tokenizer;
}

bool same_directory(const fs::path& a, const fs::path& b) {
  std::error_code error;
  return !a.empty() && !b.empty() && fs::equivalent(a, b, error);
}

}  // namespace

// What the export writes beside the weights (bridge/hf/hf_artifacts.h), from what the checkpoint recorded of the run
// (its config) and the flags that stand in for what it did not: the source is --hf-source or the run's
// checkpoint.pretrained_checkpoint=hf:<dir>; the tokenizer --tokenizer, else the run's tokenizer section, else the
// source's files. What cannot be found is a warning naming the flag that supplies it: the weights are written anyway.
hf::HfArtifacts hf_artifacts_of_run(const ConfigContainer& run, const std::string& hf_source,
                                    const std::string& tokenizer_flag,
                                    const std::function<void(const std::string&)>& warn,
                                    const std::function<void(const std::string&)>& note) {
  hf::HfArtifacts artifacts;
  const std::string& pretrained = run.checkpoint.pretrained_checkpoint;
  const bool hf_start = pretrained.rfind(kHuggingFacePrefix, 0) == 0;
  if (!hf_source.empty()) {
    artifacts.source = hf_source;
  } else if (hf_start) {
    artifacts.source = pretrained.substr(sizeof(kHuggingFacePrefix) - 1);
    if (!fs::is_regular_file(artifacts.source / "config.json")) {
      warn("the run started from " + pretrained + " (checkpoint.pretrained_checkpoint), which holds no config.json " +
           "now: the export's max_position_embeddings is the training seq_length and it has none of that model's "
           "generation_config.json and token ids; give --hf-source DIR where that model is now");
      artifacts.source.clear();
    }
  }
  std::optional<TokenizerFiles> tokenizer;
  const TokenizerConfig& section = run.tokenizer;
  const bool byte_ids = section.tokenizer_type == "ByteLevel" || section.tokenizer_type == "NullTokenizer";
  if (!tokenizer_flag.empty()) {
    tokenizer = tokenizer_at(tokenizer_flag, "--tokenizer");
  } else if (!section.tokenizer_type.empty()) {
    // An hf:<dir> start's own tokenizer moves with it: --hf-source names where.
    const bool source_tokenizer =
        hf_start && section.tokenizer_model == pretrained.substr(sizeof(kHuggingFacePrefix) - 1);
    try {
      tokenizer =
          source_tokenizer && !hf_source.empty() ? tokenizer_at(hf_source, "--hf-source") : run_tokenizer(section);
    } catch (const std::invalid_argument& e) {
      warn("the run's tokenizer section (" + section.tokenizer_type + ") names files that are gone (" + e.what() +
           "), so the export has no tokenizer files; give --tokenizer DIR-or-FILE where they are now" +
           (source_tokenizer ? " (or --hf-source DIR, the model's directory whose tokenizer it was)" : ""));
    }
    if (byte_ids) {
      note("a " + section.tokenizer_type + " run has no tokenizer files: the export has none (its ids are " +
           (section.tokenizer_type == "ByteLevel" ? "UTF-8 bytes, 256 ending a document" : "the text's numbers") + ")");
    }
  } else if (!artifacts.source.empty()) {
    try {
      tokenizer = tokenizer_at(artifacts.source, "the source directory");
    } catch (const std::invalid_argument&) {
      warn(artifacts.source.string() +
           " (the model the run started from) has no tokenizer files, so neither has the export; give --tokenizer "
           "DIR-or-FILE for the tokenizer the data was made with");
    }
  } else {
    warn(std::string("the checkpoint records no tokenizer (its run had no tokenizer section and did not start from ") +
         "hf:<dir>), so the export has no tokenizer files, which AutoTokenizer.from_pretrained needs; give "
         "--tokenizer DIR-or-FILE for the tokenizer the data was made with");
  }
  // The ids of a tokenizer that is not the source's replace the source's (a model from scratch has none).
  std::optional<TokenizerConfig> ids_from;
  if (tokenizer) {
    artifacts.files = tokenizer->files;
    artifacts.texts = tokenizer->texts;
    if (!same_directory(tokenizer->directory, artifacts.source)) ids_from = tokenizer->config;
  } else if (byte_ids && artifacts.source.empty()) {
    ids_from = section;
  }
  if (ids_from) {
    std::shared_ptr<const tokenizers::Tokenizer> loaded;
    try {
      loaded = tokenizers::shared_tokenizer(*ids_from);
    } catch (const std::exception& e) {
      warn("the tokenizer cannot be read (" + utils::describe(e) +
           "), so config.json and generation_config.json have none of its bos/eos ids");
    }
    const int64_t model_vocab = run.model.vocab_size;
    if (loaded && tokenizer && model_vocab > 0 && loaded->vocab_size() > model_vocab) {
      // A smaller one is fine: the model's extra rows are padding no id reaches.
      throw TokenizerTooLarge((tokenizer_flag.empty() ? "the run's tokenizer section (" + section.tokenizer_type + ")"
                                                      : "--tokenizer " + tokenizer_flag) +
                              " has " + std::to_string(loaded->vocab_size()) +
                              " ids (added tokens included), more than the model's " + "vocab_size " +
                              std::to_string(model_vocab) + " (the checkpoint's model.vocab_size): ids past " +
                              std::to_string(model_vocab - 1) +
                              " have no embedding; give --tokenizer the tokenizer the data was made with");
    }
    if (loaded) {
      artifacts.bos_token_id = loaded->bos();
      try {
        artifacts.eos_token_id = loaded->eod();
      } catch (const std::exception& e) {
        // What config.json gets instead, as write_directory decides it (bridge/hf/hf_files.cpp keep_source_fields).
        const nlohmann::json theirs =
            artifacts.source.empty() ? nlohmann::json::object() : read_object(artifacts.source / "config.json");
        std::string ids;
        for (const char* key : {"bos_token_id", "eos_token_id"}) {
          if (theirs.contains(key) && !theirs[key].is_null()) {
            ids += (ids.empty() ? "" : ", ") + std::string(key) + " " + theirs[key].dump();
          }
        }
        std::string outcome;
        if (artifacts.bos_token_id) {
          outcome = "config.json and generation_config.json get its bos_token_id " +
                    std::to_string(*artifacts.bos_token_id) + " and no eos_token_id";
        } else if (!ids.empty()) {
          outcome = "config.json and generation_config.json keep the source's token ids (" + ids +
                    "), which are this tokenizer's only if it numbers its tokens as the source's does";
        } else {
          outcome = "config.json and generation_config.json have no bos/eos ids";
        }
        warn(
            "the tokenizer names no EOS token, so the export's tokenizer has none (AutoTokenizer's eos_token is "
            "None) and " +
            outcome + ". To give it one: " + utils::describe(e));
      }
    }
  }
  if (!artifacts.eos_token_id && artifacts.source.empty() && run.dataset.eod_token_id) {
    artifacts.eos_token_id = run.dataset.eod_token_id;
  }
  return artifacts;
}

void check_tokenizer_path(const fs::path& path, const std::string& what) { tokenizer_at(path, what); }

}  // namespace bridge::training
