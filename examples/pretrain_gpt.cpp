// Model-parallel GPT pretraining through pretrain(config, step_fn, callbacks), with lambdas registered per event.
// A byte-level GPT learns an embedded sonnet; the same binary runs alone, under torchrun or under mpirun, with any
// tensor/pipeline/data-parallel layout the world size allows.
//
//   pretrain_gpt                                              # one process
//   mpirun --allow-run-as-root -np 4 pretrain_gpt --tp 2 --pp 2
//   torchrun --no_python --nproc_per_node=2 -r 0:1,1:1 -t 0:1,1:1 pretrain_gpt --pp 2 --vpp 2
//
// Options: --tp N --pp N --vpp N --train-iters N --micro-batch N --global-batch N --layers N --hidden N --heads N
//          --seq N --lr X --eval-interval N --eval-iters N --threads N --save DIR --save-interval N
//          --stop-at-loss X --mock
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <string>

#include "bridge/bridge.h"
#include "examples/sonnet.h"
#include "parallel/device.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"

namespace {

using namespace bridge;
using namespace bridge::training;

ConfigContainer config_from(const cxxopts::ParseResult& args) {
  ConfigContainer config;
  config.model.num_layers = args["layers"].as<int64_t>();
  config.model.hidden_size = args["hidden"].as<int64_t>();
  config.model.num_attention_heads = args["heads"].as<int64_t>();
  config.model.seq_length = args["seq"].as<int64_t>();
  config.model.vocab_size = 256;  // bytes
  config.model.hidden_dropout = 0.0;
  config.model.attention_dropout = 0.0;
  config.train.micro_batch_size = args["micro-batch"].as<int64_t>();
  config.train.global_batch_size = args["global-batch"].as<int64_t>();
  config.train.train_iters = args["train-iters"].as<int64_t>();
  config.train.eval_interval = args["eval-interval"].as<int64_t>();
  config.train.eval_iters = args["eval-iters"].as<int64_t>();
  config.train.num_threads = args["threads"].as<int>();
  config.optimizer.lr = args["lr"].as<double>();
  config.optimizer.min_lr = config.optimizer.lr / 10;
  config.scheduler.lr_warmup_iters = config.train.train_iters / 20;
  config.logging.log_interval = std::max<int64_t>(1, config.train.train_iters / 10);
  config.parallelism.tensor_model_parallel_size = args["tp"].as<int>();
  config.parallelism.pipeline_model_parallel_size = args["pp"].as<int>();
  if (args.count("vpp")) config.parallelism.virtual_pipeline_model_parallel_size = args["vpp"].as<int>();
  if (args.count("save")) {
    config.checkpoint.save = args["save"].as<std::string>();
    config.checkpoint.save_interval = args["save-interval"].as<int64_t>();
  }
  if (!args.count("mock")) {
    config.dataset.provider = [](const ConfigContainer& c) {
      const std::string text(examples::kSonnet18);
      auto dataset =
          std::make_shared<TokenStreamDataset>(std::vector<int64_t>(text.begin(), text.end()), c.model.seq_length);
      return GPTDatasets{dataset, dataset, dataset};  // a toy: the model is meant to memorise the poem
    };
  }
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // callbacks print between the log lines
  cxxopts::Options options("pretrain_gpt", "Model-parallel GPT pretraining on an embedded sonnet");
  options.add_options()("tp", "tensor-parallel size", cxxopts::value<int>()->default_value("1"))(
      "pp", "pipeline-parallel size", cxxopts::value<int>()->default_value("1"))(
      "vpp", "model chunks per pipeline rank (interleaved 1F1B)", cxxopts::value<int>())(
      "train-iters", "training steps", cxxopts::value<int64_t>()->default_value("200"))(
      "micro-batch", "sequences per micro-batch", cxxopts::value<int64_t>()->default_value("4"))(
      "global-batch", "sequences per step over all replicas", cxxopts::value<int64_t>()->default_value("8"))(
      "layers", "transformer layers", cxxopts::value<int64_t>()->default_value("4"))(
      "hidden", "hidden size", cxxopts::value<int64_t>()->default_value("64"))(
      "heads", "attention heads", cxxopts::value<int64_t>()->default_value("4"))(
      "seq", "sequence length", cxxopts::value<int64_t>()->default_value("32"))(
      "lr", "peak learning rate", cxxopts::value<double>()->default_value("3e-3"))(
      "eval-interval", "evaluate every N steps", cxxopts::value<int64_t>()->default_value("50"))(
      "eval-iters", "steps per evaluation", cxxopts::value<int64_t>()->default_value("2"))(
      "threads", "intra-op threads per rank (0: cores / local ranks)", cxxopts::value<int>()->default_value("0"))(
      "save", "checkpoint directory", cxxopts::value<std::string>())("save-interval", "save every N steps",
                                                                     cxxopts::value<int64_t>()->default_value("0"))(
      "stop-at-loss", "stop once the training loss falls below this", cxxopts::value<double>())(
      "mock", "train on random tokens instead of the sonnet")("h,help", "print this help");
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", options.help().c_str());
      return 0;
    }
    const ConfigContainer config = config_from(args);
    // The device is bound before the world starts, as pretrain() does when it starts the world itself.
    const parallel::LaunchEnv env = parallel::detect_launch_env();
    parallel::DistributedOptions distributed;
    distributed.device = parallel::select_device(config.parallelism.device, env).device;
    parallel::bind_device(distributed.device);
    distributed.backend =
        parallel::select_backend(config.parallelism.backend, distributed.device, parallel::cuda_built());
    distributed.timeout = config.parallelism.timeout;
    parallel::init_distributed(env, distributed);

    auto callbacks = std::make_shared<CallbackManager>();
    std::chrono::steady_clock::time_point start;
    callbacks->register_callback(
        Event::kTrainStart,
        [&](CallbackContext& ctx) {
          start = std::chrono::steady_clock::now();
          std::printf("training %zu model chunk(s) per rank: tp=%d pp=%d dp=%d, %lld steps\n", ctx.model.size(),
                      parallel::get_tensor_model_parallel_world_size(),
                      parallel::get_pipeline_model_parallel_world_size(), parallel::get_data_parallel_world_size(),
                      static_cast<long long>(config.train.train_iters));
        },
        "announce", RankFilter::kFirst);
    if (args.count("stop-at-loss")) {
      // Only the last rank sees the loss; its stop request reaches every rank at the same step.
      const double threshold = args["stop-at-loss"].as<double>();
      callbacks->register_callback(
          Event::kTrainStepEnd,
          [threshold](CallbackContext& ctx) {
            if (ctx.loss_dict->empty()) return;
            const double loss = ctx.loss_dict->at("lm loss").item<double>();
            if (loss < threshold) ctx.request_stop("training loss " + std::to_string(loss) + " < threshold");
          },
          "stop_at_loss", RankFilter::kLast);
    }
    callbacks->register_callback(
        Event::kCheckpointSave,
        [](CallbackContext& ctx) { std::printf("checkpoint saved: %s\n", ctx.checkpoint->path.c_str()); },
        "report_save", RankFilter::kFirst);
    callbacks->register_callback(
        Event::kTrainEnd,
        [&](CallbackContext& ctx) {
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          const double tokens = static_cast<double>(ctx.state.train_state.consumed_train_samples) *
                                static_cast<double>(config.model.seq_length);
          std::printf("trained %lld steps in %.2f s: %.0f tokens/s\n",
                      static_cast<long long>(ctx.state.train_state.step), seconds, tokens / seconds);
        },
        "throughput", RankFilter::kFirst);

    const TrainState final_state = pretrain(config, gpt_forward_step, callbacks);
    std::printf("rank %d: pretrain_gpt: ok after %lld steps\n", parallel::get_rank(),
                static_cast<long long>(final_state.step));
    std::fflush(stdout);
    parallel::destroy_distributed();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pretrain_gpt: %s\n", error.what());
    return 1;
  }
}
