// bridge-export: writes a Hugging Face directory (config.json + model.safetensors, or its shards and
// model.safetensors.index.json past --max-shard-size; AutoModelForCausalLM.from_pretrained loads either) from a bridge
// checkpoint saved in any parallel layout; the reverse of bridge-pretrain checkpoint.pretrained_checkpoint=hf:<dir>.
// The model_type follows the model's shape (gpt2, llama, qwen2, qwen3; --model-type mistral for a Mistral).
//
//   bridge-export --checkpoint ckpt --hf-dir hf-out              # the tracker's iteration
//   bridge-export --checkpoint ckpt --iteration 200 --hf-dir hf-out --model-type mistral
//   bridge-export --checkpoint ckpt --hf-dir hf-out --max-shard-size 2GB   # shards of at most 2 GB (default 5GB)
//
// Exit status: 0 written, 1 an unreadable or inconsistent checkpoint or a failed write, 2 bad command line.
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include "bridge/hf/auto_bridge.h"
#include "bridge/hf/shard_size.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "utils/exception_message.h"

namespace {

constexpr int kExitBadInput = 1;
constexpr int kExitBadCommandLine = 2;

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("bridge-export",
                           "Writes a Hugging Face directory (config.json + model.safetensors: GPT-2, Llama, Mistral, "
                           "Qwen2 or Qwen3) from a bridge checkpoint saved in any tensor/pipeline-parallel layout.");
  options.custom_help("--checkpoint DIR --hf-dir DIR [--iteration N] [--model-type TYPE] [--max-shard-size SIZE]");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint directory (what checkpoint.save names)", cxxopts::value<std::string>(), "DIR")
      ("iteration", "the iteration to export; default: the tracker's (latest_checkpointed_iteration.txt)",
       cxxopts::value<int64_t>(), "N")
      ("hf-dir", "the Hugging Face directory to write (created; config.json and model.safetensors are replaced)",
       cxxopts::value<std::string>(), "DIR")
      ("model-type", "the config.json model_type to write: gpt2, llama, mistral, qwen2 or qwen3; default: what the "
       "model's shape is (learned positions: gpt2; q/k norms: qwen3; QKV biases alone: qwen2; else llama)",
       cxxopts::value<std::string>(), "TYPE")
      ("max-shard-size", "the largest weight file, as transformers' max_shard_size: 5GB, 500MB, 2GiB or bytes; "
       "weights past it are written as shards model-0000K-of-0000N.safetensors with model.safetensors.index.json",
       cxxopts::value<std::string>()->default_value("5GB"), "SIZE")
      ("h,help", "print this help and exit");
  // clang-format on
  std::string checkpoint, hf_dir, model_type;
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
    if (args.count("model-type")) {
      model_type = args["model-type"].as<std::string>();
      if (model_type != "gpt2" && model_type != "llama" && model_type != "mistral" && model_type != "qwen2" &&
          model_type != "qwen3") {
        throw std::invalid_argument("--model-type must be gpt2, llama, mistral, qwen2 or qwen3, got '" + model_type +
                                    "'");
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
    bridge::hf::save_hf(hf_dir, saved.tensors, saved.config.model, type, max_shard_bytes);
    const bool sharded = std::filesystem::exists(std::filesystem::path(hf_dir) / "model.safetensors.index.json");
    std::printf("bridge-export: wrote %s (a %s model: config.json, %s) from %s\n", hf_dir.c_str(), type.c_str(),
                sharded ? "weight shards and model.safetensors.index.json" : "model.safetensors", saved.path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-export: error: %s\n", bridge::utils::describe(e).c_str());
    return kExitBadInput;
  }
  return 0;
}
