// TextGenerator: token-by-token continuation through the pipeline schedule (see the header for the design).
#include "training/callbacks/text_generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "bridge/models/gpt_model.h"
#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "training/config/config.h"
#include "training/inference.h"
#include "training/optimizer/mixed_precision.h"
#include "training/tokenizers/build_tokenizer.h"
#include "utils/logging.h"

namespace bridge::training {
inline namespace callbacks {
namespace {

// Puts the chunks in eval mode (no dropout) for the guard's life, then back as they were.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(ModelChunks& chunks) : chunks_(chunks) {
    for (auto& chunk : chunks_) {
      was_training_.push_back(chunk->is_training());
      chunk->eval();
    }
  }
  ~EvalModeGuard() {
    for (std::size_t i = 0; i < chunks_.size(); ++i) chunks_[i]->train(was_training_[i]);
  }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  ModelChunks& chunks_;
  std::vector<bool> was_training_;
};

// The next token of each row of `logits` ([b, vocab], float, on the CPU): the argmax, or a draw among the top k.
torch::Tensor pick_tokens(torch::Tensor logits, const TextGeneratorOptions& options, at::Generator& generator) {
  // A diverged model (NaN weights, fp16 overflow) still gets a text, not a failed multinomial on the last stage only.
  logits = torch::nan_to_num(logits, /*nan=*/0.0);
  if (options.top_k == 1) return logits.argmax(-1);
  const int64_t k = std::min<int64_t>(options.top_k, logits.size(-1));
  auto [values, indices] = (logits / options.temperature).topk(k, -1);
  const torch::Tensor probabilities = torch::softmax(values, -1);
  const torch::Tensor choice = torch::multinomial(probabilities, 1, /*replacement=*/false, generator);
  return indices.gather(-1, choice).squeeze(-1);
}

// Throws when the prompts or the new tokens do not fit the model (before on_train_start and generate() run it).
void check_fits(const TextGeneratorOptions& options, const tokenizers::Tokenizer& tokenizer,
                const std::vector<std::vector<int64_t>>& prompt_tokens, const models::GPTConfig& config) {
  if (options.max_new_tokens >= config.seq_length) {
    throw std::invalid_argument(fmt::format(
        "TextGenerator.max_new_tokens is {} but model.seq_length is {}; generate fewer tokens than the sequence holds",
        options.max_new_tokens, config.seq_length));
  }
  for (std::size_t i = 0; i < prompt_tokens.size(); ++i) {
    for (const int64_t token : prompt_tokens[i]) {
      if (token >= config.vocab_size) {
        throw std::invalid_argument(fmt::format(
            "TextGenerator.prompts[{}] encodes to token {} but model.vocab_size is {}; use the tokenizer the data "
            "was prepared with ({} has {} ids)",
            i, token, config.vocab_size, tokenizer.name(), tokenizer.vocab_size()));
      }
    }
  }
}

}  // namespace

TextGenerator::TextGenerator(TextGeneratorOptions options) : options_(std::move(options)) {
  if (options_.prompts.empty()) {
    throw std::invalid_argument("TextGenerator.prompts is empty; give at least one, e.g. prompts: [\"Once upon\"]");
  }
  const auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument("TextGenerator." + message);
  };
  require(options_.interval > 0, fmt::format("interval is {}; use 1 or more", options_.interval));
  require(options_.max_new_tokens > 0, fmt::format("max_new_tokens is {}; use 1 or more", options_.max_new_tokens));
  require(options_.top_k > 0, fmt::format("top_k is {}; use 1 (greedy) or more", options_.top_k));
  require(std::isfinite(options_.temperature) && options_.temperature > 0.0,
          fmt::format("temperature is {:.6g}; use a number above 0", options_.temperature));
  if (!options_.tokenizer_type.empty()) {
    tokenizers::TokenizerConfig tokenizer_config;
    tokenizer_config.tokenizer_type = options_.tokenizer_type;
    tokenizer_config.tokenizer_model = options_.tokenizer_model;
    tokenizer_config.vocab_file = options_.vocab_file;
    tokenizer_config.merge_file = options_.merge_file;
    use_tokenizer(tokenizer_config);
  }
}

void TextGenerator::use_tokenizer(const tokenizers::TokenizerConfig& tokenizer_config) {
  tokenizer_ = tokenizers::shared_tokenizer(tokenizer_config);  // the run's own, when it is the same
  if (options_.stop_at_eod) {
    try {
      eod_ = tokenizer_->eod();
    } catch (const std::logic_error& e) {
      throw std::invalid_argument(std::string("TextGenerator.stop_at_eod: ") + e.what() +
                                  "; or set stop_at_eod: false");
    }
  }
  prompt_tokens_.clear();
  for (std::size_t i = 0; i < options_.prompts.size(); ++i) {
    std::vector<int64_t> tokens = tokenizer_->encode(options_.prompts[i]);
    if (tokens.empty()) {
      throw std::invalid_argument(
          fmt::format("TextGenerator.prompts[{}] is empty; every prompt needs at least one token", i));
    }
    prompt_tokens_.push_back(std::move(tokens));
  }
}

void TextGenerator::ensure_tokenizer(const CallbackContext& ctx) {
  if (tokenizer_) return;
  // No tokenizer of its own: the run's (the config's tokenizer section), else the byte-level one.
  tokenizers::TokenizerConfig run_tokenizer;
  if (ctx.state.cfg != nullptr) run_tokenizer = ctx.state.cfg->tokenizer;
  if (run_tokenizer.tokenizer_type.empty()) run_tokenizer.tokenizer_type = "ByteLevel";
  use_tokenizer(run_tokenizer);
}

void TextGenerator::on_train_start(CallbackContext& ctx) {
  ensure_tokenizer(ctx);
  check_fits(options_, *tokenizer_, prompt_tokens_, ctx.gpt().config());
  const int64_t step = ctx.state.train_state.step;
  next_step_ = (step / options_.interval + 1) * options_.interval;
}

void TextGenerator::on_log(CallbackContext& ctx) {
  const int64_t step = ctx.log->iteration;
  if (step < next_step_) return;
  // With metric writers, wait for one of their steps so that the texts reach them (every rank decides alike).
  if (const ConfigContainer* config = ctx.state.cfg) {
    const LoggingConfig& logging = config->logging;
    const bool writers = !logging.tensorboard_dir.empty() || !logging.jsonl_path.empty();
    if (writers && step % logging.tensorboard_log_interval != 0) return;
  }
  next_step_ = (step / options_.interval + 1) * options_.interval;
  last_ = generate(ctx, step);
  for (std::size_t i = 0; i < last_.size(); ++i) {
    ctx.log->texts["text_generation/prompt_" + std::to_string(i)] = last_[i].prompt + last_[i].continuation;
    if (parallel::is_last_rank()) {
      bridge::utils::log_info_on_this_rank(fmt::format("TextGenerator (step {}) prompt {}: \"{}\" -> \"{}\"", step, i,
                                                       last_[i].prompt, last_[i].continuation));
    }
  }
}

std::vector<GeneratedText> TextGenerator::generate(CallbackContext& ctx, int64_t step) {
  models::GPTModelImpl& first = ctx.gpt(0);
  const models::GPTConfig& config = first.config();
  ensure_tokenizer(ctx);
  check_fits(options_, *tokenizer_, prompt_tokens_, config);
  const int64_t seq_length = config.seq_length;
  const auto batch = static_cast<int64_t>(prompt_tokens_.size());
  const torch::Device device = first.parameters().front().device();
  const torch::Dtype dtype = ctx.state.cfg != nullptr ? params_dtype(ctx.state.cfg->mixed_precision)
                                                      : first.parameters().front().scalar_type();
  const bool distributed = parallel::is_distributed_initialized();
  const int pipeline_size = distributed ? parallel::get_pipeline_model_parallel_world_size() : 1;

  // Each row: the prompt's last tokens (room left for the new ones), then what is generated.
  std::vector<std::vector<int64_t>> rows;
  std::vector<std::size_t> prompt_lengths;
  for (const auto& tokens : prompt_tokens_) {
    const auto keep =
        std::min<std::size_t>(tokens.size(), static_cast<std::size_t>(seq_length - options_.max_new_tokens));
    rows.emplace_back(tokens.end() - static_cast<std::ptrdiff_t>(keep), tokens.end());
    prompt_lengths.push_back(keep);
  }
  std::vector<bool> done(rows.size(), false);
  at::Generator generator =
      at::detail::createCPUGenerator(static_cast<uint64_t>(options_.seed) * 1000003ULL + static_cast<uint64_t>(step));

  std::vector<models::GPTModelImpl*> chunks;
  for (std::size_t chunk = 0; chunk < ctx.model.size(); ++chunk) chunks.push_back(&ctx.gpt(chunk));

  EvalModeGuard eval_mode(ctx.model);
  // Ids the tokenizer can decode and the model can read back: padding past either is never picked.
  const int64_t vocab = std::min(tokenizer_->vocab_size(), config.vocab_size);
  for (int64_t t = 0; t < options_.max_new_tokens; ++t) {
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    // Rows padded on the right (with id 0, which every vocabulary has): causal attention keeps the padding out of
    // each row's last position.
    torch::Tensor tokens = torch::zeros({batch, seq_length}, torch::kInt64);
    std::vector<int64_t> last_index;
    for (int64_t b = 0; b < batch; ++b) {
      const auto& row = rows[static_cast<std::size_t>(b)];
      tokens[b].slice(0, 0, static_cast<int64_t>(row.size())).copy_(torch::tensor(row, torch::kInt64));
      last_index.push_back(static_cast<int64_t>(row.size()) - 1);
    }
    // Each row's logits at its last token, [b, padded vocab] on the last stage.
    torch::Tensor logits = forward_logits(chunks, tokens, dtype, torch::tensor(last_index, torch::kInt64));
    torch::Tensor next = torch::zeros({batch}, torch::dtype(torch::kInt64).device(device));
    if (logits.defined()) {
      if (logits.size(-1) > vocab) logits.slice(-1, vocab).fill_(-std::numeric_limits<float>::infinity());
      next = pick_tokens(logits, options_, generator).to(device);
    }
    if (pipeline_size > 1) {
      parallel::ProcessGroup& pipeline = parallel::get_pipeline_model_parallel_group();
      pipeline.broadcast(next, pipeline.size() - 1);
    }
    const torch::Tensor picked = next.to(torch::kCPU);
    for (int64_t b = 0; b < batch; ++b) {
      auto& row = rows[static_cast<std::size_t>(b)];
      if (done[static_cast<std::size_t>(b)]) continue;
      const int64_t token = picked[b].item<int64_t>();
      if (options_.stop_at_eod && token == eod_) {
        done[static_cast<std::size_t>(b)] = true;
        continue;
      }
      row.push_back(token);
      if (static_cast<int64_t>(row.size()) >= seq_length) done[static_cast<std::size_t>(b)] = true;
    }
  }

  std::vector<GeneratedText> texts;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    GeneratedText text;
    text.prompt = options_.prompts[b];
    text.tokens.assign(rows[b].begin() + static_cast<std::ptrdiff_t>(prompt_lengths[b]), rows[b].end());
    text.continuation = tokenizer_->decode(text.tokens);
    texts.push_back(std::move(text));
  }
  return texts;
}

}  // namespace callbacks
}  // namespace bridge::training
