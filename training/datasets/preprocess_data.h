// Text to Megatron indexed datasets, the work behind bridge-preprocess-data (Megatron-LM's tools/preprocess_data.py):
// JSON lines (one document per line, from chosen fields) or text paragraphs, tokenized and written with
// IndexedDatasetBuilder as <output_prefix>_<key>_document.bin/.idx (_sentence.bin/.idx with sentences split).
//
//   PreprocessConfig config;
//   config.input = "corpus.jsonl";
//   config.output_prefix = "data/corpus";
//   config.append_eod = true;
//   preprocess_data(config);  // data/corpus_text_document.bin/.idx
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "training/tokenizers/build_tokenizer.h"

namespace bridge::training::datasets {

enum class InputFormat {
  kJsonLines,  ///< each non-blank line a JSON object; each json_keys field a string or a list of strings
  kText,       ///< each paragraph (lines between blank lines) one document, its lines joined by '\n'
};

struct PreprocessConfig {
  std::string input;
  InputFormat input_format = InputFormat::kJsonLines;
  /// Outputs are <output_prefix>_<key>_document.bin/.idx, key "text" for text input (_sentence: split_sentences).
  /// Its folder is made if missing.
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};
  /// The tokenizer (training/tokenizers/build_tokenizer.h): Megatron's --tokenizer-type and its files.
  tokenizers::TokenizerConfig tokenizer = tokenizers::tokenizer_config_of("ByteLevel");
  /// Append the tokenizer's EOD to every non-empty document.
  bool append_eod = false;
  /// Report progress on stderr every this many documents; 0 = never.
  int64_t log_interval = 0;
  /// Split each text into sentences (training/datasets/sentence_splitter.h), one sequence each; the outputs are
  /// then <output_prefix>_<key>_sentence.bin/.idx.
  bool split_sentences = false;
  /// With split_sentences: the whitespace after a sentence stays on it (Megatron's --keep-newlines).
  bool keep_newlines = false;
  /// Threads that tokenize; the output is the same for any number.
  int workers = 1;
  /// Megatron's --partitions: the documents are dealt round-robin to this many partitions, whose outputs follow each
  /// other (what Megatron's merge of the partition files writes). A multiple of it must be `workers`.
  int partitions = 1;
  /// Contiguous partitions instead (Megatron's --keep-sequential-samples): the output is the one-partition output.
  bool keep_sequential_samples = false;
};

/// What one output dataset received.
struct PreprocessedDataset {
  std::string path_prefix;
  int64_t documents = 0;
  int64_t tokens = 0;
};

/// Tokenizes `config.input` into one dataset per key. Bad input throws std::runtime_error starting with
/// "<input>:<line>: "; a bad tokenizer choice throws std::invalid_argument. Nothing is written unless all of the
/// input is good (the builders' files appear only at the end).
std::vector<PreprocessedDataset> preprocess_data(const PreprocessConfig& config);

}  // namespace bridge::training::datasets
