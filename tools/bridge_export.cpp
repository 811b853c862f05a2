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
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "bridge/hf/auto_bridge.h"
#include "bridge/hf/hf_artifacts.h"
#include "bridge/hf/shard_size.h"
#include "training/checkpointing/hf_run_artifacts.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "utils/exception_message.h"

namespace {

namespace fs = std::filesystem;

constexpr int kExitBadInput = 1;
constexpr int kExitBadCommandLine = 2;

void warn(const std::string& message) { std::fprintf(stderr, "bridge-export: warning: %s\n", message.c_str()); }
void note(const std::string& message) { std::printf("bridge-export: %s\n", message.c_str()); }

// A JSON file's object; an empty one when it is missing or not an object.
nlohmann::json read_object(const fs::path& file) {
  std::ifstream in(file);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() ? config : nlohmann::json::object();
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
      bridge::training::check_tokenizer_path(tokenizer, "--tokenizer");  // before the checkpoint is read
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
    const bridge::hf::HfArtifacts artifacts =
        bridge::training::hf_artifacts_of_run(saved.config, hf_source, tokenizer, warn, note);
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
  } catch (const bridge::training::TokenizerTooLarge& e) {
    std::fprintf(stderr, "bridge-export: error: %s\n", e.what());
    return kExitBadCommandLine;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-export: error: %s\n", bridge::utils::describe(e).c_str());
    return kExitBadInput;
  }
  return 0;
}
