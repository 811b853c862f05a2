// Hugging Face tokenizer.json and SentencePiece models against the libraries themselves: tokenizers and
// sentencepiece (the tests' venv) train small tokenizers shaped like Llama-3's, Qwen2's, Llama-2's, Mistral's and
// rarer pipelines (tests/tools/tokenizer_references.py), save them, and encode and decode a few thousand lines of hard
// text; bridge must give every id and every decoded string they give. Then the errors: what bridge does not implement
// is refused with the JSON path, never approximated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "training/callbacks.h"
#include "training/datasets/indexed_dataset.h"
#include "training/datasets/preprocess_data.h"
#include "training/forward_step.h"
#include "training/pretrain.h"
#include "training/tokenizers/build_tokenizer.h"
#include "training/tokenizers/huggingface_tokenizer.h"
#include "training/tokenizers/sentencepiece_tokenizer.h"
#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// The reference files, made once by the first test that needs them and kept in the build directory under the
// script's digest (BRIDGE_TOKENIZER_REFERENCES), so that editing the script makes them again.
const fs::path& references() {
  static const fs::path directory = [] {
    const fs::path dir = BRIDGE_TOKENIZER_REFERENCES;
    if (!fs::exists(dir / "hard_text.json")) {
      const std::string command = std::string(BRIDGE_TOOLS_PYTHON) + " " + BRIDGE_TOKENIZER_REFERENCES_SCRIPT +
                                  " make " + dir.string() + " 2>&1";
      if (std::system(command.c_str()) != 0) {
        throw std::runtime_error(command +
                                 " failed (scripts/install_deps.sh installs tokenizers and sentencepiece in "
                                 ".venv)");
      }
    }
    return dir;
  }();
  return directory;
}

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + file.string());
  return nlohmann::json::parse(in);
}

const std::vector<std::string>& hard_text() {
  static const std::vector<std::string> lines =
      read_json(references() / "hard_text.json").get<std::vector<std::string>>();
  return lines;
}

std::string quoted(const std::string& text) { return nlohmann::json(text).dump(); }

// Compares ids line by line; reports the first few differences with their text.
void expect_same_ids(const std::string& what, const std::vector<std::vector<int64_t>>& expected,
                     const std::function<std::vector<int64_t>(const std::string&)>& encode) {
  const auto& lines = hard_text();
  ASSERT_EQ(expected.size(), lines.size());
  int reported = 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::vector<int64_t> got = encode(lines[i]);
    if (got == expected[i]) continue;
    ++differing;
    if (reported++ < 3) {
      ADD_FAILURE() << what << ": line " << i << " " << quoted(lines[i])
                    << "\n  library: " << nlohmann::json(expected[i]).dump()
                    << "\n  bridge:  " << nlohmann::json(got).dump();
    }
  }
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << lines.size() << " lines differ";
}

void expect_same_decoding(const std::string& what, const std::vector<std::vector<int64_t>>& ids,
                          const std::vector<std::string>& expected, const Tokenizer& tokenizer) {
  ASSERT_EQ(ids.size(), expected.size());
  std::size_t differing = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string got = tokenizer.decode(ids[i]);
    if (got == expected[i]) continue;
    if (differing++ < 3) {
      ADD_FAILURE() << what << ": decoding line " << i << "\n  library: " << quoted(expected[i])
                    << "\n  bridge:  " << quoted(got);
    }
  }
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " decodings differ";
}

class HuggingFaceReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HuggingFaceReference, IdsAndDecodingEqualTheLibrarys) {
  const fs::path dir = references() / GetParam();
  const nlohmann::json expected = read_json(dir / "expected.json");
  const HuggingFaceTokenizer tokenizer(dir.string());
  EXPECT_EQ(tokenizer.vocab_size(), expected["vocab_size"].get<int64_t>());
  const auto ids = expected["ids"].get<std::vector<std::vector<int64_t>>>();
  expect_same_ids(GetParam(), ids, [&](const std::string& line) { return tokenizer.encode(line, false); });
  expect_same_ids(GetParam() + " with special tokens",
                  expected["ids_with_special_tokens"].get<std::vector<std::vector<int64_t>>>(),
                  [&](const std::string& line) { return tokenizer.encode(line); });
  expect_same_decoding(GetParam(), ids, expected["decoded"].get<std::vector<std::string>>(), tokenizer);
}

INSTANTIATE_TEST_SUITE_P(Families, HuggingFaceReference,
                         ::testing::Values("llama3", "qwen2", "llama2", "mistral", "exotic", "roberta", "quicktour",
                                           "words"));

class SentencePieceReference : public ::testing::TestWithParam<std::string> {};

// A build against a LibTorch that links libprotobuf leaves SentencePiece out (training/tokenizers/CMakeLists.txt).
#define SKIP_WITHOUT_SENTENCEPIECE()                                                                    \
  if (!BRIDGE_WITH_SENTENCEPIECE) {                                                                     \
    GTEST_SKIP() << "built without SentencePiece: this LibTorch links libprotobuf, which clashes with " \
                    "libsentencepiece's own";                                                           \
  }                                                                                                     \
  static_assert(true)

TEST_P(SentencePieceReference, IdsAndDecodingEqualTheLibrarys) {
  SKIP_WITHOUT_SENTENCEPIECE();
  const fs::path dir = references() / GetParam();
  const nlohmann::json expected = read_json(dir / "expected.json");
  const SentencePieceTokenizer tokenizer((dir / "tokenizer.model").string());
  EXPECT_EQ(tokenizer.vocab_size(), expected["vocab_size"].get<int64_t>());
  EXPECT_EQ(tokenizer.eod(), expected["eos"].get<int64_t>());
  EXPECT_EQ(tokenizer.bos(), std::optional<int64_t>(expected["bos"].get<int64_t>()));
  const auto ids = expected["ids"].get<std::vector<std::vector<int64_t>>>();
  expect_same_ids(GetParam(), ids, [&](const std::string& line) { return tokenizer.encode(line); });
  expect_same_decoding(GetParam(), ids, expected["decoded"].get<std::vector<std::string>>(), tokenizer);
}

INSTANTIATE_TEST_SUITE_P(Models, SentencePieceReference,
                         ::testing::Values("sp_unigram", "sp_bpe", "sp_llama2", "sp_identity"));

// spm_train's defaults keep words apart (also with the identity rule), so bridge encodes and caches them one by one;
// Llama-2's settings keep whitespace runs (and pieces of them), so its texts go to the library whole. The ids above
// are the library's either way.
TEST(SentencePieceTokenizer, EncodesWordByWordOnlyWhereTheModelKeepsWordsApart) {
  SKIP_WITHOUT_SENTENCEPIECE();
  using Words = SentencePieceTokenizer::Words;
  const auto words = [](const char* name) {
    return SentencePieceTokenizer((references() / name / "tokenizer.model").string()).words();
  };
  EXPECT_EQ(words("sp_unigram"), Words::kFolded);
  EXPECT_EQ(words("sp_bpe"), Words::kFolded);
  EXPECT_EQ(words("sp_identity"), Words::kFolded);
  EXPECT_EQ(words("sp_llama2"), Words::kKept);  // whitespace runs kept, and pieces of them
}

// A text's words missing from the cache go to the library in one call, and come back with each word's own ids: the
// text's ids equal the library's on the whole text (the reference), and the words, now cached, take no call.
TEST(SentencePieceTokenizer, ATextsMissingWordsTakeOneLibraryCall) {
  SKIP_WITHOUT_SENTENCEPIECE();
  const nlohmann::json lines = read_json(references() / "hard_text.json");
  for (const char* name : {"sp_bpe", "sp_llama2"}) {
    const nlohmann::json ids = read_json(references() / name / "expected.json")["ids"];
    // Lines of ASCII words apart, which both kinds of model batch: "x  y   z ", "1 2  3 ", ...
    int checked = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string line = lines[i];
      const bool ascii_words = line.find(' ') != std::string::npos &&
                               line.find_first_not_of(' ') != std::string::npos &&
                               std::all_of(line.begin(), line.end(), [](char c) { return c >= ' ' && c < 0x7f; });
      if (!ascii_words) continue;
      const SentencePieceTokenizer fresh((references() / name / "tokenizer.model").string());
      EXPECT_EQ(fresh.encode(line), ids[i].get<std::vector<int64_t>>()) << name << " line " << i << ": " << line;
      EXPECT_EQ(fresh.library_calls(), 1) << name << " line " << i << ": " << line;
      fresh.encode(line);
      EXPECT_EQ(fresh.library_calls(), 1) << name << " line " << i << " again";
      ++checked;
    }
    EXPECT_GE(checked, 5) << name;
  }
}

TEST(HuggingFaceTokenizer, BosAndEosComeFromTokenizerConfig) {
  const HuggingFaceTokenizer llama3((references() / "llama3").string());
  const HuggingFaceTokenizer qwen2((references() / "qwen2" / "tokenizer.json").string());  // the file itself
  ASSERT_TRUE(llama3.bos().has_value());
  EXPECT_EQ(llama3.encode("hi").front(), *llama3.bos());  // Megatron's tokenize adds the BOS
  EXPECT_EQ(llama3.decode({llama3.eod()}), "<|end_of_text|>");
  EXPECT_FALSE(qwen2.bos().has_value());
  EXPECT_EQ(qwen2.decode({qwen2.eod()}), "<|endoftext|>");
  EXPECT_EQ(qwen2.encode("hi"), qwen2.encode("hi", false));  // no post-processor special tokens
}

TEST(HuggingFaceTokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  const HuggingFaceTokenizer tokenizer((references() / "llama3").string());
  EXPECT_THAT([&] { tokenizer.encode("ok \xC3\x28"); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("not valid UTF-8 at byte 3")));
  EXPECT_THROW(tokenizer.decode({tokenizer.vocab_size()}), std::out_of_range);
}

// A copy of a reference tokenizer.json with one edit, in a scratch directory.
class EditedTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("bridge_hf_tokenizer_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json root = read_json(references() / "llama3" / "tokenizer.json");
    edit(root);
    std::ofstream(dir_ / "tokenizer.json") << root.dump();
    return dir_.string();
  }
  std::string error(const std::function<void(nlohmann::json&)>& edit) {
    try {
      HuggingFaceTokenizer tokenizer(write(edit));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(EditedTokenizer, WhatBridgeDoesNotImplementIsRefusedWithItsJsonPath) {
  EXPECT_THAT(error([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Punctuation"; }),
              HasSubstr("pre_tokenizer.pretokenizers[1].type: the pre-tokenizer \"Punctuation\" is not implemented"));
  EXPECT_THAT(error([](auto& j) {
                j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AA=="}};
              }),
              HasSubstr("normalizer.type: the normalizer \"Precompiled\" is not implemented"));
  EXPECT_THAT(error([](auto& j) { j["model"]["type"] = "Unigram"; }), HasSubstr("model.type"));
  EXPECT_THAT(error([](auto& j) { j["model"]["dropout"] = 0.1; }), HasSubstr("model.dropout"));
  EXPECT_THAT(error([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}"; }),
              HasSubstr("pre_tokenizer.pretokenizers[0].pattern: the pattern does not compile"));
  EXPECT_THAT(error([](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Merged"; }),
              HasSubstr("pre_tokenizer.pretokenizers[0].behavior"));
  EXPECT_THAT(error([](auto& j) { j["decoder"]["frobnicate"] = true; }), HasSubstr("decoder.frobnicate"));
  EXPECT_THAT(error([](auto& j) { j["model"]["merges"][0] = {"e", "not-a-token"}; }), HasSubstr("model.merges[0]"));
  EXPECT_THAT(error([](auto& j) { j["truncation"] = {{"max_length", 8}}; }), HasSubstr("truncation"));
}

// A model's config.json given for its tokenizer (an easy slip: both sit in the model's directory) is named as what
// it is, with the fix, not as an option of tokenizer.json that bridge lacks.
TEST_F(EditedTokenizer, AModelsConfigJsonIsNamedAsSuchWithTheFix) {
  std::ofstream(dir_ / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})";
  const auto error_of = [](const fs::path& path) {
    try {
      HuggingFaceTokenizer tokenizer(path.string());
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string alone = error_of(dir_ / "config.json");
  EXPECT_THAT(alone, HasSubstr((dir_ / "config.json").string() + " is not a tokenizer.json"));
  EXPECT_THAT(alone, HasSubstr("a model's config.json"));
  EXPECT_THAT(alone, HasSubstr("--tokenizer-model"));
  EXPECT_THAT(alone, ::testing::Not(HasSubstr("does not implement")));
  write([](nlohmann::json&) {});  // now with a tokenizer.json beside it: that file is the fix
  EXPECT_THAT(error_of(dir_ / "config.json"), HasSubstr("or its tokenizer file " + (dir_ / "tokenizer.json").string()));
}

// The tokenizers quicktour's tokenizer, as a user makes it, all the way to training data: it loads (its Whitespace
// pre-tokenizer gives the library's ids on the hard text: HuggingFaceReference/quicktour), has no end-of-document
// token until transformers' files name one (the error says how), and with one, bridge-preprocess-data's code writes
// into a folder that does not exist yet what Megatron's preprocess_data.py writes through AutoTokenizer.
TEST_F(EditedTokenizer, OwnTokenizerFromTheQuicktourToTrainingData) {
  {
    std::ofstream text(dir_ / "corpus.txt");
    std::ofstream documents(dir_ / "corpus.jsonl");
    for (std::size_t i = 0; i < hard_text().size(); ++i) {
      text << hard_text()[i] << "\n";
      if (i < 300) documents << nlohmann::json{{"text", hard_text()[i]}}.dump() << "\n";
    }
  }
  const fs::path script = fs::path(BRIDGE_TOKENIZER_REFERENCES_SCRIPT).parent_path() / "own_tokenizer.py";
  const std::string command = std::string(BRIDGE_TOOLS_PYTHON) + " " + script.string() + " " + dir_.string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  // As the quicktour saved it: it loads, and --append-eod asks for an eos_token, showing both ways to name one.
  datasets::PreprocessConfig config;
  config.input = (dir_ / "corpus.jsonl").string();
  config.output_prefix = (dir_ / "data" / "mine" / "corpus").string();
  config.append_eod = true;
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  config.tokenizer.tokenizer_model = (dir_ / "tokenizer.json").string();
  try {
    datasets::preprocess_data(config);
    ADD_FAILURE() << "--append-eod without an eos_token";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("--append-eod: "));
    EXPECT_THAT(e.what(), HasSubstr("{\"eos_token\": \"[SEP]\"}"));
    EXPECT_THAT(e.what(), HasSubstr("its special tokens: [UNK], [CLS], [SEP], [PAD], [MASK]"));
    EXPECT_THAT(e.what(), HasSubstr("PreTrainedTokenizerFast(tokenizer_file="));
  }
  EXPECT_FALSE(fs::exists(dir_ / "data")) << "a failed start made the output folder";
  // Under another file name, the command to copy names that file and its folder (not tokenizer.json, not "").
  fs::create_directories(dir_ / "renamed");
  fs::copy_file(dir_ / "tokenizer.json", dir_ / "renamed" / "quicktour.json");
  try {
    HuggingFaceTokenizer((dir_ / "renamed" / "quicktour.json").string()).eod();
    ADD_FAILURE() << "an end-of-document id without an eos_token";
  } catch (const std::logic_error& e) {
    const fs::path renamed = fs::absolute(dir_ / "renamed");
    EXPECT_THAT(e.what(), HasSubstr("tokenizer_file=\"" + (renamed / "quicktour.json").string() + "\""));
    EXPECT_THAT(e.what(), HasSubstr(".save_pretrained(\"" + renamed.string() + "\")"));
  }

  // Named by hand, one of its own tokens.
  fs::create_directories(dir_ / "by_hand");
  fs::copy_file(dir_ / "tokenizer.json", dir_ / "by_hand" / "tokenizer.json");
  std::ofstream(dir_ / "by_hand" / "tokenizer_config.json") << R"({"eos_token": "[SEP]"})";
  const HuggingFaceTokenizer by_hand((dir_ / "by_hand").string());
  EXPECT_EQ(by_hand.decode({by_hand.eod()}), "[SEP]");

  // Named by transformers, a new token: the whole journey against the library.
  const nlohmann::json expected = read_json(dir_ / "expected.json");
  config.tokenizer.tokenizer_model = (dir_ / "mine").string();
  const HuggingFaceTokenizer mine(config.tokenizer.tokenizer_model);
  EXPECT_EQ(mine.vocab_size(), expected["vocab_size"].get<int64_t>());
  EXPECT_EQ(mine.eod(), expected["eos"].get<int64_t>());
  const auto written = datasets::preprocess_data(config);
  ASSERT_EQ(written.size(), 1u);
  const auto documents = expected["documents"].get<std::vector<std::vector<int64_t>>>();
  ASSERT_EQ(documents.size(), 300u);
  EXPECT_EQ(written[0].documents, 300);
  // A document of whitespace alone has no ids, and so no sequence (Megatron writes none either).
  const datasets::IndexedDataset dataset((dir_ / "data" / "mine" / "corpus_text_document").string());
  int64_t sequence = 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < documents.size(); ++i) {
    if (documents[i].empty()) continue;
    ASSERT_LT(sequence, dataset.size());
    const std::vector<int64_t> got = dataset.get(sequence++);
    if (got == documents[i]) continue;
    if (differing++ < 3) {
      ADD_FAILURE() << "document " << i << " " << quoted(hard_text()[i])
                    << "\n  library: " << nlohmann::json(documents[i]).dump()
                    << "\n  bridge:  " << nlohmann::json(got).dump();
    }
  }
  EXPECT_EQ(sequence, dataset.size());
  EXPECT_EQ(differing, 0u);
}

TEST_F(EditedTokenizer, MergesWrittenAsStringsReadAsPairs) {
  // Files from tokenizers before 0.20 write "a b" merges; the same ids must come out.
  const HuggingFaceTokenizer pairs((references() / "llama3").string());
  const HuggingFaceTokenizer strings(write([](nlohmann::json& j) {
    for (auto& merge : j["model"]["merges"]) merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  }));
  for (const std::string line : {"Hello world, it's 2024!", "naïve café 😀", "  spaced\n\nout  "}) {
    EXPECT_EQ(strings.encode(line), pairs.encode(line)) << line;
  }
}

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// bridge-preprocess-data's files against Megatron's preprocess_data.py loop with Megatron-Core's tokenizers
// (tests/tools/megatron_preprocess.py: transformers' AutoTokenizer, sentencepiece), byte for byte.
class PreprocessWithTokenizer : public EditedTokenizer,
                                public ::testing::WithParamInterface<std::pair<std::string, std::string>> {};

TEST_P(PreprocessWithTokenizer, WritesWhatMegatronWrites) {
  const auto& [type, model] = GetParam();
  if (type != "HuggingFaceTokenizer") {
    SKIP_WITHOUT_SENTENCEPIECE();
  }
  const fs::path model_path = references() / model;
  const fs::path input = dir_ / "corpus.jsonl";
  {
    std::ofstream out(input);
    for (std::size_t i = 0; i < 400; ++i) out << nlohmann::json{{"text", hard_text()[i]}}.dump() << "\n";
    out << nlohmann::json{{"text", ""}}.dump() << "\n";  // an empty document: [BOS] for some, nothing for others
  }
  const std::string command = std::string(BRIDGE_TOOLS_PYTHON) + " " + BRIDGE_MEGATRON_PREPROCESS + " " +
                              input.string() + " " + (dir_ / "megatron").string() + " " + type + " " +
                              model_path.string() + " --append-eod 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  datasets::PreprocessConfig config;
  config.input = input.string();
  config.output_prefix = (dir_ / "bridge").string();
  config.append_eod = true;
  config.tokenizer.tokenizer_type = type;
  config.tokenizer.tokenizer_model = model_path.string();
  config.workers = 2;
  const auto written = datasets::preprocess_data(config);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].documents, 401);
  for (const char* extension : {".bin", ".idx"}) {
    const std::string megatron = file_bytes(dir_ / (std::string("megatron_text_document") + extension));
    ASSERT_FALSE(megatron.empty());
    EXPECT_TRUE(file_bytes(dir_ / (std::string("bridge_text_document") + extension)) == megatron)
        << type << " " << model << ": the " << extension << " files differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, PreprocessWithTokenizer,
                         ::testing::Values(std::make_pair("HuggingFaceTokenizer", "llama3"),
                                           std::make_pair("HuggingFaceTokenizer", "qwen2"),
                                           std::make_pair("HuggingFaceTokenizer", "mistral"),
                                           std::make_pair("SentencePieceTokenizer", "sp_bpe/tokenizer.model"),
                                           std::make_pair("Llama2Tokenizer", "sp_unigram/tokenizer.model")),
                         [](const auto& p) { return p.param.first + "_" + std::to_string(p.index); });

// What bridge-preprocess-data wrote with a tokenizer.json trains with that tokenizer as the run's: the model's
// vocabulary and the EOD id come from it, and the TextGenerator writes through it.
TEST_F(EditedTokenizer, DataItWroteTrainsWithItAsTheRunsTokenizer) {
  const std::string model_dir = (references() / "llama3").string();
  const HuggingFaceTokenizer tokenizer(model_dir);
  const fs::path input = dir_ / "corpus.jsonl";
  {
    std::ofstream out(input);
    for (std::size_t i = 0; i < 300; ++i) out << nlohmann::json{{"text", hard_text()[i]}}.dump() << "\n";
  }
  datasets::PreprocessConfig prepare;
  prepare.input = input.string();
  prepare.output_prefix = (dir_ / "corpus").string();
  prepare.append_eod = true;
  prepare.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  prepare.tokenizer.tokenizer_model = model_dir;
  ASSERT_EQ(datasets::preprocess_data(prepare).size(), 1u);

  ConfigContainer config;
  config.model.num_layers = 2;
  config.model.hidden_size = 32;
  config.model.num_attention_heads = 4;
  config.model.seq_length = 32;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 2;
  config.train.train_iters = 4;
  config.train.num_threads = 1;
  config.dataset.data_path = {(dir_ / "corpus_text_document").string()};
  config.dataset.eod_mask_loss = true;
  config.tokenizer.tokenizer_type = "HuggingFaceTokenizer";
  config.tokenizer.tokenizer_model = model_dir;
  TextGeneratorOptions generating;  // no tokenizer_type: the run's
  generating.prompts = {"Hello world"};
  generating.interval = 2;
  generating.max_new_tokens = 5;
  generating.stop_at_eod = false;
  auto generator = std::make_shared<TextGenerator>(generating);
  int64_t model_vocab = 0;
  std::optional<int64_t> eod;
  std::vector<double> losses;
  auto manager = std::make_shared<CallbackManager>();
  manager->add(generator);
  manager->register_callback("on_train_start", [&](CallbackContext& ctx) {
    model_vocab = ctx.gpt().config().vocab_size;
    eod = ctx.state.cfg->dataset.eod_token_id;
  });
  manager->register_callback("on_log", [&](CallbackContext& ctx) { losses.push_back(ctx.log->metrics.at("lm loss")); });
  pretrain(config, gpt_forward_step, manager);
  EXPECT_EQ(model_vocab, tokenizer.vocab_size());
  EXPECT_EQ(eod, tokenizer.eod());
  ASSERT_EQ(losses.size(), 4u);
  for (const double loss : losses) EXPECT_TRUE(std::isfinite(loss));
  // Written through the run's tokenizer (the byte-level one decodes the same ids to other text).
  ASSERT_EQ(generator->last().size(), 1u);
  const GeneratedText& text = generator->last()[0];
  ASSERT_EQ(text.tokens.size(), 5u);
  EXPECT_EQ(text.continuation, tokenizer.decode(text.tokens));
}

TEST(Utf8, LossyReplacesMaximalSubpartsAsPythonDoes) {
  // bytes.decode("utf-8", "replace") on each input (Python 3.11).
  EXPECT_EQ(utf8::lossy("a\xE2\x82"), "a\xEF\xBF\xBD");                            // a truncated 3-byte sequence: one
  EXPECT_EQ(utf8::lossy("\xE0\x80\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: each byte
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: each byte
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");                          // a truncated emoji: one
  EXPECT_EQ(utf8::lossy("ok \xF0\x9F\x98\x80"), "ok \xF0\x9F\x98\x80");
  EXPECT_EQ(utf8::first_invalid("abcdefghij\xFF"), 10u);
  EXPECT_EQ(utf8::first_invalid("abc"), std::string_view::npos);
}

}  // namespace
}  // namespace bridge::training::tokenizers
