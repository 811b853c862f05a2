// bridge-preprocess-data: turns text into a Megatron indexed dataset (.bin/.idx) that bridge-pretrain and
// Megatron-LM both read, with the flags of Megatron-LM's tools/preprocess_data.py.
//
//   bridge-preprocess-data --input corpus.jsonl --output-prefix data/corpus --append-eod
//       -> data/corpus_text_document.bin and .idx, byte-level tokens
//   bridge-preprocess-data --input book.txt --input-format text --output-prefix data/book
//       --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod
//   bridge-preprocess-data --input corpus.jsonl --output-prefix data/llama3 --append-eod
//       --tokenizer-type HuggingFaceTokenizer --tokenizer-model checkpoints/llama3   (its tokenizer.json)
//   bridge-preprocess-data --input wiki.jsonl --json-keys text title --split-sentences --workers 8 --partitions 2 ...
//       -> ..._text_sentence.bin/.idx and ..._title_sentence.bin/.idx, on 8 threads
//
// Exit status: 0 written, 1 bad input (the --input file) or an I/O failure, 2 bad command line (also a tokenizer type
// or tokenizer files that are missing or not what their flag names).
#include "training/datasets/preprocess_data.h"

#include <cstdio>
#include <cxxopts.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace bridge::training::datasets;

constexpr int kExitBadInput = 1;
constexpr int kExitBadCommandLine = 2;

// --tokenizer-type's help: the table of types (training/tokenizers/build_tokenizer.cpp).
std::string tokenizer_types_help() {
  std::string help;
  for (const auto& type : bridge::training::tokenizers::tokenizer_types()) {
    help += (help.empty() ? "" : "; ") + type.name + ": " + type.description;
  }
  return help;
}

cxxopts::Options make_options() {
  cxxopts::Options options("bridge-preprocess-data",
                           "Tokenizes text or JSON lines into a Megatron indexed dataset (.bin/.idx), one document "
                           "per JSON line or text paragraph, as Megatron-LM's tools/preprocess_data.py does.");
  options.custom_help("--input FILE --output-prefix PREFIX [options]");
  // clang-format off
  options.add_options()
      ("input", "input file: JSON lines (one JSON object per line) or, with --input-format text, plain UTF-8 text",
       cxxopts::value<std::string>(), "FILE")
      ("input-format", "json: each non-blank line is a JSON object whose --json-keys fields hold a document's text "
       "(a string, or a list of strings that become the document's sequences); text: each paragraph (lines "
       "separated by one or more blank lines) is one document, its lines joined by newlines",
       cxxopts::value<std::string>()->default_value("json"), "json|text")
      ("output-prefix", "path prefix of the output: writes PREFIX_KEY_document.bin and .idx for each JSON key (KEY "
       "is 'text' for --input-format text); its folder is made if missing", cxxopts::value<std::string>(), "PREFIX")
      ("json-keys", "JSON fields to tokenize, one dataset each: space-separated as Megatron's (--json-keys text "
       "title), or comma-separated", cxxopts::value<std::vector<std::string>>()->default_value("text"), "KEY...")
      ("split-sentences", "split each text into sentences, one sequence each (outputs end in _sentence); by a fixed "
       "rule, not NLTK's Punkt: after . ! or ? followed by space and a non-lowercase letter, except after "
       "abbreviations (training/datasets/sentence_splitter.h)")
      ("keep-newlines", "with --split-sentences: keep the whitespace and newlines after a sentence on it")
      ("lang", "the language of --split-sentences; only english", cxxopts::value<std::string>()->default_value(
       "english"), "LANG")
      ("tokenizer-type", tokenizer_types_help(), cxxopts::value<std::string>()->default_value("ByteLevel"), "TYPE")
      ("tokenizer-model", "HuggingFaceTokenizer: a model directory with tokenizer.json (and tokenizer_config.json "
       "naming its BOS/EOS), or the tokenizer.json file; SentencePieceTokenizer, GPTSentencePieceTokenizer, "
       "Llama2Tokenizer: the tokenizer.model file", cxxopts::value<std::string>(), "PATH")
      ("vocab-file", "GPT-2 vocabulary (vocab.json / encoder.json: token -> id), for GPT2BPETokenizer",
       cxxopts::value<std::string>(), "FILE")
      ("merge-file", "GPT-2 merges (merges.txt / vocab.bpe: one 'a b' pair per line), for GPT2BPETokenizer",
       cxxopts::value<std::string>(), "FILE")
      ("vocab-size", "NullTokenizer: the number of ids", cxxopts::value<int64_t>(), "N")
      ("null-tokenizer-eod-id", "NullTokenizer: the end-of-document id (default: vocab size - 1)",
       cxxopts::value<int64_t>(), "ID")
      ("append-eod", "append the tokenizer's end-of-document id to every non-empty document, so GPT samples that "
       "span documents see where one ends")
      ("log-interval", "report progress every this many documents (0: never)",
       cxxopts::value<int64_t>()->default_value("1000"), "N")
      ("workers", "threads that tokenize; the output is the same for any number",
       cxxopts::value<int>()->default_value("1"), "N")
      ("partitions", "deal the documents round-robin to this many partitions and write their outputs one after "
       "another, as Megatron's merged partitions (a divisor of --workers)",
       cxxopts::value<int>()->default_value("1"), "N")
      ("keep-sequential-samples", "partitions of consecutive documents instead: the output is the one-partition "
       "output")
      ("h,help", "print this help and exit");
  // clang-format on
  return options;
}

std::string help_text(cxxopts::Options& options) {
  return options.help() + R"(
Output:
  Tokens are stored as uint16 when the vocabulary has fewer than 65500 ids, else int32 (Megatron's optimal_dtype).
  Each document is one sequence (a JSON list of strings: one sequence per non-empty string; with --split-sentences,
  one per sentence); an empty document is kept as a document without sequences, as Megatron does. Files appear
  only when complete.

Errors name the input file and line. Examples:
  bridge-preprocess-data --input corpus.jsonl --output-prefix data/corpus --append-eod
  bridge-preprocess-data --input book.txt --input-format text --output-prefix data/book --append-eod
  bridge-preprocess-data --input corpus.jsonl --output-prefix data/llama3 --append-eod \
      --tokenizer-type HuggingFaceTokenizer --tokenizer-model checkpoints/llama3
)";
}

// Megatron's --json-keys takes several values (argparse nargs='+'): `--json-keys text title` becomes
// `--json-keys text,title` for cxxopts.
std::vector<std::string> join_json_keys(int argc, char** argv) {
  std::vector<std::string> arguments;
  for (int i = 0; i < argc; ++i) {
    arguments.emplace_back(argv[i]);
    if (arguments.back() != "--json-keys") continue;
    std::string keys;
    while (i + 1 < argc && argv[i + 1][0] != '-') {
      if (!keys.empty()) keys += ',';
      keys += argv[++i];
    }
    if (!keys.empty()) arguments.push_back(keys);
  }
  return arguments;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options = make_options();
  PreprocessConfig config;
  try {
    std::vector<std::string> arguments = join_json_keys(argc, argv);
    std::vector<char*> pointers;
    for (std::string& argument : arguments) pointers.push_back(argument.data());
    const cxxopts::ParseResult args = options.parse(static_cast<int>(pointers.size()), pointers.data());
    if (args.count("help")) {
      std::printf("%s", help_text(options).c_str());
      return 0;
    }
    if (!args.unmatched().empty()) {
      throw std::invalid_argument("unexpected argument '" + args.unmatched().front() + "'");
    }
    for (const char* required : {"input", "output-prefix"}) {
      if (!args.count(required)) throw std::invalid_argument(std::string("--") + required + " is required");
    }
    config.input = args["input"].as<std::string>();
    config.output_prefix = args["output-prefix"].as<std::string>();
    const std::string format = args["input-format"].as<std::string>();
    if (format != "json" && format != "text") {
      throw std::invalid_argument("--input-format must be json or text, got '" + format + "'");
    }
    config.input_format = format == "json" ? InputFormat::kJsonLines : InputFormat::kText;
    config.json_keys = args["json-keys"].as<std::vector<std::string>>();
    if (config.input_format == InputFormat::kText && args.count("json-keys")) {
      throw std::invalid_argument("--json-keys applies to --input-format json only");
    }
    if (config.json_keys.empty()) throw std::invalid_argument("--json-keys names no field");
    bridge::training::tokenizers::TokenizerConfig& tokenizer = config.tokenizer;
    tokenizer.tokenizer_type = args["tokenizer-type"].as<std::string>();
    if (args.count("tokenizer-model")) tokenizer.tokenizer_model = args["tokenizer-model"].as<std::string>();
    if (args.count("vocab-file")) tokenizer.vocab_file = args["vocab-file"].as<std::string>();
    if (args.count("merge-file")) tokenizer.merge_file = args["merge-file"].as<std::string>();
    if (args.count("vocab-size")) tokenizer.vocab_size = args["vocab-size"].as<int64_t>();
    if (args.count("null-tokenizer-eod-id"))
      tokenizer.null_tokenizer_eod_id = args["null-tokenizer-eod-id"].as<int64_t>();
    bridge::training::tokenizers::validate_tokenizer_config(tokenizer, "--");
    config.append_eod = args.count("append-eod") > 0;
    config.log_interval = args["log-interval"].as<int64_t>();
    if (config.log_interval < 0) throw std::invalid_argument("--log-interval must be >= 0");
    config.split_sentences = args.count("split-sentences") > 0;
    config.keep_newlines = args.count("keep-newlines") > 0;
    if (args["lang"].as<std::string>() != "english") {
      throw std::invalid_argument("--lang: only english sentences are split, got '" + args["lang"].as<std::string>() +
                                  "'");
    }
    config.workers = args["workers"].as<int>();
    config.partitions = args["partitions"].as<int>();
    config.keep_sequential_samples = args.count("keep-sequential-samples") > 0;
    if (config.workers < 1 || config.partitions < 1) {
      throw std::invalid_argument("--workers and --partitions must be >= 1");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-preprocess-data: error: %s\nRun bridge-preprocess-data --help for the options.\n",
                 e.what());
    return kExitBadCommandLine;
  }
  try {
    for (const PreprocessedDataset& dataset : preprocess_data(config)) {
      std::printf("bridge-preprocess-data: wrote %s.bin/.idx: %lld documents, %lld tokens\n",
                  dataset.path_prefix.c_str(), static_cast<long long>(dataset.documents),
                  static_cast<long long>(dataset.tokens));
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bridge-preprocess-data: error: %s\n", e.what());
    return kExitBadCommandLine;  // the tokenizer type, its files' flags or the files they name
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-preprocess-data: error: %s\n", e.what());
    return kExitBadInput;
  }
  return 0;
}
