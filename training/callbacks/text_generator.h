// TextGenerator: every N steps, continues a few prompts with the model being trained and logs what it wrote, the
// quickest look at whether training is going anywhere (Composer's Generate callback, Megatron's text generation
// server reduced to what a training run needs).
//
//   TextGeneratorOptions options;
//   options.prompts = {"Once upon a time", "The capital of France is"};
//   options.interval = 500;        // at the first log step at or after every 500th step
//   options.max_new_tokens = 32;
//   options.top_k = 1;             // greedy; > 1 samples among the k likeliest, seeded
//   manager->add(std::make_shared<TextGenerator>(options));
//
// Each continuation goes to the log of the last rank and to the metric writers as the text
// "text_generation/prompt_<i>" (TensorBoard's text tab, a string in JSON Lines). Generation runs the model forward
// without gradients through the pipeline schedule, once per new token over the whole sequence (no KV cache), so it
// works in every layout (TP, PP, a virtual pipeline, DP); every rank takes part, and all reach the same tokens: the
// last stage gathers the vocab-parallel logits, picks each token with the same seeded generator on every tensor
// rank, and broadcasts it along the pipeline. Prompts are encoded by the run's tokenizer (the config's tokenizer
// section, the one the data was prepared with; the byte-level one when there is none) unless tokenizer_type names
// another; a prompt longer than model.seq_length - max_new_tokens keeps its last tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "training/callbacks/callback.h"
#include "training/tokenizers/build_tokenizer.h"
#include "training/tokenizers/tokenizer.h"

namespace bridge::training {
inline namespace callbacks {

struct TextGeneratorOptions {
  std::vector<std::string> prompts;  ///< at least one, none empty
  int64_t interval = 1000;           ///< steps between generations (> 0)
  int64_t max_new_tokens = 32;       ///< tokens added to each prompt (> 0, < model.seq_length)
  int64_t top_k = 1;                 ///< 1 = greedy; k > 1 samples among the k likeliest tokens
  double temperature = 1.0;          ///< logits are divided by it before sampling (> 0)
  int64_t seed = 1234;               ///< sampling seed, combined with the step
  bool stop_at_eod = true;           ///< end a continuation at the end-of-document token
  /// A type of training/tokenizers/build_tokenizer.h; empty = the run's tokenizer (config.tokenizer), else ByteLevel.
  std::string tokenizer_type;
  std::string tokenizer_model;  ///< HuggingFaceTokenizer's directory, SentencePiece's tokenizer.model
  std::string vocab_file;       ///< GPT2BPETokenizer's vocab.json
  std::string merge_file;       ///< GPT2BPETokenizer's merges.txt
};

/// A prompt and what the model wrote after it.
struct GeneratedText {
  std::string prompt;
  std::string continuation;
  std::vector<int64_t> tokens;  ///< the continuation's token ids
};

class TextGenerator : public Callback {
 public:
  /// Checks the options; with a tokenizer_type, loads it and encodes the prompts. Throws std::invalid_argument naming
  /// the option when one is out of range, and what build_tokenizer throws for the tokenizer files.
  explicit TextGenerator(TextGeneratorOptions options);

  /// Loads the run's tokenizer when the options name none, then checks the prompts and token counts against the
  /// model (vocabulary and sequence length).
  void on_train_start(CallbackContext& ctx) override;
  /// Generates when due and adds the texts to the log record.
  void on_log(CallbackContext& ctx) override;

  /// Continues every prompt with the model in `ctx` (all ranks must call it together); `step` seeds the sampling.
  /// The result is the same on every rank.
  std::vector<GeneratedText> generate(CallbackContext& ctx, int64_t step);

  /// The texts of the last generation (empty before the first).
  const std::vector<GeneratedText>& last() const { return last_; }

 private:
  void use_tokenizer(const tokenizers::TokenizerConfig& tokenizer_config);
  void ensure_tokenizer(const CallbackContext& ctx);

  TextGeneratorOptions options_;
  std::shared_ptr<const tokenizers::Tokenizer> tokenizer_;
  int64_t eod_ = -1;  // the tokenizer's end of document, when stop_at_eod
  std::vector<std::vector<int64_t>> prompt_tokens_;
  int64_t next_step_ = 0;
  std::vector<GeneratedText> last_;
};

}  // namespace callbacks
}  // namespace bridge::training
