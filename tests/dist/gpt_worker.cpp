// One rank of the GPT pretraining tests. Launched by gpt_dist_test with the launcher variables torchrun would set.
//
//   gpt_worker parity <out_dir> <tp> <pp> <vpp|0> <steps> [fp32|bf16_mixed|fp16_mixed]
//       pretrain() a tiny GPT for <steps> steps and write, per rank, <out_dir>/rank<r>.txt with the losses (last
//       stage), and for every parameter this rank owns once (no tensor-parallel duplicate, no tied copy, data-parallel
//       rank 0) the gradient's squared norm, its dot product with the weight and the weight's squared norm, keyed
//       by the parameter's global name, at every step. Summed over ranks these equal the single-process run's. Also
//       checks the events' fields. A mixed-precision recipe trains the bf16/fp16 model; gradients are then its
//       fp32 main grads.
//   gpt_worker dropout [sp]
//       tp=2 training with dropout on: the replicated weights (norms, biases added after the all-reduce) stay
//       identical across the tensor-parallel group, which holds only if replicated activations draw the same masks
//       (with sp: only if the partial gradients of sequence parallelism are summed over the group).
//   gpt_worker bad_data
//       rank 0 trains on mock data, the last rank on a dataset prefix that does not exist: both exit 3 at once.
//   gpt_worker resume <out_dir> <tp> <pp> <vpp|0> <steps> <save_dir|-> <load_dir|-> [<block>[+switches]]
//       pretrain() the tiny GPT (vocabulary padded alike at tp 1, 2 and 4) for <steps> steps, saving to / loading
//       from the directories, and write <out_dir>/rank<r>.txt: the losses (last stage) and grad norms (rank 0) of
//       every step as exact hex floats, a CRC of every parameter slice and saved buffer (the MoE router's
//       expert_bias, with its dtype) this rank holds after on_train_end, and "end <step> <1 if on_train_end fired>".
//       After each save every rank reads the checkpoint back as bridge-export does (all files, through common.pt's
//       index or torch_dist's .metadata) and checks that it holds each of this rank's parameter slices and buffers with
//       their values: an expert-parallel rank whose experts were not saved fails. Besides apply_switches' switches,
//       +expert_bias: sigmoid routing with Megatron-Core's auxiliary-loss-free expert bias (a buffer moved every step),
//       and +etp2: expert_tensor_parallel_size 2 (at tp 1, each expert split over ranks that share the dense tp rank),
//       and +torch_dist: checkpoint.ckpt_format torch_dist (every rank writes its own DCP file; the default),
//       +ckpt_torch: Megatron's legacy files; +fully_reshardable: checkpoint.dist_ckpt_optim_fully_reshardable (the
//       distributed optimizer's state in model space). train.exit_signal_handler is on: once training has started,
//       each rank writes its process id to <out_dir>/pid<r>, and a SIGTERM to any rank saves and exits on every rank.
//   gpt_worker control <stop|abort|save> <requesting_rank> <step> <out_dir>
//       a callback on one rank asks to stop/abort/save during step <step>; every rank prints where it ended.
//   gpt_worker caught_failure <failing_rank> <tp> <pp> <step|callback>
//       the step function (or an on_train_step_end callback) throws on one rank in step 3, which catches the error and
//       sleeps 10 s; every rank prints how long it took to fail and exits 3.
//   gpt_worker hf <hf_dir> <ids> <out_dir> <tp> <pp> <vpp|0> [<ep> [<etp|0>]]
//       pretrain() one step from the Hugging Face model in <hf_dir> (checkpoint.pretrained_checkpoint=hf:<hf_dir>),
//       an MoE model's experts over <ep> ranks each split over <etp> (0: tp; sequence-parallel at tp > 1), saving to
//       <out_dir>/ckpt; the last rank writes the model's logits for the token ids of <ids> (a safetensors
//       file) as loaded (<out_dir>/start.safetensors) and after the step (<out_dir>/end.safetensors), and the
//       TextGenerator's greedy continuation of a byte-level prompt as loaded (<out_dir>/generated.safetensors).
//
// Exit 0 on success; a failed check prints "FAILED ..." and exits 1; an abort exits 3 after printing the error.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "bridge/bridge.h"
#include "bridge/hf/auto_bridge.h"
#include "parallel/dist_checkpointing/sharded_tensor.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/tensor_parallel/param_attributes.h"
#include "tests/dist/gpt_worker_support.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "training/inference.h"
#include "training/optimizer/distrib_optimizer.h"
#include "utils/crc32c.h"
#include "utils/safetensors.h"

namespace {

using namespace bridge;
using namespace bridge::training;

using testing::expect;

// "<block>[+full_recompute][+recompute_moe][+sp][+ep2][+etp1][+alltoall][+distopt][+overlap_param_gather][+bf16]
// [+scale2^k][+cp2][+all_gather|+a2a]": the block (gpt, llama or moe: the Llama block with MoE layers), then selective
// recomputation of the MoE layers and shared experts, expert parallelism 2 (+etp1: experts whole on each rank;
// +alltoall: that dispatcher), full recomputation of every layer (Megatron's uniform, 1 layer), sequence parallelism,
// the distributed optimizer and its parameter all-gather overlapped with the next forward, the bf16_mixed recipe,
// fp16's dynamic loss scale starting at 2^k with no hysteresis, context parallelism 2 (cp_comm_type p2p, or all_gather,
// or a2a).
void apply_switches(ConfigContainer& config, const std::string& block) {
  std::istringstream switches(block);
  std::string item;
  std::getline(switches, item, '+');
  if (item == "llama") testing::use_llama_block(config.model);
  if (item == "moe") testing::use_moe_block(config.model);
  while (std::getline(switches, item, '+')) {
    if (item == "full_recompute") {
      config.model.recompute_granularity = models::RecomputeGranularity::kFull;
      config.model.recompute_method = models::RecomputeMethod::kUniform;
      config.model.recompute_num_layers = 1;
    } else if (item == "sp") {
      config.model.sequence_parallel = true;
    } else if (item == "distopt") {
      config.optimizer.use_distributed_optimizer = config.ddp.use_distributed_optimizer = true;
    } else if (item == "overlap_param_gather") {
      config.ddp.overlap_param_gather = true;
    } else if (item == "recompute_moe") {
      config.model.recompute_granularity = models::RecomputeGranularity::kSelective;
      config.model.recompute_modules = std::vector<std::string>{"moe", "shared_experts"};
    } else if (item == "ep2") {
      config.parallelism.expert_model_parallel_size = 2;
    } else if (item == "etp1") {
      config.parallelism.expert_tensor_parallel_size = 1;
    } else if (item == "alltoall") {
      config.model.moe_token_dispatcher_type = models::MoETokenDispatcherType::kAlltoall;
    } else if (item == "cp2") {
      config.parallelism.context_parallel_size = 2;
    } else if (item == "all_gather") {
      config.model.cp_comm_type = parallel::context_parallel::CpCommType::kAllGather;
    } else if (item == "a2a") {
      config.model.cp_comm_type = parallel::context_parallel::CpCommType::kA2A;
    } else if (item == "bf16") {
      apply_mixed_precision_recipe(config.mixed_precision, "bf16_mixed");
    } else if (item.rfind("scale2^", 0) == 0) {  // fp16's dynamic scale from 2^k, halved at each overflow
      config.mixed_precision.initial_loss_scale = std::ldexp(1.0, std::stoi(item.substr(7)));
      config.mixed_precision.hysteresis = 1;
    } else {
      throw std::invalid_argument("unknown switch '+" + item + "' in '" + block + "'");
    }
  }
}

int run_parity(const std::string& out_dir, int tp, int pp, int vpp, int64_t steps, const std::string& precision,
               const std::string& block) {
  auto manager = std::make_shared<CallbackManager>();
  std::string lines;
  int64_t forwards = 0, backwards = 0;
  manager->register_callback(Event::kForwardStart, [&](CallbackContext& ctx) {
    expect(ctx.micro_batch.has_value() && ctx.model_chunk.has_value(), "forward_start has micro_batch and chunk");
    ++forwards;
  });
  manager->register_callback(Event::kBackwardEnd, [&](CallbackContext&) { ++backwards; });
  // The distributed optimizer's memory: each data-parallel rank steps its own shard, and the shards tile the model.
  manager->register_callback(Event::kOptimizerStepStart, [&](CallbackContext& ctx) {
    if (!ctx.state.cfg->optimizer.use_distributed_optimizer || ctx.state.train_state.step != 0) return;
    // With expert parallelism the ranks hold different experts, sharded over the expert-data-parallel group instead.
    if (ctx.state.cfg->parallelism.expert_model_parallel_size > 1) return;
    int64_t model = 0, shard = 0;
    for (const auto& chunk : ctx.model) {
      for (const torch::Tensor& param : chunk->parameters()) model += param.numel();
    }
    for (const auto& group : ctx.optimizer->param_groups()) {
      for (const torch::Tensor& param : group.params()) shard += param.numel();
    }
    // Context-parallel ranks hold the same weights as data-parallel ones: the shards are over dp x cp.
    parallel::ProcessGroup& shards = parallel::get_data_parallel_group(/*with_context_parallel=*/true);
    const int dp = shards.size();
    torch::Tensor total = torch::tensor({shard}, torch::kInt64);
    shards.all_reduce(total);
    expect(total.item<int64_t>() == model, "the data-parallel ranks' shards tile the model once: " +
                                               std::to_string(total.item<int64_t>()) + " of " + std::to_string(model));
    expect(shard * dp < model + model / 10,
           "a rank's shard is about 1/dp of the model: " + std::to_string(shard) + " of " + std::to_string(model));
  });
  manager->register_callback(Event::kOptimizerStepStart, [&](CallbackContext& ctx) {
    const int64_t step = ctx.state.train_state.step;
    expect(ctx.grad_norm.has_value(), "optimizer_step_start has grad_norm");
    if (parallel::get_rank() == 0) {
      char line[96];
      std::snprintf(line, sizeof(line), "gradnorm %lld %.12e\n", static_cast<long long>(step), *ctx.grad_norm);
      lines += line;
    }
    // The distributed optimizer clips only the elements each rank owns: every data-parallel rank records its pieces
    // (the reader sums the ranks' lines). Otherwise data-parallel rank 0 records whole gradients.
    const bool sharded = ctx.state.cfg->optimizer.use_distributed_optimizer;
    // Experts live on their expert-parallel rank: its expert-data-parallel rank 0 records them.
    // Context-parallel ranks hold the same reduced gradients as data-parallel replicas: one of dp x cp records.
    const bool dense_recorder = parallel::get_data_parallel_group(/*with_context_parallel=*/true).rank() == 0;
    const bool expert_recorder = parallel::get_expert_data_parallel_rank() == 0;
    if (!sharded && !dense_recorder && !expert_recorder) return;
    for (const auto& chunk : ctx.model) {
      auto* gpt = dynamic_cast<models::GPTModelImpl*>(chunk.get());
      expect(gpt != nullptr, "model chunks are GPTModelImpl");
      if (gpt == nullptr) return;
      for (const auto& [name, param] :
           models::global_named_parameters(models::GPTModel(std::static_pointer_cast<models::GPTModelImpl>(chunk)))) {
        if (parallel::tensor_parallel::param_is_tensor_parallel_duplicate(param)) continue;
        if (!parallel::tensor_parallel::param_is_not_shared(param)) continue;
        const bool expert = !parallel::tensor_parallel::get_param_attributes(param).allreduce;
        if (!sharded && !(expert ? expert_recorder : dense_recorder)) continue;
        double sq = 0, dot = 0, weight_sq = 0;
        const auto add = [&](const torch::Tensor& grad_part, const torch::Tensor& weight_part) {
          const torch::Tensor grad = grad_part.to(torch::kDouble), weight = weight_part.to(torch::kDouble);
          sq += grad.square().sum().item<double>();
          dot += (grad * weight).sum().item<double>();
          weight_sq += weight.square().sum().item<double>();
        };
        if (sharded) {
          for (const auto& piece : distributed_optimizer_pieces(param)) add(piece.main_param.grad(), piece.model_view);
        } else {
          // Megatron's main_grad: param.grad itself in fp32, the fp32 buffer view under bf16 with grad_reduce_in_fp32.
          add(parallel::distributed::main_grad(param), param.detach());
        }
        char line[256];
        std::snprintf(line, sizeof(line), "grad %lld %s %.12e %.12e %.12e\n", static_cast<long long>(step),
                      name.c_str(), sq, dot, weight_sq);
        lines += line;
      }
    }
  });
  manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    const bool last = parallel::is_pipeline_last_stage(/*ignore_virtual=*/true);
    expect(ctx.loss_dict.has_value(), "train_step_end has loss_dict");
    expect(ctx.loss_dict->empty() == !last, "loss_dict is empty exactly off the last stage");
    expect(ctx.skipped_iter.has_value(), "train_step_end has skipped_iter");
    expect(!*ctx.skipped_iter || ctx.state.cfg->mixed_precision.fp16, "only fp16 skips a step (an overflow)");
    if (last && parallel::get_tensor_model_parallel_rank() == 0 &&
        parallel::get_data_parallel_group(/*with_context_parallel=*/true).rank() == 0) {
      char line[96];
      std::snprintf(line, sizeof(line), "loss %lld %.12e\n", static_cast<long long>(ctx.state.train_state.step),
                    ctx.loss_dict->at("lm loss").item<double>());
      lines += line;
    }
  });
  ConfigContainer config = testing::tiny_gpt_config(tp, pp, vpp, steps);
  apply_mixed_precision_recipe(config.mixed_precision, precision);
  apply_switches(config, block);
  // Under overlap_param_gather a step's all-gathers are still in flight when its first forward starts (the step
  // before only started them), and on one stage that forward has waited for all of them by its end.
  int64_t in_flight_at_start = 0;
  if (config.ddp.overlap_param_gather) {
    manager->register_callback(Event::kForwardStart, [&](CallbackContext& ctx) {
      if (*ctx.micro_batch == 0 && parallel::distributed::param_gathers_in_flight() > 0) ++in_flight_at_start;
    });
    manager->register_callback(Event::kForwardEnd, [&](CallbackContext& ctx) {
      if (pp > 1 || *ctx.micro_batch != 0) return;
      expect(parallel::distributed::param_gathers_in_flight() == 0,
             "the forward waited for every parameter all-gather, " +
                 std::to_string(parallel::distributed::param_gathers_in_flight()) + " left");
    });
  }
  const TrainState final_state = pretrain(config, gpt_forward_step, manager);
  expect(final_state.step == steps, "trained all steps");
  if (config.ddp.overlap_param_gather) {
    expect(in_flight_at_start >= steps / 2, "a step's first forward found the all-gathers in flight in " +
                                                std::to_string(in_flight_at_start) + " of " + std::to_string(steps) +
                                                " steps");
  }
  const int64_t chunks = vpp > 0 ? vpp : 1;
  const int64_t micro_batches = config.num_microbatches(parallel::get_world_size());
  expect(forwards == steps * micro_batches * chunks,
         "forward_start fired once per micro-batch and chunk, got " + std::to_string(forwards));
  expect(backwards == forwards, "backward_end fired as often as forward_start");
  std::ofstream(out_dir + "/rank" + std::to_string(parallel::get_rank()) + ".txt") << lines;
  return 0;
}

int run_dropout(bool sequence_parallel) {
  ConfigContainer config = testing::tiny_gpt_config(/*tp=*/2, /*pp=*/1, /*vpp=*/0, /*steps=*/3);
  config.model.hidden_dropout = 0.2;
  config.model.attention_dropout = 0.2;
  config.model.sequence_parallel = sequence_parallel;
  auto manager = std::make_shared<CallbackManager>();
  int compared = 0;
  manager->register_callback(Event::kOptimizerStepEnd, [&](CallbackContext& ctx) {
    parallel::ProcessGroup& tp = parallel::get_tensor_model_parallel_group();
    for (const auto& [name, param] : models::global_named_parameters(
             models::GPTModel(std::static_pointer_cast<models::GPTModelImpl>(ctx.model[0])))) {
      if (parallel::tensor_parallel::get_param_attributes(param).tensor_model_parallel) continue;
      const std::vector<torch::Tensor> copies = tp.all_gather(param.detach().contiguous());
      expect(torch::equal(copies[0], copies[1]), name + " is identical on both tensor-parallel ranks");
      ++compared;
    }
  });
  float first_loss = 0;
  manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    if (ctx.state.train_state.step == 0) first_loss = ctx.loss_dict->at("lm loss").item<float>();
  });
  pretrain(config, gpt_forward_step, manager);
  expect(compared > 10, "compared the replicated parameters");
  expect(std::isfinite(first_loss) && first_loss > 0, "a finite loss");
  return 0;
}

int run_control(const std::string& action, int requesting_rank, int64_t at_step, const std::string& out_dir) {
  auto manager = std::make_shared<CallbackManager>();
  bool train_end = false;
  manager->register_callback(
      Event::kTrainStepEnd,
      [&](CallbackContext& ctx) {
        if (parallel::get_rank() != requesting_rank || ctx.state.train_state.step != at_step) return;
        if (action == "stop") ctx.request_stop("loss is good enough");
        if (action == "abort") ctx.request_abort("loss went NaN");
        if (action == "save") ctx.request_save("before the risky part");
      },
      "watchdog");
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext&) { train_end = true; });
  ConfigContainer config = testing::tiny_gpt_config(/*tp=*/1, /*pp=*/2, /*vpp=*/0, /*steps=*/6);
  config.model.num_layers = 2;
  if (action == "save") config.checkpoint.save = out_dir;
  try {
    const TrainState state = pretrain(config, gpt_forward_step, manager);
    std::printf("rank %d: ended at step %lld, on_train_end %s\n", parallel::get_rank(),
                static_cast<long long>(state.step), train_end ? "fired" : "not fired");
  } catch (const TrainingAborted& error) {
    std::printf("rank %d: aborted: %s\n", parallel::get_rank(), error.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}

// The built-in callbacks over a pipeline of 2 (the losses only on rank 1), from a recipe's `callbacks:` list as
// bridge-pretrain users write it: early stopping on the validation loss (a min_delta no loss beats, so the second
// evaluation stops), a divergence detector, a threshold no loss reaches, and the monitors, whose collectives must
// not hang; the progress bar from C++, into a file per rank. The metrics reach <out_dir>/metrics.jsonl (the last
// rank's writer). Prints the step every rank ended at.
int run_builtins(const std::string& out_dir) {
  ConfigContainer config = testing::tiny_gpt_config(/*tp=*/1, /*pp=*/2, /*vpp=*/0, /*steps=*/10);
  config.model.num_layers = 2;
  config.train.eval_interval = 2;
  config.train.eval_iters = 1;
  config.logging.jsonl_path = out_dir + "/metrics.jsonl";
  apply_override(config,
                 "callbacks=[{type: EarlyStopping, patience: 1, min_delta: 100}, {type: DivergenceDetector},"
                 " {type: SpeedMonitor, window_size: 3}, {type: LearningRateMonitor}, {type: MemoryMonitor},"
                 " {type: RuntimeEstimator}, {type: ThresholdStopper, monitor: lm loss, threshold: 0.001}]");
  const int rank = parallel::get_rank();
  std::FILE* bar_file = std::fopen((out_dir + "/bar_rank" + std::to_string(rank) + ".txt").c_str(), "w");
  ProgressBarOptions bar;
  bar.stream = bar_file;
  bar.terminal = false;
  bar.line_seconds = 0.0;
  const TrainState state = pretrain(config, gpt_forward_step, {std::make_shared<ProgressBar>(bar)});
  std::fclose(bar_file);
  std::printf("rank %d: ended at step %lld\n", rank, static_cast<long long>(state.step));
  std::fflush(stdout);
  return 0;
}

// A long run over pp=2 with a ControlEndpoint (on rank 1) whose URL goes to <out_dir>/endpoint.url: the test POSTs a
// stop to it and checks that every rank ended at the same step.
int run_endpoint(const std::string& out_dir) {
  ConfigContainer config = testing::tiny_gpt_config(/*tp=*/1, /*pp=*/2, /*vpp=*/0, /*steps=*/3000);
  config.model.num_layers = 2;
  apply_override(config, "callbacks=[{type: ControlEndpoint, endpoint_file: '" + out_dir + "/endpoint.url'}]");
  const TrainState state = pretrain(config, gpt_forward_step);
  std::printf("rank %d: ended at step %lld\n", parallel::get_rank(), static_cast<long long>(state.step));
  std::fflush(stdout);
  return 0;
}

// TextGenerator and Profiler from a recipe in layout (tp, pp, vpp): each rank writes the greedy continuation of the
// untrained model (generated at on_train_start, so every layout starts from the same weights) to
// <out_dir>/tokens_rank<r>.txt; the recipe's generator writes its texts at step 2 and the profiler one trace per rank.
int run_generate(const std::string& out_dir, int tp, int pp, int vpp, bool sequence_parallel) {
  ConfigContainer config = testing::tiny_gpt_config(tp, pp, vpp, /*steps=*/2);
  config.model.sequence_parallel = sequence_parallel;
  config.model.vocab_size = 257;       // the byte-level tokenizer's ids
  config.model.init_method_std = 0.5;  // decided preferences: no near-ties for rounding to flip between layouts
  config.logging.jsonl_path = out_dir + "/metrics.jsonl";
  apply_override(config,
                 "callbacks=[{type: TextGenerator, prompts: [Hello, a longer prompt], interval: 2, max_new_tokens: 5},"
                 " {type: Profiler, start_step: 1, num_steps: 1, output_dir: '" +
                     out_dir + "/profile'}]");
  TextGeneratorOptions options;
  options.prompts = {"Hello", "a longer prompt"};
  options.max_new_tokens = 8;
  options.stop_at_eod = false;
  TextGenerator generator(options);
  auto manager = std::make_shared<CallbackManager>();
  manager->register_callback(Event::kTrainStart, [&](CallbackContext& ctx) {
    std::string lines;
    for (const GeneratedText& text : generator.generate(ctx, 0)) {
      for (const int64_t token : text.tokens) lines += std::to_string(token) + " ";
      lines += "\n";
    }
    std::ofstream(out_dir + "/tokens_rank" + std::to_string(parallel::get_rank()) + ".txt") << lines;
  });
  pretrain(config, gpt_forward_step, manager);
  return 0;
}

// The MoE router's expert_bias: the one buffer a checkpoint saves.
bool is_saved_buffer(const std::string& name) {
  const std::string suffix = ".mlp.router.expert_bias";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// This rank's parameters and saved buffers (the MoE routers' expert_bias) under their global names.
std::vector<std::pair<std::string, torch::Tensor>> resume_tensors(const models::GPTModel& chunk) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors = models::global_named_parameters(chunk);
  for (const auto& item : chunk->named_buffers()) {
    const std::string& local = item.key();
    if (!is_saved_buffer(local)) continue;
    const std::size_t dot = local.find('.', 7);  // "layers.<i>.mlp.router.expert_bias"
    const int64_t layer = chunk->chunk_options().first_layer + std::stoll(local.substr(7, dot - 7));
    tensors.emplace_back("decoder.layers." + std::to_string(layer) + local.substr(dot), item.value());
  }
  return tensors;
}

// After a save: the checkpoint, read back whole as bridge-export reads it, holds every slice this rank has (an expert
// of each expert-parallel rank, the fp32 expert_bias) with this rank's values (a bf16 model's: its fp32 main values
// rounded to bf16). The tied embedding's copy on the last stage is not saved.
void check_saved(const CallbackContext& ctx) {
  const std::filesystem::path iteration = ctx.checkpoint->path;
  const SavedWeights saved = load_saved_weights(iteration.parent_path().string(), ctx.checkpoint->iteration);
  int checked = 0;
  for (const auto& chunk : ctx.model) {
    for (const auto& [name, tensor] :
         resume_tensors(models::GPTModel(std::static_pointer_cast<models::GPTModelImpl>(chunk)))) {
      if (!parallel::tensor_parallel::param_is_not_shared(tensor)) continue;
      auto found = saved.tensors.find(name);
      expect(found != saved.tensors.end(), "the checkpoint " + iteration.string() + " holds " + name);
      if (found == saved.tensors.end()) continue;
      const bool buffer = is_saved_buffer(name);
      namespace dc = parallel::dist_checkpointing;
      dc::ShardedTensorLayout whole;
      whole.global_shape = found->second.sizes().vec();
      const dc::ShardedTensorLayout mine = buffer ? whole : dc::sharded_tensor_layout(tensor);
      torch::Tensor slice = torch::zeros(tensor.sizes(), torch::kFloat32);
      dc::copy_overlap(slice, mine, found->second, whole);
      expect(torch::equal(slice.to(tensor.scalar_type()), tensor.detach().cpu()),
             "the checkpoint " + iteration.string() + " holds this rank's values of " + name);
      ++checked;
    }
  }
  expect(checked > 0, "checked this rank's tensors in the checkpoint");
}

int run_resume(const std::string& out_dir, int tp, int pp, int vpp, int64_t steps, const std::string& save,
               const std::string& load, std::string block) {
  auto manager = std::make_shared<CallbackManager>();
  std::string lines;
  auto add = [&](const char* kind, int64_t step, double value) {
    char line[96];
    std::snprintf(line, sizeof(line), "%s %lld %a\n", kind, static_cast<long long>(step), value);
    lines += line;
  };
  manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    const int64_t step = ctx.state.train_state.step;
    if (parallel::get_rank() == 0) add("gradnorm", step, *ctx.grad_norm);
    if (!ctx.loss_dict->empty() && parallel::get_tensor_model_parallel_rank() == 0 &&
        parallel::get_data_parallel_rank() == 0) {
      add("loss", step, ctx.loss_dict->at("lm loss").item<double>());
    }
  });
  manager->register_callback(Event::kTrainStart, [&](CallbackContext&) {
    const std::string pid_file = out_dir + "/pid" + std::to_string(parallel::get_rank());
    std::ofstream(pid_file + ".tmp") << ::getpid() << "\n";
    std::filesystem::rename(pid_file + ".tmp", pid_file);  // whole when it appears
  });
  manager->register_callback(Event::kCheckpointSave, check_saved);
  bool train_end = false;
  manager->register_callback(Event::kTrainEnd, [&](CallbackContext& ctx) {
    train_end = true;
    for (const auto& chunk : ctx.model) {
      for (const auto& [name, tensor] :
           resume_tensors(models::GPTModel(std::static_pointer_cast<models::GPTModelImpl>(chunk)))) {
        const torch::Tensor bytes = tensor.detach().contiguous();
        const auto crc = utils::crc32c(std::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()));
        if (is_saved_buffer(name)) {  // a buffer: the fp32 expert_bias, also under bf16
          lines += "buffer " + name + " " + c10::toString(tensor.scalar_type()) + " " + std::to_string(crc) + "\n";
          expect(tensor.scalar_type() == torch::kFloat32, name + " is fp32");
          continue;
        }
        lines += "param " + name + " " + std::to_string(parallel::get_tensor_model_parallel_rank()) + " " +
                 std::to_string(crc) + "\n";
      }
    }
  });
  ConfigContainer config = testing::tiny_gpt_config(tp, pp, vpp, steps);
  config.model.make_vocab_size_divisible_by = 32;  // 128 rows at tp 1, 2 and 4
  config.scheduler.lr_decay_iters = 8;             // the same schedule in a run stopped early and in the whole run
  if (save != "-") config.checkpoint.save = save;
  if (load != "-") config.checkpoint.load = load;
  config.train.exit_signal_handler = true;
  const std::string kExpertBias = "+expert_bias";
  if (const std::size_t at = block.find(kExpertBias); at != std::string::npos) {
    block.erase(at, kExpertBias.size());
    config.model.moe_router_score_function = models::MoERouterScoreFunction::kSigmoid;
    config.model.moe_router_enable_expert_bias = true;
    config.model.moe_router_bias_update_rate = 1e-2;  // a bias that moves visibly in a few steps
  }
  const std::string kEtp2 = "+etp2";  // experts split over 2 ranks whatever the tensor-parallel size
  if (const std::size_t at = block.find(kEtp2); at != std::string::npos) {
    block.erase(at, kEtp2.size());
    config.parallelism.expert_tensor_parallel_size = 2;
  }
  const std::string kFullyReshardable = "+fully_reshardable";  // the distributed optimizer's state in model space
  if (const std::size_t at = block.find(kFullyReshardable); at != std::string::npos) {
    block.erase(at, kFullyReshardable.size());
    config.checkpoint.dist_ckpt_optim_fully_reshardable = true;
  }
  const std::string kTorchDist = "+torch_dist";  // save in Megatron-Core's distributed checkpoint format (default)
  if (const std::size_t at = block.find(kTorchDist); at != std::string::npos) {
    block.erase(at, kTorchDist.size());
    config.checkpoint.ckpt_format = "torch_dist";
  }
  const std::string kCkptTorch = "+ckpt_torch";  // save in Megatron's legacy files, mp_rank_*/model_optim_rng.pt
  if (const std::size_t at = block.find(kCkptTorch); at != std::string::npos) {
    block.erase(at, kCkptTorch.size());
    config.checkpoint.ckpt_format = "torch";
  }
  apply_switches(config, block);
  const TrainState state = pretrain(config, gpt_forward_step, manager);
  lines += "end " + std::to_string(state.step) + " " + (train_end ? "1" : "0") + "\n";
  std::ofstream(out_dir + "/rank" + std::to_string(parallel::get_rank()) + ".txt") << lines;
  return 0;
}

}  // namespace

// Rank 0 trains on mock data, the last rank on a dataset prefix that does not exist: both must fail at once.
int run_bad_data() {
  ConfigContainer config = testing::tiny_gpt_config(1, 1, 0, 2);
  if (parallel::get_rank() == parallel::get_world_size() - 1) {
    config.dataset.data_path = {"/nonexistent/bridge_dataset"};
  }
  try {
    pretrain(config, gpt_forward_step);
  } catch (const std::exception& error) {
    std::printf("rank %d: failed: %s\n", parallel::get_rank(), error.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}

// A step function that throws on one rank during step `step` (the others are then inside a collective of that step),
// the way a bug or a failed read would: that rank catches it and carries on (sleeps); every other rank must fail
// within seconds, not at parallelism.timeout.
int run_caught_failure(int failing_rank, int tp, int pp, const std::string& where) {
  ConfigContainer config = testing::tiny_gpt_config(tp, pp, 0, 20);
  config.parallelism.timeout = std::chrono::minutes(2);
  const auto start = std::chrono::steady_clock::now();
  const int rank = parallel::get_rank();  // the groups are gone after a failure
  auto failing = [&](GlobalState& state, DataIterator& data, models::GPTModel& model) {
    if (where == "step" && rank == failing_rank && state.train_state.step == 2) {
      throw std::runtime_error("a bug in the step function");
    }
    return gpt_forward_step(data, model);
  };
  // After the step's own collectives: the other ranks then wait in the world group's (the step-boundary agreement).
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    if (where == "callback" && rank == failing_rank && ctx.state.train_state.step == 2) {
      throw std::runtime_error("a bug in the callback");
    }
  });
  try {
    pretrain(config, failing, callbacks);
  } catch (const std::exception& error) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: failed after %.1f s: %s\n", rank, seconds, error.what());
    std::fflush(stdout);
    if (rank == failing_rank) std::this_thread::sleep_for(std::chrono::seconds(10));
    return 3;
  }
  return 0;
}

// `ep`, `etp`: an MoE model's expert layout (etp 0: the tensor-parallel size).
int run_hf(const std::string& hf_dir, const std::string& ids_path, const std::string& out_dir, int tp, int pp, int vpp,
           int ep, int etp) {
  ConfigContainer config = testing::tiny_gpt_config(tp, pp, vpp, /*steps=*/1);
  config.model = hf::hf_model_config(hf_dir);
  config.parallelism.expert_model_parallel_size = ep;
  if (etp > 0) config.parallelism.expert_tensor_parallel_size = etp;
  // Megatron-Core runs an MoE model at tp > 1 only sequence-parallel.
  if (config.model.num_moe_experts && tp > 1) config.model.sequence_parallel = true;
  config.model.seq_length = 32;  // tests/tools/hf_models.py's token ids
  config.model.hidden_dropout = config.model.attention_dropout = 0.0;
  config.model.make_vocab_size_divisible_by = 64;  // 301 pads to 320 at tp1, 384 at tp2: the padding differs
  config.checkpoint.pretrained_checkpoint = "hf:" + hf_dir;
  config.checkpoint.save = out_dir + "/ckpt";
  const torch::Tensor ids = bridge::utils::read_safetensors(ids_path).tensors.at("ids");
  const auto write_logits = [ids, out_dir](const std::string& name) {
    return [ids, out_dir, name](CallbackContext& ctx) {
      std::vector<models::GPTModelImpl*> chunks;
      for (std::size_t i = 0; i < ctx.model.size(); ++i) chunks.push_back(&ctx.gpt(i));
      for (models::GPTModelImpl* chunk : chunks) chunk->eval();
      const torch::Tensor logits = forward_logits(chunks, ids, torch::kFloat);
      for (models::GPTModelImpl* chunk : chunks) chunk->train();
      // Every tensor-parallel rank of the last stage has them: the last rank writes.
      if (logits.defined() && parallel::get_rank() == parallel::get_world_size() - 1)
        bridge::utils::write_safetensors(out_dir + "/" + name + ".safetensors", {{"logits", logits}});
    };
  };
  // The TextGenerator's greedy continuation of a byte-level prompt, as loaded (every layout: the pipeline broadcast
  // and the tensor-parallel gather of the logits both take part).
  const std::string prompt = "Once upon a time";
  const auto write_generated = [prompt, out_dir](CallbackContext& ctx) {
    TextGeneratorOptions options;
    options.prompts = {prompt};
    options.max_new_tokens = 6;
    options.stop_at_eod = false;
    TextGenerator generator(options);
    generator.on_train_start(ctx);
    const std::vector<GeneratedText> texts = generator.generate(ctx, 0);
    if (parallel::get_rank() != parallel::get_world_size() - 1) return;
    std::vector<int64_t> prompt_ids(prompt.begin(), prompt.end());
    bridge::utils::write_safetensors(
        out_dir + "/generated.safetensors",
        {{"ids", torch::tensor(prompt_ids).unsqueeze(0)}, {"tokens", torch::tensor(texts.at(0).tokens)}});
  };
  auto callbacks = std::make_shared<CallbackManager>();
  callbacks->register_callback(Event::kTrainStart, write_logits("start"));
  callbacks->register_callback(Event::kTrainStart, write_generated);
  callbacks->register_callback(Event::kTrainEnd, write_logits("end"));
  pretrain(config, gpt_forward_step, callbacks);
  return 0;
}

int main(int argc, char** argv) {
  return bridge::testing::worker_main(
      argc, argv,
      "usage: gpt_worker parity <out_dir> <tp> <pp> <vpp|0> <steps> [precision] [gpt|llama]\n"
      "       gpt_worker dropout [sp]\n"
      "       gpt_worker resume <out_dir> <tp> <pp> <vpp|0> <steps> <save|-> <load|-> [<block>[+switches]]\n"
      "       gpt_worker bad_data\n"
      "       gpt_worker control <stop|abort|save> <rank> <step> <out_dir>\n"
      "       gpt_worker builtins <out_dir>\n"
      "       gpt_worker endpoint <out_dir>\n"
      "       gpt_worker generate <out_dir> <tp> <pp> <vpp|0> [sp]\n"
      "       gpt_worker hf <hf_dir> <ids> <out_dir> <tp> <pp> <vpp|0> [<ep> [<etp|0>]]\n",
      [&](const std::string& scenario) {
        if (scenario == "parity" && argc >= 7 && argc <= 9) {
          return run_parity(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), std::stoll(argv[6]),
                            argc >= 8 ? argv[7] : "fp32", argc == 9 ? argv[8] : "gpt");
        }
        if (scenario == "dropout" && argc == 2) return run_dropout(false);
        if (scenario == "dropout" && argc == 3 && std::string(argv[2]) == "sp") return run_dropout(true);
        if (scenario == "resume" && (argc == 9 || argc == 10)) {
          return run_resume(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), std::stoll(argv[6]),
                            argv[7], argv[8], argc == 10 ? argv[9] : "gpt");
        }
        if (scenario == "bad_data" && argc == 2) return run_bad_data();
        if (scenario == "caught_failure" && argc == 6) {
          return run_caught_failure(std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), argv[5]);
        }
        if (scenario == "builtins" && argc == 3) return run_builtins(argv[2]);
        if (scenario == "endpoint" && argc == 3) return run_endpoint(argv[2]);
        if (scenario == "generate" && (argc == 6 || (argc == 7 && std::string(argv[6]) == "sp"))) {
          return run_generate(argv[2], std::stoi(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]), argc == 7);
        }
        if (scenario == "hf" && argc >= 8 && argc <= 10) {
          return run_hf(argv[2], argv[3], argv[4], std::stoi(argv[5]), std::stoi(argv[6]), std::stoi(argv[7]),
                        argc >= 9 ? std::stoi(argv[8]) : 1, argc == 10 ? std::stoi(argv[9]) : 0);
        }
        if (scenario == "control" && argc == 6) {
          return run_control(argv[2], std::stoi(argv[3]), std::stoll(argv[4]), argv[5]);
        }
        return -1;
      });
}
