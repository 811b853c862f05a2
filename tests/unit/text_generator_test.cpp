// TextGenerator and Profiler on a real GPT in a world of one. TextGenerator's greedy continuation is compared with
// the argmax of the model's own forward pass over the unpadded prefix, token by token (the reference); top-k draws
// stay among the k likeliest and repeat for the same step. The Profiler's trace is read back as JSON. Generation
// across tensor and pipeline ranks is in gpt_dist_test (GptBuiltins).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bridge/models/gpt_model.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "tests/unit/callback_test_support.h"
#include "training/callbacks.h"
#include "training/config/config.h"
#include "training/tokenizers/byte_level_tokenizer.h"
#include "training/tokenizers/null_tokenizer.h"

namespace bridge::training {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::what_of;

// A world of one with a small byte-level GPT (dropout on, so that generating in training mode would be random).
class TextGeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    parallel::init_distributed(parallel::LaunchEnv{}, {});
    parallel::initialize_model_parallel(1, 1);
    config_.num_layers = 2;
    config_.hidden_size = 32;
    config_.num_attention_heads = 4;
    config_.vocab_size = tokenizers::ByteLevelTokenizer().vocab_size();
    config_.seq_length = 24;
    config_.hidden_dropout = 0.2;
    config_.init_method_std = 0.5;  // a random model with decided preferences: few near-ties in the argmax
    models::GPTChunkOptions whole;
    whole.num_layers = config_.num_layers;
    gpt_ = models::GPTModel(config_, whole);
    model_ = {gpt_.ptr()};
  }
  void TearDown() override {
    parallel::destroy_model_parallel();
    parallel::destroy_distributed();
  }

  // The logits over the tokenizer's ids after `prefix`, from one unpadded forward pass in eval mode.
  torch::Tensor next_logits(const std::vector<int64_t>& prefix) {
    torch::NoGradGuard no_grad;
    const bool was_training = gpt_->is_training();
    gpt_->eval();
    const auto length = static_cast<int64_t>(prefix.size());
    const torch::Tensor tokens = torch::tensor(prefix, torch::kInt64).unsqueeze(0);
    const torch::Tensor positions = torch::arange(length, torch::kInt64).unsqueeze(0);
    torch::Tensor logits = gpt_->forward(tokens, positions)[0][length - 1];
    gpt_->train(was_training);
    return logits.slice(0, 0, config_.vocab_size).to(torch::kFloat);
  }

  std::vector<GeneratedText> generate(TextGenerator& generator, int64_t step) {
    CallbackContext ctx(state_, model_);
    return generator.generate(ctx, step);
  }

  models::GPTConfig config_;
  models::GPTModel gpt_{nullptr};
  ModelChunks model_;
  GlobalState state_;
};

TEST_F(TextGeneratorTest, GreedyContinuationIsTheArgmaxOfTheModelsOwnForwardPass) {
  TextGeneratorOptions options;
  options.prompts = {"Once upon a time", "Hi"};  // different lengths share one padded batch
  options.max_new_tokens = 6;
  options.stop_at_eod = false;
  TextGenerator generator(options);
  gpt_->train();
  const std::vector<GeneratedText> texts = generate(generator, 100);
  EXPECT_TRUE(gpt_->is_training()) << "the model goes back to training mode";
  ASSERT_EQ(texts.size(), 2u);
  tokenizers::ByteLevelTokenizer tokenizer;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE(options.prompts[i]);
    EXPECT_EQ(texts[i].prompt, options.prompts[i]);
    ASSERT_EQ(texts[i].tokens.size(), 6u);
    std::vector<int64_t> prefix = tokenizer.encode(options.prompts[i]);
    for (const int64_t token : texts[i].tokens) {
      EXPECT_EQ(token, next_logits(prefix).argmax().item<int64_t>()) << "after " << prefix.size() << " tokens";
      prefix.push_back(token);
    }
    EXPECT_EQ(texts[i].continuation, tokenizer.decode(texts[i].tokens));
  }
}

TEST_F(TextGeneratorTest, WithoutATokenizerOfItsOwnItUsesTheRuns) {
  ConfigContainer config;
  config.tokenizer.tokenizer_type = "NullTokenizer";  // prompts are ids: "5 6 7" is {5, 6, 7}
  config.tokenizer.vocab_size = config_.vocab_size;
  state_.cfg = &config;
  TextGeneratorOptions options;
  options.prompts = {"5 6 7"};
  options.max_new_tokens = 3;
  options.stop_at_eod = false;
  TextGenerator generator(options);
  CallbackContext ctx(state_, model_);
  generator.on_train_start(ctx);
  const GeneratedText text = generate(generator, 1)[0];
  ASSERT_EQ(text.tokens.size(), 3u);
  EXPECT_EQ(text.tokens[0], next_logits({5, 6, 7}).argmax().item<int64_t>()) << "the prompt was not read as ids";
  EXPECT_EQ(text.continuation, tokenizers::NullTokenizer(config_.vocab_size).decode(text.tokens));

  state_.cfg = nullptr;  // no config: the byte-level tokenizer
  TextGenerator bytes(options);
  const GeneratedText byte_text = generate(bytes, 1)[0];
  EXPECT_EQ(byte_text.tokens[0],
            next_logits(tokenizers::ByteLevelTokenizer().encode("5 6 7")).argmax().item<int64_t>());
}

TEST_F(TextGeneratorTest, TopKDrawsAmongTheKLikeliestAndRepeatsForTheSameStep) {
  TextGeneratorOptions options;
  options.prompts = {"abc"};
  options.max_new_tokens = 12;
  options.top_k = 3;
  options.temperature = 5.0;  // flat enough that the three are all drawn now and then
  options.stop_at_eod = false;
  TextGenerator generator(options);
  const std::vector<int64_t> first = generate(generator, 7)[0].tokens;
  EXPECT_EQ(generate(generator, 7)[0].tokens, first) << "the same step draws the same tokens";
  std::vector<int64_t> prefix = tokenizers::ByteLevelTokenizer().encode("abc");
  int not_the_argmax = 0;
  for (const int64_t token : first) {
    const torch::Tensor logits = next_logits(prefix);
    const torch::Tensor top = std::get<1>(logits.topk(3));
    EXPECT_TRUE((top == token).any().item<bool>()) << "token " << token << " is not among the 3 likeliest";
    not_the_argmax += token != top[0].item<int64_t>() ? 1 : 0;
    prefix.push_back(token);
  }
  EXPECT_GT(not_the_argmax, 0) << "12 draws at temperature 5 never left the argmax: not sampling";
  bool another_step_differs = false;
  for (int64_t step = 8; step < 12 && !another_step_differs; ++step) {
    another_step_differs = generate(generator, step)[0].tokens != first;
  }
  EXPECT_TRUE(another_step_differs) << "the step is part of the seed";
}

TEST_F(TextGeneratorTest, StopsAtTheEndOfDocumentToken) {
  // Make EOD the likeliest token everywhere: the final layer norm outputs ones whatever its input, and only the EOD
  // row of the output weight is non-zero.
  {
    torch::NoGradGuard no_grad;
    gpt_->final_layernorm->weight.zero_();
    gpt_->final_layernorm->bias.fill_(1.0);
    torch::Tensor output = gpt_->output_weight.defined() ? gpt_->output_weight : gpt_->word_embeddings->weight;
    output.zero_();
    output[tokenizers::ByteLevelTokenizer::kEod].fill_(1.0);
  }
  TextGeneratorOptions options;
  options.prompts = {"xyz"};
  options.max_new_tokens = 5;
  ASSERT_EQ(next_logits(tokenizers::ByteLevelTokenizer().encode("xyz")).argmax().item<int64_t>(),
            tokenizers::ByteLevelTokenizer::kEod);
  TextGenerator generator(options);
  EXPECT_TRUE(generate(generator, 1)[0].tokens.empty());
  options.stop_at_eod = false;
  TextGenerator keeps_going(options);
  const GeneratedText text = generate(keeps_going, 1)[0];
  EXPECT_EQ(text.tokens.size(), 5u);
  EXPECT_THAT(text.continuation, HasSubstr("<|endoftext|>"));
}

TEST_F(TextGeneratorTest, WritesTheTextsToTheLogRecordAtADueWriterStep) {
  ConfigContainer config;
  config.logging.jsonl_path = "unused.jsonl";  // writers on: texts wait for their steps
  config.logging.tensorboard_log_interval = 5;
  state_.cfg = &config;
  TextGeneratorOptions options;
  options.prompts = {"The", "A"};
  options.interval = 3;
  options.max_new_tokens = 2;
  auto generator = std::make_shared<TextGenerator>(options);
  CallbackManager manager;
  manager.add(generator);
  CallbackContext start(state_, model_, manager.user_state());
  manager.fire(Event::kTrainStart, start);
  auto log_at = [&](int64_t step) {
    LogRecord record;
    record.iteration = step;
    CallbackContext ctx(state_, model_, manager.user_state());
    ctx.log = &record;
    manager.fire(Event::kLog, ctx);
    return record.texts;
  };
  EXPECT_TRUE(log_at(1).empty());
  EXPECT_TRUE(log_at(3).empty()) << "due, but not a writer step";
  const auto texts = log_at(5);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts.at("text_generation/prompt_0"), "The" + generator->last()[0].continuation);
  EXPECT_EQ(texts.at("text_generation/prompt_1"), "A" + generator->last()[1].continuation);
  EXPECT_TRUE(log_at(6).empty()) << "next due at step 6, written at the writer step 10";
  EXPECT_EQ(log_at(10).size(), 2u);
}

TEST_F(TextGeneratorTest, OptionsOutOfRangeAreNamed) {
  const auto error = [](const std::function<void(TextGeneratorOptions&)>& change) {
    TextGeneratorOptions options;
    options.prompts = {"hello"};
    change(options);
    return what_of([&] { TextGenerator generator(options); });
  };
  EXPECT_THAT(error([](auto& o) { o.prompts.clear(); }), HasSubstr("TextGenerator.prompts is empty"));
  EXPECT_THAT(error([](auto& o) {
                o.prompts = {"a", ""};
                o.tokenizer_type = "ByteLevel";  // without one, the prompts are encoded at on_train_start
              }),
              HasSubstr("prompts[1] is empty"));
  EXPECT_THAT(error([](auto& o) { o.interval = 0; }), HasSubstr("TextGenerator.interval is 0"));
  EXPECT_THAT(error([](auto& o) { o.max_new_tokens = -1; }), HasSubstr("max_new_tokens is -1"));
  EXPECT_THAT(error([](auto& o) { o.top_k = 0; }), HasSubstr("top_k is 0"));
  EXPECT_THAT(error([](auto& o) { o.temperature = 0.0; }), HasSubstr("temperature is 0"));
  EXPECT_THAT(error([](auto& o) { o.tokenizer_type = "Bytelevel"; }), HasSubstr("did you mean ByteLevel?"));
  EXPECT_THAT(error([](auto& o) { o.tokenizer_type = "GPT2BPETokenizer"; }), HasSubstr("needs vocab_file"));

  TextGeneratorOptions options;
  options.prompts = {"hello"};
  options.max_new_tokens = config_.seq_length;
  TextGenerator too_long(options);
  CallbackContext ctx(state_, model_);
  EXPECT_THAT(what_of([&] { too_long.on_train_start(ctx); }),
              HasSubstr("max_new_tokens is 24 but model.seq_length is 24"));
  options.max_new_tokens = 4;
  options.prompts = {"ok", "caf\xc3\xa9"};  // 0xc3 = 195
  config_.vocab_size = 195;
  models::GPTChunkOptions whole;
  whole.num_layers = config_.num_layers;
  ModelChunks small{models::GPTModel(config_, whole).ptr()};
  CallbackContext small_ctx(state_, small);
  TextGenerator outside(options);
  EXPECT_THAT(what_of([&] { outside.on_train_start(small_ctx); }),
              HasSubstr("TextGenerator.prompts[1] encodes to token 195 but model.vocab_size is 195"));
}

TEST_F(TextGeneratorTest, AModelWithFewerIdsThanTheTokenizerOnlyGetsIdsItHas) {
  config_.vocab_size = 100;  // below the byte tokenizer's 257, and its EOD
  models::GPTChunkOptions whole;
  whole.num_layers = config_.num_layers;
  gpt_ = models::GPTModel(config_, whole);
  model_ = {gpt_.ptr()};
  TextGeneratorOptions options;
  options.prompts = {"abc"};
  options.max_new_tokens = 10;
  options.top_k = 50;
  options.temperature = 100.0;
  TextGenerator generator(options);
  CallbackContext ctx(state_, model_);
  generator.on_train_start(ctx);
  const std::vector<int64_t> tokens = generate(generator, 3)[0].tokens;
  EXPECT_EQ(tokens.size(), 10u);
  for (const int64_t token : tokens) EXPECT_LT(token, 100);
}

// --- Profiler -----------------------------------------------------------------------------------------------------

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("bridge_profiler_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Steps 1..`steps` as the loop runs them, each with a matrix product between its start and end events.
  void train(Profiler& profiler, int64_t steps) {
    CallbackManager manager;
    manager.add(std::shared_ptr<Profiler>(&profiler, [](Profiler*) {}));
    GlobalState state;
    ModelChunks model;
    auto fire = [&](Event event) {
      CallbackContext ctx(state, model, manager.user_state());
      manager.fire(event, ctx);
    };
    fire(Event::kTrainStart);
    const torch::Tensor a = torch::randn({8, 8});
    for (int64_t step = 1; step <= steps; ++step) {
      fire(Event::kTrainStepStart);
      (void)torch::mm(a, a);
      fire(Event::kTrainStepEnd);
      state.train_state.step = step;  // the loop counts the step after on_train_step_end
    }
    fire(Event::kTrainEnd);
  }

  // The names of the trace's events, with how often each occurs.
  static std::map<std::string, int> event_names(const fs::path& trace) {
    std::ifstream in(trace);
    const nlohmann::json events = nlohmann::json::parse(in);
    std::map<std::string, int> names;
    for (const auto& event : events) ++names[event.at("name").get<std::string>()];
    return names;
  }

  fs::path dir_;
};

TEST_F(ProfilerTest, RecordsTheStepsOfItsWindowAsAChromeTrace) {
  ProfilerOptions options;
  options.start_step = 2;
  options.num_steps = 2;
  options.output_dir = dir_.string();
  Profiler profiler(options);
  train(profiler, 5);
  EXPECT_EQ(profiler.trace_path(), (dir_ / "trace_rank0.json").string());
  const auto names = event_names(profiler.trace_path());
  EXPECT_EQ(names.count("ProfilerStep#1"), 0u);
  EXPECT_EQ(names.count("ProfilerStep#2"), 1u);
  EXPECT_EQ(names.count("ProfilerStep#3"), 1u);
  EXPECT_EQ(names.count("ProfilerStep#4"), 0u);
  ASSERT_EQ(names.count("aten::mm"), 1u);
  EXPECT_EQ(names.at("aten::mm"), 2) << "one product in each of the two steps recorded";
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename(), "trace_rank0.json") << "no temporary file is left";
  }
}

TEST_F(ProfilerTest, WritesTheTraceWhenTrainingStopsInsideTheWindow) {
  ProfilerOptions options;
  options.start_step = 2;
  options.num_steps = 10;
  options.output_dir = dir_.string();
  Profiler profiler(options);
  train(profiler, 3);
  const auto names = event_names(profiler.trace_path());
  EXPECT_EQ(names.count("ProfilerStep#3"), 1u);
  EXPECT_EQ(names.at("aten::mm"), 2);
}

TEST_F(ProfilerTest, RanksNotListedRecordNothingAndBadOptionsAreNamed) {
  ProfilerOptions options;
  options.output_dir = dir_.string();
  options.ranks = {1};
  GlobalState state;
  ModelChunks model;
  CallbackContext ctx(state, model);
  Profiler out_of_range(options);
  EXPECT_THAT(what_of([&] { out_of_range.on_train_start(ctx); }),
              HasSubstr("Profiler.ranks holds 1, but the job has ranks 0 to 0"));
  options.ranks = {0};
  options.start_step = 1;
  options.num_steps = 1;
  Profiler listed(options);
  train(listed, 2);
  EXPECT_TRUE(fs::exists(listed.trace_path()));

  options.num_steps = 0;
  EXPECT_THAT(what_of([&] { Profiler p(options); }), HasSubstr("Profiler.num_steps is 0"));
  options.num_steps = 1;
  options.start_step = 0;
  EXPECT_THAT(what_of([&] { Profiler p(options); }), HasSubstr("Profiler.start_step is 0"));
}

}  // namespace
}  // namespace bridge::training
