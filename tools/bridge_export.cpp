// bridge-export: writes a Hugging Face directory (config.json + model.safetensors, or its shards and
// model.safetensors.index.json past --max-shard-size; AutoModelForCausalLM.from_pretrained loads either) from a bridge
// checkpoint saved in any parallel layout; the reverse of bridge-pretrain checkpoint.pretrained_checkpoint=hf:<dir>.
// The model_type follows the model's shape (gpt2, llama, qwen2, qwen3, and with experts qwen3_moe, qwen2_moe,
// mixtral, olmoe; --model-type mistral for a Mistral). Beside
// the weights: generation_config.json and the tokenizer files (AutoTokenizer.from_pretrained loads them), from the
// run the checkpoint recorded (its hf:<dir> start, its tokenizer section) or --tokenizer / --hf-source.
//
//   bridge-export --checkpoint ckpt --hf-dir hf-out              # the tracker's iteration
//   bridge-export --checkpoint ckpt --iteration 200 --hf-dir hf-out --model-type mistral
//   bridge-export --checkpoint ckpt --hf-dir hf-out --max-shard-size 2GB   # shards of at most 2 GB (default 5GB)
//   bridge-export --checkpoint ckpt --hf-dir hf-out --tokenizer llama3      # the tokenizer files of llama3/
//
// Exit status: 0 written, 1 an unreadable or inconsistent checkpoint or a failed write, 2 bad command line (a
// --tokenizer with more ids than the model's vocab_size included).
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bridge/hf/auto_bridge.h"
#include "bridge/hf/hf_artifacts.h"
#include "bridge/hf/shard_size.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "training/tokenizers/build_tokenizer.h"
#include "utils/exception_message.h"

namespace {

namespace fs = std::filesystem;
using bridge::training::tokenizers::TokenizerConfig;

constexpr int kExitBadInput = 1;
constexpr int kExitBadCommandLine = 2;
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

void warn(const std::string& message) { std::fprintf(stderr, "bridge-export: warning: %s\n", message.c_str()); }

// A tokenizer whose ids the model cannot embed: a bad --tokenizer, so exit 2 though found after the checkpoint is read.
struct TokenizerTooLarge : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

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
      tokenizer.config = bridge::training::tokenizers::tokenizer_config_of("HuggingFaceTokenizer");
      tokenizer.config.tokenizer_model = fs::absolute(path).string();
    } else if (has("tokenizer.model")) {
      tokenizer.config = bridge::training::tokenizers::tokenizer_config_of("SentencePieceTokenizer");
      tokenizer.config.tokenizer_model = (path / "tokenizer.model").string();
    } else if (has("vocab.json") && has("merges.txt")) {
      tokenizer.config = bridge::training::tokenizers::tokenizer_config_of("GPT2BPETokenizer");
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
  tokenizer.config =
      bridge::training::tokenizers::tokenizer_config_of(json_file ? "HuggingFaceTokenizer" : "SentencePieceTokenizer");
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

// What the export writes beside the weights (bridge/hf/hf_artifacts.h), from what the checkpoint recorded of the run
// (its config) and the flags that stand in for what it did not: the source is --hf-source or the run's
// checkpoint.pretrained_checkpoint=hf:<dir>; the tokenizer --tokenizer, else the run's tokenizer section, else the
// source's files. What cannot be found is a warning naming the flag that supplies it: the weights are written anyway.
bridge::hf::HfArtifacts artifacts_for(const bridge::training::ConfigContainer& run, const std::string& hf_source,
                                      const std::string& tokenizer_flag) {
  bridge::hf::HfArtifacts artifacts;
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
      std::printf("bridge-export: a %s run has no tokenizer files: the export has none (its ids are %s)\n",
                  section.tokenizer_type.c_str(),
                  section.tokenizer_type == "ByteLevel" ? "UTF-8 bytes, 256 ending a document" : "the text's numbers");
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
    std::shared_ptr<const bridge::training::tokenizers::Tokenizer> loaded;
    try {
      loaded = bridge::training::tokenizers::shared_tokenizer(*ids_from);
    } catch (const std::exception& e) {
      warn("the tokenizer cannot be read (" + bridge::utils::describe(e) +
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
            outcome + ". To give it one: " + bridge::utils::describe(e));
      }
    }
  }
  if (!artifacts.eos_token_id && artifacts.source.empty() && run.dataset.eod_token_id) {
    artifacts.eos_token_id = run.dataset.eod_token_id;
  }
  return artifacts;
}

// What the export took from the source directory, named only where it did: another directory's tokenizer replaces
// the token ids, a longer training seq_length the context (`longer` then says so), and a source without
// generation_config.json gives none.
std::string kept_from_source(const bridge::hf::HfArtifacts& artifacts, const fs::path& exported, std::string& longer) {
  const nlohmann::json theirs = read_object(artifacts.source / "config.json");
  const nlohmann::json ours = read_object(exported / "config.json");
  const bool new_ids = artifacts.bos_token_id || artifacts.eos_token_id;
  std::vector<std::string> kept;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (!new_ids && theirs.contains(key) && !theirs[key].is_null()) {
      kept.emplace_back("token ids");
      break;
    }
  }
  const auto context = theirs.find("max_position_embeddings");
  if (context != theirs.end() && !context->is_null() &&
      ours.value("max_position_embeddings", nlohmann::json()) == *context) {
    kept.push_back("context length (max_position_embeddings " + context->dump() + ")");
  } else if (context != theirs.end() && !context->is_null() && ours.contains("max_position_embeddings")) {
    longer = "max_position_embeddings " + ours["max_position_embeddings"].dump() +
             ": the training seq_length, longer than the source's " + context->dump();
  }
  if (fs::exists(artifacts.source / "generation_config.json")) {
    kept.emplace_back(new_ids ? "generation_config.json (with the tokenizer's bos/eos ids)" : "generation_config.json");
  }
  std::string text;
  for (std::size_t i = 0; i < kept.size(); ++i) {
    text += (i == 0 ? "" : i + 1 == kept.size() ? " and " : ", ") + kept[i];
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("bridge-export",
                           "Writes a Hugging Face directory (config.json + model.safetensors: GPT-2, Llama, Mistral, "
                           "Qwen2, Qwen3, Qwen3-MoE, Qwen2-MoE, Mixtral or OLMoE, with generation_config.json and the "
                           "run's tokenizer files) from a bridge checkpoint in either format (torch or torch_dist) "
                           "saved in any parallel layout.");
  options.custom_help(
      "--checkpoint DIR --hf-dir DIR [--iteration N] [--model-type TYPE] [--max-shard-size SIZE] "
      "[--tokenizer DIR-or-FILE] [--hf-source DIR]");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint directory (what checkpoint.save names)", cxxopts::value<std::string>(), "DIR")
      ("iteration", "the iteration to export; default: the tracker's (latest_checkpointed_iteration.txt)",
       cxxopts::value<int64_t>(), "N")
      ("hf-dir", "the Hugging Face directory to write (created; the files written are replaced, other files kept)",
       cxxopts::value<std::string>(), "DIR")
      ("model-type", "the config.json model_type to write: gpt2, llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, "
       "mixtral or olmoe; default: what the model's shape is (learned positions: gpt2; q/k norms: qwen3; QKV biases "
       "alone: qwen2; else llama; with experts: q/k norms over all heads: olmoe; per head: qwen3_moe; a shared expert "
       "or QKV biases: qwen2_moe; else mixtral)",
       cxxopts::value<std::string>(), "TYPE")
      ("max-shard-size", "the largest weight file, as transformers' max_shard_size: 5GB, 500MB, 2GiB or bytes; "
       "weights past it are written as shards model-0000K-of-0000N.safetensors with model.safetensors.index.json",
       cxxopts::value<std::string>()->default_value("5GB"), "SIZE")
      ("tokenizer", "the tokenizer files to write beside the weights: a directory save_pretrained wrote (tokenizer.json, "
       "tokenizer_config.json, special_tokens_map.json, tokenizer.model, vocab.json + merges.txt: those it has), or a "
       "tokenizer.json or tokenizer.model; default: the run's tokenizer section, else its hf:<dir>'s. One with more ids "
       "than the model's vocab_size is refused (exit 2)",
       cxxopts::value<std::string>(), "DIR-or-FILE")
      ("hf-source", "the Hugging Face directory the run started from, where it is now; default: the run's "
       "checkpoint.pretrained_checkpoint=hf:<dir>. Its generation_config.json, token ids and max_position_embeddings "
       "are kept", cxxopts::value<std::string>(), "DIR")
      ("h,help", "print this help and exit");
  // clang-format on
  std::string checkpoint, hf_dir, model_type, tokenizer, hf_source;
  std::optional<int64_t> iteration;
  int64_t max_shard_bytes = 0;
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s", options.help().c_str());
      return 0;
    }
    if (!args.unmatched().empty()) {
      throw std::invalid_argument("unexpected argument '" + args.unmatched().front() + "'");
    }
    for (const char* required : {"checkpoint", "hf-dir"}) {
      if (!args.count(required)) throw std::invalid_argument(std::string("--") + required + " is required");
    }
    checkpoint = args["checkpoint"].as<std::string>();
    hf_dir = args["hf-dir"].as<std::string>();
    if (args.count("iteration")) iteration = args["iteration"].as<int64_t>();
    try {
      max_shard_bytes = bridge::hf::parse_shard_size(args["max-shard-size"].as<std::string>());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--max-shard-size: ") + e.what());
    }
    if (args.count("tokenizer")) {
      tokenizer = args["tokenizer"].as<std::string>();
      tokenizer_at(tokenizer, "--tokenizer");  // checked before the checkpoint is read
    }
    if (args.count("hf-source")) {
      hf_source = args["hf-source"].as<std::string>();
      if (!fs::is_regular_file(fs::path(hf_source) / "config.json")) {
        throw std::invalid_argument("--hf-source " + hf_source +
                                    " holds no config.json: name the Hugging Face directory the run started from");
      }
    }
    if (args.count("model-type")) {
      model_type = args["model-type"].as<std::string>();
      static const std::set<std::string> kTypes = {"gpt2",      "llama",     "mistral", "qwen2", "qwen3",
                                                   "qwen2_moe", "qwen3_moe", "mixtral", "olmoe"};
      if (kTypes.count(model_type) == 0) {
        throw std::invalid_argument(
            "--model-type must be gpt2, llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, "
            "mixtral or olmoe, got '" +
            model_type + "'");
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-export: error: %s\nRun bridge-export --help for the options.\n",
                 bridge::utils::describe(e).c_str());
    return kExitBadCommandLine;
  }
  try {
    const bridge::training::SavedWeights saved = bridge::training::load_saved_weights(checkpoint, iteration);
    const std::string type = model_type.empty() ? bridge::hf::hf_model_type_for(saved.config.model) : model_type;
    const bridge::hf::HfArtifacts artifacts = artifacts_for(saved.config, hf_source, tokenizer);
    bridge::hf::save_hf(hf_dir, saved.tensors, saved.config.model, type, max_shard_bytes, artifacts);
    const bool sharded = fs::exists(fs::path(hf_dir) / "model.safetensors.index.json");
    std::string beside = "generation_config.json";
    std::set<std::string> names;
    for (const auto& entry : artifacts.files) names.insert(entry.first);
    for (const auto& entry : artifacts.texts) names.insert(entry.first);
    for (const std::string& name : names) beside += ", " + name;
    std::printf("bridge-export: wrote %s (a %s model: config.json, %s, %s) from %s\n", hf_dir.c_str(), type.c_str(),
                sharded ? "weight shards and model.safetensors.index.json" : "model.safetensors", beside.c_str(),
                saved.path.c_str());
    if (!artifacts.source.empty()) {
      std::string longer;
      const std::string kept = kept_from_source(artifacts, hf_dir, longer);
      if (!kept.empty()) std::printf("bridge-export: kept the %s of %s\n", kept.c_str(), artifacts.source.c_str());
      if (!longer.empty()) std::printf("bridge-export: %s\n", longer.c_str());
    }
  } catch (const TokenizerTooLarge& e) {
    std::fprintf(stderr, "bridge-export: error: %s\n", e.what());
    return kExitBadCommandLine;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-export: error: %s\n", bridge::utils::describe(e).c_str());
    return kExitBadInput;
  }
  return 0;
}
