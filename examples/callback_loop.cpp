// A small, real training loop driven through bridge's callbacks: a byte-level language model learns an embedded
// public-domain text, and every lifecycle event reaches the registered callbacks with the fields the reference loop
// provides. Class callbacks and lambdas mix; one lambda stops training through a control request.
//
// Usage: callback_loop [--train-iters N] [--eval-interval N] [--threads N] [--stop-at-loss X]
//
// The model-parallel pretrain() loop replaces this example as the main job; the callbacks below keep working there.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <string>
#include <thread>

#include "bridge/bridge.h"
#include "examples/sonnet.h"

namespace {

using namespace bridge::training;

constexpr const char* kCorpus = bridge::examples::kSonnet18;

constexpr int64_t kContext = 8;  // bytes of history the model sees
constexpr int64_t kBatch = 32;

// Predicts the next byte from the previous kContext bytes: embedding, one hidden layer, byte logits.
struct ByteModelImpl : torch::nn::Module {
  ByteModelImpl()
      : embedding(register_module("embedding", torch::nn::Embedding(256, 32))),
        hidden(register_module("hidden", torch::nn::Linear(kContext * 32, 256))),
        output(register_module("output", torch::nn::Linear(256, 256))) {}
  torch::Tensor forward(const torch::Tensor& tokens) {
    return output(torch::gelu(hidden(embedding(tokens).flatten(1))));
  }
  torch::nn::Embedding embedding;
  torch::nn::Linear hidden, output;
};
TORCH_MODULE(ByteModel);

// Random (context, next byte) pairs from a slice of the corpus.
std::pair<torch::Tensor, torch::Tensor> sample_batch(const torch::Tensor& data, torch::Generator& generator) {
  auto starts = torch::randint(data.size(0) - kContext, {kBatch}, generator, torch::kLong);
  auto offsets = torch::arange(kContext + 1, torch::kLong);
  auto windows = data.index({starts.unsqueeze(1) + offsets});
  return {windows.slice(1, 0, kContext), windows.select(1, kContext)};
}

// Prints wall time and throughput at the end of training.
class Stopwatch : public Callback {
 public:
  void on_train_start(CallbackContext&) override { start_ = std::chrono::steady_clock::now(); }
  void on_train_end(CallbackContext& ctx) override {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const auto steps = ctx.state.train_state.step;
    std::printf("trained %lld steps in %.2f s (%.0f tokens/s)\n", static_cast<long long>(steps), seconds,
                static_cast<double>(steps * kBatch) / seconds);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Adds the learning rate to each log record, the way a user extends the log line.
class LearningRateLogger : public Callback {
 public:
  void on_log(CallbackContext& ctx) override { ctx.log->metrics["learning rate"] = ctx.scheduler->get_lr(); }
};

struct Options {
  int64_t train_iters;
  int64_t eval_interval;
  int64_t eval_iters;
  int64_t log_interval;
  double stop_at_loss;
};

// Fills the fields every training event carries.
void add_training_fields(CallbackContext& ctx, torch::optim::Optimizer& optimizer, OptimizerParamScheduler& scheduler) {
  ctx.optimizer = optimizer;
  ctx.scheduler = scheduler;
}

LossDict evaluate(ByteModel& model, ModelChunks& chunks, GlobalState& state, CallbackManager& manager,
                  const torch::Tensor& data, torch::Generator& generator, int64_t eval_iters) {
  torch::NoGradGuard no_grad;
  model->eval();
  if (should_fire(&manager, Event::kEvalStart)) {
    CallbackContext ctx(state, chunks, manager.user_state());
    manager.fire(Event::kEvalStart, ctx);
  }
  double total = 0.0;
  for (int64_t i = 0; i < eval_iters; ++i) {
    CallbackContext ctx(state, chunks, manager.user_state());
    if (should_fire(&manager, Event::kEvalStepStart)) manager.fire(Event::kEvalStepStart, ctx);
    auto [tokens, targets] = sample_batch(data, generator);
    total += torch::cross_entropy_loss(model(tokens), targets).item<double>();
    if (should_fire(&manager, Event::kEvalStepEnd)) manager.fire(Event::kEvalStepEnd, ctx);
  }
  LossDict result{{"lm loss", torch::tensor(total / static_cast<double>(std::max<int64_t>(eval_iters, 1)))}};
  if (should_fire(&manager, Event::kEvalEnd)) {
    CallbackContext ctx(state, chunks, manager.user_state());
    ctx.total_loss_dict = result;
    manager.fire(Event::kEvalEnd, ctx);  // still in eval mode, as in Megatron-Bridge
  }
  model->train();
  return result;
}

void train(const Options& options, CallbackManager& manager) {
  GlobalState state;
  ByteModel model;
  ModelChunks chunks{model.ptr()};
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  OptimizerParamSchedulerOptions schedule;
  schedule.max_lr = 3e-3;
  schedule.min_lr = 3e-4;
  schedule.lr_warmup_steps = options.train_iters / 10;
  schedule.lr_decay_steps = options.train_iters;
  schedule.lr_decay_style = LrDecayStyle::kCosine;
  OptimizerParamScheduler scheduler(optimizer, schedule);

  if (should_fire(&manager, Event::kDataInitStart)) {
    CallbackContext ctx(state, chunks, manager.user_state());
    add_training_fields(ctx, optimizer, scheduler);
    manager.fire(Event::kDataInitStart, ctx);
  }
  const std::string text(kCorpus);
  auto bytes = torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())}, torch::kUInt8)
                   .to(torch::kLong);
  const int64_t split = bytes.size(0) * 9 / 10;
  const torch::Tensor train_data = bytes.slice(0, 0, split), valid_data = bytes.slice(0, split - kContext);
  auto generator = torch::make_generator<at::CPUGeneratorImpl>(1234);
  state.train_state.do_train = state.train_state.do_valid = true;

  model->train();
  if (should_fire(&manager, Event::kTrainStart)) {
    CallbackContext ctx(state, chunks, manager.user_state());
    add_training_fields(ctx, optimizer, scheduler);
    manager.fire(Event::kTrainStart, ctx);
  }
  double interval_loss = 0.0;
  while (state.train_state.step < options.train_iters) {
    CallbackContext ctx(state, chunks, manager.user_state());
    add_training_fields(ctx, optimizer, scheduler);
    if (should_fire(&manager, Event::kTrainStepStart)) manager.fire(Event::kTrainStepStart, ctx);

    optimizer.zero_grad();
    auto [tokens, targets] = sample_batch(train_data, generator);
    ctx.micro_batch = int64_t{0};
    ctx.model_chunk = int64_t{0};
    if (should_fire(&manager, Event::kForwardStart)) manager.fire(Event::kForwardStart, ctx);
    torch::Tensor loss = torch::cross_entropy_loss(model(tokens), targets);
    ctx.output_tensor = loss;
    if (should_fire(&manager, Event::kForwardEnd)) manager.fire(Event::kForwardEnd, ctx);
    if (should_fire(&manager, Event::kBackwardStart)) manager.fire(Event::kBackwardStart, ctx);
    loss.backward();
    if (should_fire(&manager, Event::kBackwardEnd)) manager.fire(Event::kBackwardEnd, ctx);

    ctx.grad_norm = torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    if (should_fire(&manager, Event::kOptimizerStepStart)) manager.fire(Event::kOptimizerStepStart, ctx);
    optimizer.step();
    scheduler.step(1);
    if (should_fire(&manager, Event::kOptimizerStepEnd)) manager.fire(Event::kOptimizerStepEnd, ctx);

    ctx.loss_dict = LossDict{{"lm loss", loss.detach()}};
    ctx.skipped_iter = false;
    if (should_fire(&manager, Event::kTrainStepEnd)) manager.fire(Event::kTrainStepEnd, ctx);
    state.train_state.step += 1;
    state.train_state.consumed_train_samples += kBatch;
    interval_loss += loss.item<double>();

    const int64_t step = state.train_state.step;
    if (step % options.log_interval == 0) {
      LogRecord record;
      record.iteration = step;
      record.metrics["lm loss"] = interval_loss / static_cast<double>(options.log_interval);
      interval_loss = 0.0;
      if (should_fire(&manager, Event::kLog)) {
        CallbackContext log_ctx(state, chunks, manager.user_state());
        add_training_fields(log_ctx, optimizer, scheduler);
        log_ctx.log = record;
        manager.fire(Event::kLog, log_ctx);
      }
      std::string line = " iteration " + std::to_string(step) + "/" + std::to_string(options.train_iters) + " |";
      for (const auto& [name, value] : record.metrics) {
        char buffer[64];
        std::snprintf(buffer, sizeof(buffer), " %s: %.6E |", name.c_str(), value);
        line += buffer;
      }
      for (const std::string& text_fragment : record.text) line += " " + text_fragment + " |";
      std::printf("%s\n", line.c_str());
    }
    if (options.eval_interval > 0 && step % options.eval_interval == 0) {
      evaluate(model, chunks, state, manager, valid_data, generator, options.eval_iters);
    }
    // Act on the control requests at the step boundary, then consume them.
    bool stop = false;
    for (const ControlRequest& request : manager.control().take()) {
      const std::string who = request.callback + " in " + std::string(to_string(request.event));
      if (request.action == ControlAction::kAbort)
        throw std::runtime_error("aborted by " + who + ": " + request.reason);
      if (request.action == ControlAction::kSave) {
        std::printf("save requested by %s (%s); this example keeps no checkpoints\n", who.c_str(),
                    request.reason.c_str());
      }
      if (request.action == ControlAction::kStop) {
        std::printf("stopping at step %lld: %s asked (%s)\n", static_cast<long long>(step), who.c_str(),
                    request.reason.c_str());
        stop = true;
      }
    }
    if (stop) break;
  }
  if (should_fire(&manager, Event::kTrainEnd)) {
    CallbackContext ctx(state, chunks, manager.user_state());
    add_training_fields(ctx, optimizer, scheduler);
    manager.fire(Event::kTrainEnd, ctx);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options cli("callback_loop", "Trains a byte-level language model through bridge callbacks.");
  cli.add_options()("train-iters", "Training steps", cxxopts::value<int64_t>()->default_value("600"))(
      "eval-interval", "Steps between evaluations (0: never)", cxxopts::value<int64_t>()->default_value("200"))(
      "eval-iters", "Batches per evaluation", cxxopts::value<int64_t>()->default_value("10"))(
      "log-interval", "Steps between log lines", cxxopts::value<int64_t>()->default_value("50"))(
      "threads", "Intra-op threads (0: one per core)", cxxopts::value<int>()->default_value("0"))(
      "stop-at-loss", "Stop once the training loss falls below this", cxxopts::value<double>()->default_value("0"))(
      "h,help", "Print usage");
  try {
    const auto args = cli.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", cli.help().c_str());
      return 0;
    }
    const Options options{args["train-iters"].as<int64_t>(), args["eval-interval"].as<int64_t>(),
                          args["eval-iters"].as<int64_t>(), args["log-interval"].as<int64_t>(),
                          args["stop-at-loss"].as<double>()};
    if (options.train_iters <= 0 || options.log_interval <= 0 || options.eval_iters < 0 || options.eval_interval < 0) {
      throw std::invalid_argument("--train-iters and --log-interval must be > 0; --eval-* must be >= 0");
    }
    const int threads = args["threads"].as<int>();
    // LibTorch here starts with one intra-op thread; use every core unless told otherwise.
    torch::set_num_threads(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    torch::manual_seed(1234);

    CallbackManager manager;
    manager.add({std::make_shared<Stopwatch>(), std::make_shared<LearningRateLogger>()});
    manager.register_callback("on_eval_end", [](CallbackContext& ctx) {
      const double loss = ctx.total_loss_dict->at("lm loss").item<double>();
      std::printf(" validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |\n",
                  static_cast<long long>(ctx.state.train_state.step), loss, std::exp(std::min(20.0, loss)));
    });
    manager.register_callback(
        Event::kTrainStepEnd,
        [&options](CallbackContext& ctx) {
          const double loss = ctx.loss_dict->at("lm loss").item<double>();
          double& best = ctx.user_state.get_or_insert("best_loss", loss);
          best = std::min(best, loss);
          if (options.stop_at_loss > 0 && loss < options.stop_at_loss) {
            ctx.request_stop("training loss " + std::to_string(loss) + " fell below --stop-at-loss");
          }
        },
        "early_stop");
    manager.register_callback("on_train_end", [](CallbackContext& ctx) {
      std::printf("best training loss: %.4f\n", ctx.user_state.get<double>("best_loss"));
    });

    train(options, manager);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "callback_loop: %s\n", error.what());
    return 1;
  }
}
