// Checkpoints in one process: N steps straight equal N/2, save, resume, N/2 bit for bit (dropout on, an RNG-drawing
// on_data_init_start, stateful callbacks and user_state), the files opened by Python's torch.load(weights_only=True),
// the guard against overwriting newer checkpoints (checkpoints of another model: checkpoint_mismatch_test.cpp),
// weights-only loads and most_recent_k; a RoPE model resumed at twice the seq_length (the schedule, the consumed
// samples and the first batch go on as in Megatron); asynchronous saves, and the exits of train.exit_interval,
// exit_signal_handler and exit_duration_in_mins; an MoE model's router expert_bias (fp32 under bf16) and a checkpoint
// that lacks an expert or holds a foreign one (expert-parallel layouts: checkpoint_dist_test); torch_dist checkpoints
// with damaged bytes or without their .metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bridge/bridge.h"
#include "bridge/models/qkv_layout.h"
#include "training/checkpointing/checkpoint_strategy.h"
#include "training/checkpointing/checkpointing.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "utils/durable_file.h"
#include "utils/torch_pickle.h"
#include "utils/zip_archive.h"

namespace bridge::training {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

ConfigContainer tiny_config(int64_t steps) {
  ConfigContainer config;
  config.model.num_layers = 2;
  config.model.hidden_size = 16;
  config.model.num_attention_heads = 2;
  config.model.vocab_size = 64;
  config.model.seq_length = 8;
  config.model.hidden_dropout = 0.1;  // the RNG streams must resume too
  config.model.attention_dropout = 0.1;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 4;
  config.train.train_iters = steps;
  config.train.num_threads = 1;
  config.scheduler.lr_warmup_iters = 2;
  config.scheduler.lr_decay_iters = 6;  // one schedule for the whole job, also in a run stopped half-way
  return config;
}

fs::path fresh_directory(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / ("bridge_checkpoint_test_" + name);
  fs::remove_all(path);
  return path;
}

// A stateful callback: counts the steps it saw over every run of a resumed job.
class StepCounter : public Callback {
 public:
  explicit StepCounter(std::string key = "StepCounter") : key_(std::move(key)) {}
  int64_t steps = 0;
  std::vector<double> losses;
  void on_train_step_end(CallbackContext& ctx) override {
    ++steps;
    losses.push_back(ctx.loss_dict->at("lm loss").item<double>());
  }
  std::string state_key() const override { return key_; }
  StateDict state_dict() const override { return {{"steps", steps}, {"losses", c10::List<double>(losses)}}; }
  void load_state_dict(const StateDict& state) override {
    steps = state.at("steps").toInt();
    losses = state.at("losses").toDoubleVector();
  }

 private:
  std::string key_;
};

struct Recorded {
  std::vector<double> losses, grad_norms;
  std::map<std::string, torch::Tensor> final_params;
  std::vector<CheckpointInfo> loads;
  std::vector<int64_t> saves;  // on_checkpoint_save's iterations
  bool saves_complete =
      true;  // every save was complete (its format's last file, tracker) when on_checkpoint_save fired
  std::shared_ptr<StepCounter> counter = std::make_shared<StepCounter>();
  std::shared_ptr<CallbackManager> manager = std::make_shared<CallbackManager>();
  TrainState state;
};

std::map<std::string, torch::Tensor> parameters_of(CallbackContext& ctx) {
  std::map<std::string, torch::Tensor> params;
  for (const auto& chunk : ctx.model) {
    for (const auto& [name, param] :
         models::global_named_parameters(models::GPTModel(std::static_pointer_cast<models::GPTModelImpl>(chunk)))) {
      params[name] = param.detach().clone();
    }
  }
  return params;
}

// Trains `config`, recording every step's loss and grad norm and the final parameters. on_data_init_start draws
// from the default generator, as a warm-up on mock data would: a resumed run must not feel it. `more` registers
// further callbacks.
Recorded train(const ConfigContainer& config, const std::function<void(CallbackManager&)>& more = {}) {
  Recorded run;
  if (more) more(*run.manager);
  run.manager->add(run.counter);
  run.manager->register_callback(Event::kDataInitStart, [](CallbackContext&) { (void)torch::rand({64}); });
  run.manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
    run.losses.push_back(ctx.loss_dict->at("lm loss").item<double>());
    run.grad_norms.push_back(*ctx.grad_norm);
    UserState& state = ctx.user_state;
    ++state.get_or_insert<int64_t>("steps_seen", 0);
    state.get_or_insert<std::vector<double>>("grad_norms", {}).push_back(*ctx.grad_norm);
    state.set("last_loss_tensor", ctx.loss_dict->at("lm loss").clone());
    state.set("run_name", std::string("tiny"));
    state.set("started", std::chrono::steady_clock::now());  // not serialisable: warned about, not saved
  });
  run.manager->register_callback(Event::kTrainEnd,
                                 [&](CallbackContext& ctx) { run.final_params = parameters_of(ctx); });
  run.manager->register_callback(Event::kCheckpointLoad,
                                 [&](CallbackContext& ctx) { run.loads.push_back(*ctx.checkpoint); });
  run.manager->register_callback(Event::kCheckpointSave, [&](CallbackContext& ctx) {
    run.saves.push_back(ctx.checkpoint->iteration);
    const fs::path root = fs::path(ctx.checkpoint->path).parent_path();
    run.saves_complete = run.saves_complete && complete_checkpoint(ctx.checkpoint->path) &&
                         read_latest_checkpointed_iteration(root.string()) == ctx.checkpoint->iteration;
  });
  run.state = pretrain(config, gpt_forward_step, run.manager);
  return run;
}

void expect_same_parameters(const std::map<std::string, torch::Tensor>& a,
                            const std::map<std::string, torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a) {
    ASSERT_EQ(b.count(name), 1U) << name;
    EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name << " differs";
  }
}

TEST(Checkpoint, ResumeIsBitExact) {
  const fs::path straight_dir = fresh_directory("straight");
  const fs::path split_dir = fresh_directory("split");
  ConfigContainer config = tiny_config(6);
  config.checkpoint.save = straight_dir.string();
  config.checkpoint.save_interval = 3;
  const Recorded straight = train(config);
  ASSERT_EQ(straight.losses.size(), 6U);

  config.checkpoint.save = split_dir.string();
  config.train.train_iters = 3;
  const Recorded first = train(config);
  config.train.train_iters = 6;
  const Recorded second = train(config);  // checkpoint.auto_resume: resumes from checkpoint.save

  ASSERT_EQ(second.loads.size(), 1U);
  EXPECT_EQ(second.loads[0].iteration, 3);
  EXPECT_EQ(second.loads[0].path, (split_dir / "iter_0000003").string());
  ASSERT_EQ(second.losses.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i;
    EXPECT_EQ(second.losses[i], straight.losses[i + 3]) << "step " << i + 3;
    EXPECT_EQ(second.grad_norms[i], straight.grad_norms[i + 3]) << "step " << i + 3;
  }
  expect_same_parameters(second.final_params, straight.final_params);
  EXPECT_EQ(second.state.step, 6);
  EXPECT_EQ(second.state.consumed_train_samples, straight.state.consumed_train_samples);

  // Callback state and user_state came back: the counter saw all six steps, user_state holds the whole history.
  EXPECT_EQ(second.counter->steps, 6);
  EXPECT_EQ(second.counter->losses, straight.losses);
  UserState& state = second.manager->user_state();
  EXPECT_EQ(state.get<int64_t>("steps_seen"), 6);
  EXPECT_EQ(state.get<std::vector<double>>("grad_norms"), straight.grad_norms);
  EXPECT_EQ(state.get<std::string>("run_name"), "tiny");
  EXPECT_TRUE(
      torch::equal(state.get<torch::Tensor>("last_loss_tensor"), torch::tensor(straight.losses.back(), torch::kFloat)));
}

// Python's torch.load, not a port of it: the tests' venv (torch 2.x) and Debian's python3-torch (1.13).
const std::vector<std::string> kTorchPythons = {BRIDGE_TOOLS_PYTHON, BRIDGE_DEBIAN_TORCH_PYTHON};

nlohmann::json read_with_torch(const std::string& python, const fs::path& file) {
  if (!fs::exists(python)) {
    ADD_FAILURE() << python << " does not exist; run scripts/install_deps.sh, which installs both Pythons' torch";
    return {};
  }
  const std::string command = "'" + python + "' '" + BRIDGE_READ_CHECKPOINT + "' '" + file.string() + "' 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ADD_FAILURE() << command << " failed:\n" << output;
    return {};
  }
  return nlohmann::json::parse(output);
}

TEST(Checkpoint, PythonTorchLoadOpensTheFiles) {
  const fs::path dir = fresh_directory("python");
  ConfigContainer config = tiny_config(2);
  config.checkpoint.save = dir.string();
  config.checkpoint.ckpt_format = "torch";  // Megatron's legacy files (torch_dist's: TorchDistCheckpoint)
  const Recorded run = train(config);
  for (const std::string& python : kTorchPythons) {
    SCOPED_TRACE(python);
    const nlohmann::json summary = read_with_torch(python, dir / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt");
    ASSERT_FALSE(summary.is_null());
    for (const char* key : {"model", "optimizer", "opt_param_scheduler", "rng_state", "iteration", "checkpoint_version",
                            "config", "shard_metadata", "callbacks", "user_state"}) {
      EXPECT_THAT(summary["keys"].get<std::vector<std::string>>(), ::testing::Contains(std::string(key)));
    }
    EXPECT_EQ(summary["iteration"], 2);
    EXPECT_TRUE(summary["config_has_model_section"].get<bool>());
    const auto& model = summary["model"];
    ASSERT_EQ(model.size(), run.final_params.size());
    for (const auto& [name, tensor] : run.final_params) {
      ASSERT_TRUE(model.contains(name)) << name;
      EXPECT_EQ(model[name]["shape"].get<std::vector<int64_t>>(), tensor.sizes().vec()) << name;
      EXPECT_NEAR(model[name]["sum"].get<double>(), tensor.to(torch::kDouble).sum().item<double>(), 1e-9) << name;
    }
    EXPECT_TRUE(model.contains("decoder.layers.0.self_attention.linear_qkv.weight"));
    EXPECT_TRUE(model.contains("embedding.word_embeddings.weight"));
    EXPECT_EQ(summary["optimizer_state"].size(), run.final_params.size());
    // Floats (stored as 0-dim float64 tensors, which torch 1.13's weights-only loader can read) keep every bit.
    EXPECT_EQ(summary["opt_param_scheduler"]["max_lr"].get<double>(), config.optimizer.lr);
    EXPECT_EQ(summary["callbacks"]["StepCounter"]["steps"], 2);
    EXPECT_EQ(summary["callbacks"]["StepCounter"]["losses"].get<std::vector<double>>(), run.losses);
    const nlohmann::json common = read_with_torch(python, dir / "iter_0000002" / "common.pt");
    ASSERT_FALSE(common.is_null());
    EXPECT_EQ(common["iteration"], 2);
    EXPECT_EQ(common["tensors"].size(), run.final_params.size());  // the index of every global tensor
  }
}

TEST(Checkpoint, RefusesToOverwriteNewerCheckpoints) {
  const fs::path dir = fresh_directory("guard");
  ConfigContainer config = tiny_config(3);
  config.checkpoint.save = dir.string();
  train(config);
  config.checkpoint.auto_resume = false;
  try {
    pretrain(config, gpt_forward_step);
    FAIL() << "a run into a directory holding iteration 3 that loads nothing must stop";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("already holds iteration 3"));
    EXPECT_THAT(error.what(), HasSubstr("starts at iteration 0"));
    EXPECT_THAT(error.what(), HasSubstr("checkpoint.auto_resume=true"));
  }
  EXPECT_EQ(read_latest_checkpointed_iteration(dir.string()), 3);
  EXPECT_TRUE(fs::exists(dir / "iter_0000003" / "metadata.json"));
}

TEST(Checkpoint, PretrainedCheckpointLoadsWeightsOnly) {
  const fs::path saved = fresh_directory("pretrained");
  ConfigContainer config = tiny_config(3);
  config.checkpoint.save = saved.string();
  const Recorded source = train(config);

  ConfigContainer finetune = tiny_config(2);
  finetune.checkpoint.pretrained_checkpoint = saved.string();
  auto manager = std::make_shared<CallbackManager>();
  std::map<std::string, torch::Tensor> initial;
  int64_t first_step = -1;
  manager->register_callback(Event::kTrainStart, [&](CallbackContext& ctx) {
    initial = parameters_of(ctx);
    first_step = ctx.state.train_state.step;
  });
  const TrainState state = pretrain(finetune, gpt_forward_step, manager);
  expect_same_parameters(initial, source.final_params);
  EXPECT_EQ(first_step, 0);
  EXPECT_EQ(state.step, 2);
}

TEST(Checkpoint, MostRecentKKeepsTheNewest) {
  const fs::path dir = fresh_directory("most_recent_k");
  ConfigContainer config = tiny_config(5);
  config.checkpoint.save = dir.string();
  config.checkpoint.save_interval = 1;
  config.checkpoint.most_recent_k = 2;
  train(config);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  // latest_train_state.pt: Megatron-Bridge's copy of the newest train_state.pt (torch_dist).
  EXPECT_EQ(left, (std::vector<std::string>{"iter_0000004", "iter_0000005", "latest_checkpointed_iteration.txt",
                                            "latest_train_state.pt"}));
}

// Megatron's iter_%07d: eight digits and more past 10^7 iterations, which keep-N and auto-resume must still see.
TEST(Checkpoint, IterationDirectoryNamesRoundTripPastTenMillion) {
  for (const int64_t iteration : {0L, 7L, 9999999L, 10000000L, 123456789L}) {
    EXPECT_EQ(iteration_of_directory_name(checkpoint_directory_name(iteration)), iteration);
  }
  for (const char* other : {"iter_000007", "iter_00000x7", "iter_-000007", "iteration", "iter_0000007.tmp", "hf"}) {
    EXPECT_EQ(iteration_of_directory_name(other), std::nullopt) << other;
  }
}

TEST(Checkpoint, TwoStatefulCallbacksWithOneKeyAreAnError) {
  CallbackManager manager;
  manager.add(std::make_shared<StepCounter>("counter"));
  try {
    manager.add(std::make_shared<StepCounter>("counter"));
    FAIL() << "a second stateful callback under the same key must be refused";
  } catch (const std::invalid_argument& error) {
    EXPECT_THAT(error.what(), HasSubstr("'counter'"));
    EXPECT_THAT(error.what(), HasSubstr("StepCounter"));
  }
  auto shared = std::make_shared<StepCounter>("other");
  manager.add(shared);
  EXPECT_NO_THROW(manager.add(shared));  // the same object twice is one state
  EXPECT_EQ(manager.stateful_callbacks().size(), 2U);
}

// A checkpoint of bridge's older fused-QKV layout ([Q; K; V] rows, no qkv_layout entry) loads converted into
// Megatron-Core's grouped layout: the file is rewritten into the old layout (the model's and Adam's QKV tensors), and
// resuming from it continues bit for bit as from the original.
TEST(Checkpoint, OlderQkvLayoutLoadsConverted) {
  const fs::path dir = fresh_directory("older_qkv");
  ConfigContainer config = tiny_config(2);
  config.checkpoint.save = dir.string();
  config.checkpoint.ckpt_format = "torch";  // the older layout lived in Megatron's legacy files
  train(config);
  const fs::path converted = fresh_directory("older_qkv_converted");
  fs::copy(dir, converted, fs::copy_options::recursive);
  const fs::path rank_file = converted / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt";
  c10::impl::GenericDict file = bridge::utils::load_torch_pickle(rank_file).toGenericDict();
  ASSERT_EQ(file.at("qkv_layout").toStringRef(), "megatron_core");
  ASSERT_EQ(file.erase("qkv_layout"), 1u);
  const auto to_old = [&](const torch::Tensor& grouped) {
    const auto [q, k, v] = models::split_qkv(grouped, config.model);
    return torch::cat({q, k, v}, 0);
  };
  int converted_tensors = 0;
  c10::impl::GenericDict model = file.at("model").toGenericDict();
  c10::impl::GenericDict state =
      file.at("optimizer").toGenericDict().at("optimizer").toGenericDict().at("state").toGenericDict();
  for (const auto& item : model) {
    const std::string name = item.key().toStringRef();
    if (name.find("linear_qkv") == std::string::npos) continue;
    const torch::Tensor old = to_old(item.value().toTensor());
    EXPECT_FALSE(old.equal(item.value().toTensor())) << name;  // two heads: the layouts differ
    model.insert_or_assign(name, old);
    c10::impl::GenericDict moments = state.at(name).toGenericDict();
    for (const char* key : {"exp_avg", "exp_avg_sq"}) moments.insert_or_assign(key, to_old(moments.at(key).toTensor()));
    ++converted_tensors;
  }
  EXPECT_EQ(converted_tensors, 4);  // two layers' weights and biases
  bridge::utils::save_torch_pickle(rank_file, file);

  config.train.train_iters = 4;
  const Recorded original = [&] {
    ConfigContainer resumed = config;
    resumed.checkpoint.load = dir.string();
    resumed.checkpoint.save = "";
    return train(resumed);
  }();
  ConfigContainer from_old = config;
  from_old.checkpoint.load = converted.string();
  from_old.checkpoint.save = "";
  const Recorded upgraded = train(from_old);
  ASSERT_EQ(upgraded.losses.size(), 2U);
  EXPECT_EQ(upgraded.losses, original.losses);
  EXPECT_EQ(upgraded.grad_norms, original.grad_norms);
  for (const auto& [name, param] : original.final_params) {
    EXPECT_TRUE(param.equal(upgraded.final_params.at(name))) << name;
  }
  fs::remove_all(dir);
  fs::remove_all(converted);
}

// checkpoint.async_save: the files are written on a thread while training goes on, each save is finalised in order
// (common.pt, the tracker, then on_checkpoint_save), and resuming from them is bit-exact too.
TEST(Checkpoint, AsyncSaveResumesBitExact) {
  const Recorded straight = train(tiny_config(6));
  const fs::path dir = fresh_directory("async");
  ConfigContainer config = tiny_config(3);
  config.checkpoint.save = dir.string();
  config.checkpoint.save_interval = 1;
  config.checkpoint.async_save = true;
  const Recorded first = train(config);
  EXPECT_EQ(first.saves, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(first.saves_complete);
  EXPECT_EQ(read_latest_checkpointed_iteration(dir.string()), 3);

  config.train.train_iters = 6;
  const Recorded second = train(config);
  ASSERT_EQ(second.losses.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i;
    EXPECT_EQ(second.losses[i], straight.losses[i + 3]) << "step " << i + 3;
  }
  expect_same_parameters(second.final_params, straight.final_params);
  EXPECT_EQ(second.saves, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_TRUE(second.saves_complete);
}

// An agreed abort first completes the asynchronous save still in flight: the tracker names the step it came after.
TEST(Checkpoint, AbortCompletesAPendingAsyncSave) {
  ConfigContainer config = tiny_config(6);
  config.checkpoint.save = fresh_directory("async_abort").string();
  config.checkpoint.save_interval = 1;
  config.checkpoint.async_save = true;
  EXPECT_THROW(train(config,
                     [](CallbackManager& manager) {
                       manager.register_callback(Event::kTrainStepEnd, [](CallbackContext& ctx) {
                         if (ctx.state.train_state.step == 2) ctx.request_abort("enough");  // during step 3
                       });
                     }),
               TrainingAborted);
  EXPECT_EQ(read_latest_checkpointed_iteration(config.checkpoint.save), 3);
}

// train.exit_interval: each run saves and leaves after a multiple of 2 without on_train_end (Megatron-Bridge's exit);
// three runs into one directory make the five steps of a straight run bit for bit.
TEST(Checkpoint, ExitIntervalSavesLeavesAndResumes) {
  const Recorded straight = train(tiny_config(5));
  ConfigContainer config = tiny_config(5);
  config.checkpoint.save = fresh_directory("exit_interval").string();
  config.train.exit_interval = 2;
  std::vector<double> losses;
  for (const int64_t exit_step : {2, 4}) {
    const Recorded run = train(config);
    EXPECT_EQ(run.state.step, exit_step);
    EXPECT_EQ(run.saves, std::vector<int64_t>{exit_step});
    EXPECT_TRUE(run.final_params.empty()) << "on_train_end fired on an exit";
    losses.insert(losses.end(), run.losses.begin(), run.losses.end());
  }
  const Recorded last = train(config);
  EXPECT_EQ(last.state.step, 5);
  losses.insert(losses.end(), last.losses.begin(), last.losses.end());
  EXPECT_EQ(losses, straight.losses);
  expect_same_parameters(last.final_params, straight.final_params);
}

// A long-context phase (Llama 3 went on from 8k to 128k tokens): a RoPE model saved at seq_length 8 goes on at 16.
// As in Megatron-LM, whose check_checkpoint_args leaves seq_length out: each step's learning rate is the
// uninterrupted schedule's (it counts samples, not tokens), consumed_train_samples continues, and the data is built
// again at the new length with the sampler at the consumed samples, so the first step reads samples 12..15 (3 steps x
// 4) of the mock data at 16 tokens; the model trains on.
TEST(Checkpoint, ResumeAtALongerSeqLengthContinuesTheScheduleAndTheSamples) {
  ConfigContainer config = tiny_config(6);
  config.model.position_embedding_type = models::PositionEmbeddingType::kRope;
  config.scheduler.lr_decay_style = "cosine";
  // What a step sees: the learning rate it steps with and the samples consumed before it, the tokens of each
  // micro-batch, then its loss.
  struct Seen {
    std::vector<double> lrs, losses;
    std::vector<int64_t> consumed;
    std::vector<torch::Tensor> tokens;
  };
  const auto run = [](const ConfigContainer& c) {
    Seen seen;
    auto manager = std::make_shared<CallbackManager>();
    manager->register_callback(Event::kTrainStepStart, [&](CallbackContext& ctx) {
      seen.lrs.push_back(ctx.optimizer->param_groups().front().options().get_lr());
      seen.consumed.push_back(ctx.state.train_state.consumed_train_samples);
    });
    manager->register_callback(Event::kTrainStepEnd, [&](CallbackContext& ctx) {
      seen.losses.push_back(ctx.loss_dict->at("lm loss").item<double>());
    });
    pretrain(
        c,
        [&](DataIterator& data, models::GPTModel& model) {
          GPTBatch batch = data.next();
          seen.tokens.push_back(batch.tokens.clone());
          return StepResult{model->forward(batch.tokens, batch.position_ids, batch.labels, batch.attention_mask),
                            masked_token_loss(batch.loss_mask)};
        },
        manager);
    return seen;
  };
  const Seen straight = run(config);
  ASSERT_EQ(straight.lrs.size(), 6U);

  config.checkpoint.save = fresh_directory("longer_seq_length").string();
  config.train.exit_interval = 3;
  const Seen first = run(config);  // saves iteration 3 and leaves
  ASSERT_EQ(first.lrs.size(), 3U);
  config.model.seq_length = 16;  // auto-resume from checkpoint.save, at twice the length
  const Seen resumed = run(config);
  ASSERT_EQ(resumed.lrs.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(resumed.lrs[i], straight.lrs[3 + i]) << "step " << 4 + i;
  EXPECT_EQ(resumed.consumed, (std::vector<int64_t>{12, 16, 20}));
  EXPECT_EQ(resumed.consumed, std::vector<int64_t>(straight.consumed.begin() + 3, straight.consumed.end()));
  const MockGPTDataset data(config.model.vocab_size, 16, config.rng.seed);
  ASSERT_GE(resumed.tokens.size(), 2U);
  for (int64_t m = 0; m < 2; ++m) {  // the first step's two micro-batches of 2
    const torch::Tensor expected =
        torch::stack({data.sample(12 + 2 * m).slice(0, 0, 16), data.sample(13 + 2 * m).slice(0, 0, 16)});
    EXPECT_TRUE(torch::equal(resumed.tokens[static_cast<std::size_t>(m)], expected)) << "micro-batch " << m;
  }
  for (const double loss : resumed.losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
  fs::remove_all(config.checkpoint.save);
}

// train.exit_signal_handler: a SIGTERM during step 2 (here raised by a callback) saves step 2 and leaves; without a
// checkpoint directory, train.exit_duration_in_mins = 0 leaves after the first step.
TEST(Checkpoint, SignalAndTimeLimitExitAfterTheStep) {
  ConfigContainer config = tiny_config(6);
  config.checkpoint.save = fresh_directory("signal").string();
  config.train.exit_signal_handler = true;
  const Recorded signalled = train(config, [](CallbackManager& manager) {
    manager.register_callback(Event::kTrainStepStart, [](CallbackContext& ctx) {
      if (ctx.state.train_state.step == 1) std::raise(SIGTERM);
    });
  });
  EXPECT_EQ(signalled.state.step, 2);
  EXPECT_EQ(signalled.saves, std::vector<int64_t>{2});
  EXPECT_TRUE(signalled.final_params.empty());
  EXPECT_EQ(read_latest_checkpointed_iteration(config.checkpoint.save), 2);

  ConfigContainer limited = tiny_config(6);
  limited.train.exit_duration_in_mins = 0.0;
  const Recorded timed_out = train(limited);
  EXPECT_EQ(timed_out.state.step, 1);
  EXPECT_TRUE(timed_out.saves.empty());
  EXPECT_TRUE(timed_out.final_params.empty());
}

// A full disk while a checkpoint file is written: the write's ENOSPC is an exception naming the file (LibTorch's zip
// writer used to rethrow it from its destructor: SIGABRT), no temporary file is left and the old file is kept.
// /dev/full is the kernel's always-full device; the temporary file is made a link to it.
TEST(DiskFaults, AFullDiskFailsTheWriteCleanlyAndKeepsTheOldFile) {
  const fs::path dir = fresh_directory("disk_full");
  fs::create_directories(dir);
  const fs::path file = dir / "model_optim_rng.pt";
  bridge::utils::write_file_durably(file, "previous checkpoint");
  fs::create_symlink("/dev/full", file.string() + ".tmp");
  c10::Dict<std::string, torch::Tensor> state;
  state.insert("weight", torch::ones({256, 256}));
  try {
    bridge::utils::save_torch_pickle(file, state);
    ADD_FAILURE() << "writing to a full disk succeeded";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("No space left on device"));
    EXPECT_THAT(error.what(), HasSubstr(file.string() + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(file.string() + ".tmp")));
  EXPECT_EQ(bridge::utils::read_file(file), "previous checkpoint");
  fs::remove_all(dir);
}

// Damaged checkpoint files that the checkpoint fuzzer (fuzz/fuzz_checkpoint.cpp) found reaching past LibTorch's
// checks: a zip directory offset past the end (LibTorch 1.13's pickle_load read past its buffer: heap overflow under
// ASan) and memo indices of a billion (its unpickler reserved 15 and 30 GB). Each is now a clean error naming the file.
TEST(DamagedCheckpoints, FuzzerFindingsAreCleanErrors) {
  const fs::path seeds = fs::path(BRIDGE_SOURCE_DIR) / "fuzz/corpus/fuzz_checkpoint";
  for (const char* name : {"zip_offset_past_the_end", "pickle_memo_index_past_the_end",
                           "pickle_memo_index_after_unknown_opcode", "tensor_past_its_storage"}) {
    SCOPED_TRACE(name);
    EXPECT_THAT([&] { bridge::utils::load_torch_pickle(seeds / name); },
                ::testing::ThrowsMessage<std::runtime_error>(
                    ::testing::AllOf(HasSubstr((seeds / name).string()), HasSubstr("damaged"))));
  }
  // tensor_past_its_storage (found from the seed below): its tensor 'nested/u' names the 24-byte float storage of
  // 'nested/t' again as four int64s. LibTorch sized that storage by the pickle's count (32 bytes over a 24-byte
  // buffer), and saving it again read past the buffer; a storage is now the record's bytes, and too small is refused
  // (LibTorch 2.x's own check says so first; 1.13 has none, bridge's says it there).
  const char* const too_small =
#if TORCH_VERSION_MAJOR >= 2
      "require a storage of at least 32 bytes, but storage only has 24 bytes";
#else
      "the tensor 'nested/u' (sizes [4], strides [1], offset 0, 8-byte elements) reaches past the end of its 24-byte "
      "storage";
#endif
  EXPECT_THAT([&] { bridge::utils::load_torch_pickle(seeds / "tensor_past_its_storage"); },
              ::testing::ThrowsMessage<std::runtime_error>(HasSubstr(too_small)));
  // quantized_storage: dict_of_tensors_torch1.pt with its FloatStorage renamed QUInt8Storage. It loaded as a
  // quantized tensor without a quantizer, and saving it again failed an internal assert of LibTorch's pickler
  // (std::terminate in the fuzzer); it is refused when it loads.
  EXPECT_THAT([&] { bridge::utils::load_torch_pickle(seeds / "quantized_storage"); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  HasSubstr("the tensor 'nested/t' has the quantized dtype QUInt8 without a quantizer")));
  // The undamaged seeds (torch.save's and bridge's own) still load. dict_of_tensors_torch1.pt is torch 1.13's
  // torch.save of a dict whose nested dict has two tensors.
  const c10::IValue torch1 = bridge::utils::load_torch_pickle(seeds / "dict_of_tensors_torch1.pt");
  ASSERT_TRUE(torch1.isGenericDict());
  const c10::IValue nested = torch1.toGenericDict().at("nested");
  EXPECT_EQ(nested.toGenericDict().at("t").toTensor().sizes(), (std::vector<std::int64_t>{2, 3}));
  EXPECT_TRUE(nested.toGenericDict().at("u").toTensor().equal(torch::arange(4)));
  EXPECT_TRUE(bridge::utils::load_torch_pickle(seeds / "bridge_common.pt").isGenericDict());
#if TORCH_VERSION_MAJOR >= 2
  // torch 2.x's torch.save of a dict with a one-entry nested dict: Python's pickler writes that entry with SETITEM,
  // an opcode LibTorch 1.13's unpickler does not know (it reads SETITEMS only), so 1.13 cannot load this seed.
  EXPECT_TRUE(bridge::utils::load_torch_pickle(seeds / "dict_of_tensors.pt").isGenericDict());
#endif
}

// What a killed run leaves in checkpoint.save is removed at the next save: an iteration without common.pt, a
// complete one the tracker never named, stray .tmp files. The tracked checkpoint stays and still resumes.
TEST(DiskFaults, LeftoversOfKilledRunsAreRemovedAtTheNextSave) {
  const fs::path dir = fresh_directory("leftovers");
  ConfigContainer config = tiny_config(2);
  config.checkpoint.save = dir.string();
  config.checkpoint.ckpt_format = "torch";  // the legacy files' leftovers (torch_dist's: the kill trials)
  train(config);                            // tracker: 2
  // iter_0000003: a save cut short; iter_0000004: complete (a copy of 2) but never tracked; stray temporaries.
  fs::create_directories(dir / "iter_0000003" / "mp_rank_00");
  bridge::utils::write_file_durably(dir / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt.tmp", "torn");
  fs::copy(dir / "iter_0000002", dir / "iter_0000004", fs::copy_options::recursive);
  bridge::utils::write_file_durably(dir / "iter_0000002" / "common.pt.tmp", "torn");
  bridge::utils::write_file_durably(dir / "latest_checkpointed_iteration.txt.tmp", "9\n");
  std::ofstream(dir / "notes.tmp") << "the user's own file";  // not bridge's: kept
  const auto tracked_before = fs::last_write_time(dir / "iter_0000002" / "common.pt");

  config.train.train_iters = 3;
  const Recorded resumed = train(config);  // resumes from 2, saves 3
  ASSERT_EQ(resumed.loads.size(), 1U);
  EXPECT_EQ(resumed.loads[0].iteration, 2);
  std::vector<std::string> left;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) left.push_back(fs::relative(entry.path(), dir));
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"iter_0000002", "iter_0000002/common.pt", "iter_0000002/mp_rank_00",
                                            "iter_0000002/mp_rank_00/model_optim_rng.pt", "iter_0000003",
                                            "iter_0000003/common.pt", "iter_0000003/mp_rank_00",
                                            "iter_0000003/mp_rank_00/model_optim_rng.pt",
                                            "latest_checkpointed_iteration.txt", "notes.tmp"}));
  EXPECT_EQ(fs::last_write_time(dir / "iter_0000002" / "common.pt"), tracked_before);
  EXPECT_EQ(read_latest_checkpointed_iteration(dir.string()), 3);
  fs::remove_all(dir);
}

// The tiny model with MoE layers (4 experts of width 8, top 2, sigmoid routing with Megatron-Core's
// auxiliary-loss-free expert_bias moved every step) in bf16_mixed.
ConfigContainer tiny_moe_config(int64_t steps) {
  ConfigContainer config = tiny_config(steps);
  config.model.add_bias_linear = false;  // MoE layers have none
  config.model.num_moe_experts = 4;
  config.model.moe_ffn_hidden_size = 8;
  config.model.moe_router_topk = 2;
  config.model.moe_router_score_function = models::MoERouterScoreFunction::kSigmoid;
  config.model.moe_router_enable_expert_bias = true;
  config.model.moe_router_bias_update_rate = 1e-2;  // moves visibly in two steps
  apply_mixed_precision_recipe(config.mixed_precision, "bf16_mixed");
  return config;
}

constexpr char kExpertBias[] = "decoder.layers.0.mlp.router.expert_bias";

// The routers' expert_bias buffers at on_train_end, checked fp32.
std::map<std::string, torch::Tensor> expert_biases(CallbackContext& ctx) {
  std::map<std::string, torch::Tensor> biases;
  for (const auto& chunk : ctx.model) {
    for (const auto& item : chunk->named_buffers()) {
      if (item.key().find("router.expert_bias") == std::string::npos) continue;
      EXPECT_EQ(item.value().scalar_type(), torch::kFloat32) << item.key() << " under bf16";
      biases["decoder." + item.key()] = item.value().clone();
    }
  }
  return biases;
}

// The router's expert_bias is saved as the fp32 buffer it is under bf16 (never rounded to bf16: its steps of 1e-2 are
// below bf16's resolution near 1), restored fp32, and a resumed run continues the straight one bit for bit.
TEST(MoECheckpoint, ExpertBiasIsSavedAndRestoredInFp32UnderBf16) {
  const fs::path dir = fresh_directory("moe_bias");
  std::map<std::string, torch::Tensor> straight_biases, resumed_biases;
  const auto record = [](std::map<std::string, torch::Tensor>& into) {
    return [&into](CallbackManager& manager) {
      manager.register_callback(Event::kTrainEnd, [&into](CallbackContext& ctx) { into = expert_biases(ctx); });
    };
  };
  const Recorded straight = train(tiny_moe_config(4), record(straight_biases));
  ConfigContainer config = tiny_moe_config(2);
  config.checkpoint.save = dir.string();
  config.checkpoint.ckpt_format = "torch";  // the legacy rank file is read back below
  train(config);
  config.train.train_iters = 4;
  const Recorded resumed = train(config, record(resumed_biases));

  ASSERT_EQ(resumed.loads.size(), 1U);
  ASSERT_EQ(resumed.losses.size(), 2U);
  EXPECT_EQ(resumed.losses, std::vector<double>(straight.losses.begin() + 2, straight.losses.end()));
  EXPECT_EQ(resumed.grad_norms, std::vector<double>(straight.grad_norms.begin() + 2, straight.grad_norms.end()));
  expect_same_parameters(resumed.final_params, straight.final_params);
  ASSERT_EQ(straight_biases.size(), 2U);  // both layers are MoE layers
  ASSERT_EQ(resumed_biases.size(), straight_biases.size());
  for (const auto& [name, bias] : straight_biases) {
    EXPECT_TRUE(torch::equal(resumed_biases.at(name), bias)) << name;
    EXPECT_GT(bias.abs().max().item<float>(), 0.0f) << name << " moved";
  }

  const c10::impl::GenericDict file =
      bridge::utils::load_torch_pickle(dir / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt").toGenericDict();
  const c10::impl::GenericDict model = file.at("model").toGenericDict();
  EXPECT_EQ(model.at(kExpertBias).toTensor().scalar_type(), torch::kFloat32);
  EXPECT_EQ(model.at("decoder.layers.0.mlp.router.weight").toTensor().scalar_type(), torch::kBFloat16);
  EXPECT_GT(model.at(kExpertBias).toTensor().abs().max().item<float>(), 0.0f);
  const c10::impl::GenericDict state =
      file.at("optimizer").toGenericDict().at("optimizer").toGenericDict().at("state").toGenericDict();
  EXPECT_FALSE(state.contains(kExpertBias)) << "a buffer has no optimizer state";
  const c10::impl::GenericDict common =
      bridge::utils::load_torch_pickle(dir / "iter_0000002" / "common.pt").toGenericDict();
  EXPECT_EQ(common.at("tensors").toGenericDict().at(kExpertBias).toGenericDict().at("dtype").toStringRef(), "Float");
  fs::remove_all(dir);
}

// A run refused before anything is loaded or trained: its error holds each of `parts`.
void expect_refused(const ConfigContainer& config, const std::vector<std::string>& parts) {
  auto manager = std::make_shared<CallbackManager>();
  int steps = 0;
  manager->register_callback(Event::kTrainStepStart, [&](CallbackContext&) { ++steps; });
  try {
    pretrain(config, gpt_forward_step, manager);
    ADD_FAILURE() << "loaded a checkpoint that does not fit; expected: " << parts.front();
  } catch (const std::exception& error) {
    for (const std::string& part : parts) EXPECT_THAT(error.what(), HasSubstr(part));
  }
  EXPECT_EQ(steps, 0);
}

// A checkpoint without one of the model's experts, or with an expert the model lacks, is refused naming the tensor;
// one of another expert count also names model.num_moe_experts with the override that loads it.
TEST(MoECheckpoint, AMissingOrForeignExpertIsRefusedNamingIt) {
  const fs::path dir = fresh_directory("moe_experts");
  ConfigContainer config = tiny_moe_config(1);
  config.checkpoint.save = dir.string();
  config.checkpoint.ckpt_format = "torch";  // the legacy index (common.pt) is edited below
  train(config);
  const std::string expert3 = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight";
  const std::string expert4 = "decoder.layers.1.mlp.experts.local_experts.4.linear_fc1.weight";
  // Copies of the checkpoint whose index (common.pt) lacks expert 3's fc1, or names an expert 4 in its file.
  const auto edited = [&](const std::string& name, const std::function<void(c10::impl::GenericDict&)>& edit) {
    const fs::path copy = fresh_directory(name);
    fs::copy(dir, copy, fs::copy_options::recursive);
    c10::impl::GenericDict common =
        bridge::utils::load_torch_pickle(copy / "iter_0000001" / "common.pt").toGenericDict();
    c10::impl::GenericDict tensors = common.at("tensors").toGenericDict();
    EXPECT_TRUE(tensors.contains(expert3));
    edit(tensors);
    bridge::utils::save_torch_pickle(copy / "iter_0000001" / "common.pt", common);
    return copy;
  };
  const fs::path missing = edited("moe_missing", [&](c10::impl::GenericDict& tensors) { tensors.erase(expert3); });
  const fs::path foreign =
      edited("moe_foreign", [&](c10::impl::GenericDict& tensors) { tensors.insert(expert4, tensors.at(expert3)); });
  ConfigContainer load = tiny_moe_config(2);
  load.checkpoint.load = missing.string();
  expect_refused(load, {"the checkpoint has no tensor " + expert3 + ", which this run's model has"});
  load.checkpoint.load = foreign.string();
  expect_refused(load, {"the checkpoint holds " + expert4 + ", which this run's model does not have"});

  load.checkpoint.load = dir.string();
  load.model.num_moe_experts = 8;
  expect_refused(load, {"the checkpoint has no tensor decoder.layers.0.mlp.experts.local_experts.4.",
                        "model.num_moe_experts 4 (this run: 8)", "model.num_moe_experts=4"});
  fs::remove_all(dir);
  fs::remove_all(missing);
  fs::remove_all(foreign);
}

// checkpoint.ckpt_format torch_dist in one process: 16 bytes flipped inside a __0_0.distcp blob are named as damage
// (verify names the file; an explicit load fails naming it before a step) and checkpoint.auto_resume falls back loudly
// to the older complete checkpoint, setting the damaged one aside, and continues bit for bit; a checkpoint whose
// .metadata is missing (a save cut short before its commit) is refused by an explicit load and passed over by
// auto_resume for the older one.
TEST(TorchDistCheckpoint, DamageAndAMissingMetadataAreRefusedAndAutoResumeFallsBack) {
  const fs::path dir = fresh_directory("torch_dist_damaged");
  ConfigContainer config = tiny_config(4);
  config.checkpoint.save = dir.string();
  config.checkpoint.save_interval = 2;
  config.checkpoint.ckpt_format = "torch_dist";
  const Recorded first = train(config);  // iterations 2 and 4
  ASSERT_EQ(first.losses.size(), 4U);
  const fs::path blob = dir / "iter_0000004" / "__0_0.distcp";
  ASSERT_TRUE(fs::exists(blob));
  {
    std::fstream file(blob, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(blob) / 2);
    for (std::streamoff i = 0; i < 16; ++i) {
      file.seekg(middle + i);
      const int byte = file.get();
      file.seekp(middle + i);
      file.put(static_cast<char>(byte ^ 0xFF));
    }
  }
  bool named = false;
  for (const VerifiedFile& file : verify_checkpoint((dir / "iter_0000004").string())) {
    if (file.path == "__0_0.distcp") {
      named = true;
      EXPECT_THAT(file.problem, HasSubstr("is damaged"));
    } else {
      EXPECT_TRUE(file.intact()) << file.path << ": " << file.problem;
    }
  }
  EXPECT_TRUE(named) << "verify does not report __0_0.distcp";

  // An explicit load of it: an error naming the file, before a step.
  ConfigContainer load = tiny_config(6);
  load.checkpoint.load = dir.string();
  const auto expect_refused_naming = [&](const std::string& what) {
    int steps = 0;
    try {
      train(load, [&](CallbackManager& manager) {
        manager.register_callback(Event::kTrainStepEnd, [&](CallbackContext&) { ++steps; });
      });
      ADD_FAILURE() << "the load succeeded";
    } catch (const bridge::utils::DamagedFileError& error) {
      EXPECT_THAT(error.what(), HasSubstr(what));
    }
    EXPECT_EQ(steps, 0) << "trained on it";
  };
  expect_refused_naming(blob.string() + " is damaged");

  // Auto-resume: loudly back to iteration 2, the damaged one kept aside, then the first run's losses.
  config.train.train_iters = 6;
  ::testing::internal::CaptureStderr();
  const Recorded resumed = train(config);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(resumed.loads.size(), 1U);
  EXPECT_EQ(resumed.loads[0].iteration, 2);
  EXPECT_THAT(log, HasSubstr(blob.string() + " is damaged"));
  EXPECT_THAT(log,
              HasSubstr("checkpoint iteration 4 is damaged; it is kept as " + (dir / "iter_0000004.damaged").string()));
  EXPECT_TRUE(fs::exists(dir / "iter_0000004.damaged" / "__0_0.distcp"));
  ASSERT_EQ(resumed.losses.size(), 4U);
  EXPECT_EQ(resumed.losses[0], first.losses[2]);
  EXPECT_EQ(resumed.losses[1], first.losses[3]);
  EXPECT_EQ(read_latest_checkpointed_iteration(dir.string()), 6);

  // Iteration 6 without its .metadata: refused when asked for, passed over by auto-resume for iteration 4.
  const fs::path metadata = dir / "iter_0000006" / ".metadata";
  ASSERT_TRUE(fs::remove(metadata));
  load.train.train_iters = 8;
  expect_refused_naming(metadata.string() + " is missing");
  config.train.train_iters = 8;
  const Recorded after = train(config);
  ASSERT_EQ(after.loads.size(), 1U);
  EXPECT_EQ(after.loads[0].iteration, 4);
  ASSERT_EQ(after.losses.size(), 4U);
  EXPECT_EQ(after.losses[0], resumed.losses[2]);
  EXPECT_EQ(after.losses[1], resumed.losses[3]);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace bridge::training
