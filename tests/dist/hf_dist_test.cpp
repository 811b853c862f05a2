// The Hugging Face bridges against transformers itself (tests/tools/hf_models.py, the tests' venv): tiny random
// GPT-2, Llama (grouped queries, untied; Llama 3.1's rope scaling, tied), Mistral, Qwen2 (QKV biases) and Qwen3 (q/k
// norms; and with YaRN's rope scaling) models, and the Mixture-of-Experts Qwen3-MoE (a dense layer between MoE ones),
// Qwen2-MoE (a gated shared expert, every second layer MoE) and Mixtral, loaded with
// checkpoint.pretrained_checkpoint=hf:<dir> give transformers' logits to fp32 round-off at tp1, tp2, pp2 and pp2 x 2
// virtual chunks, and the MoE ones at expert parallelism 2 and tp2 x ep2 (real ranks); after a training step,
// bridge-export writes a directory that AutoModelForCausalLM.from_pretrained loads, with the logits bridge had, keeping
// the source's context, token ids, generation_config.json and tokenizer (AutoTokenizer loads it; a run started from the
// export uses it); the TextGenerator's greedy continuation is transformers' generate()'s. The MoE config.json keys as
// bridge's moe_* fields, an export's files as save_pretrained's, transformers 5.x's fused expert tensors read, a rank's
// own experts read alone, and OLMoE (q/k norms across heads) refused saying why. YaRN's rope_parameters (Qwen's,
// DeepSeek's, and transformers' defaults) give transformers' own frequencies and attention factor, through import and
// export. Also the safetensors reader's errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "bridge/hf/auto_bridge.h"
#include "bridge/hf/hf_files_internal.h"
#include "bridge/models/rotary_pos_embedding.h"
#include "tests/dist/spawn.h"
#include "utils/safetensors.h"

namespace {

namespace fs = std::filesystem;
using bridge::testing::describe;
using bridge::testing::expect_all_ok;
using bridge::testing::run_command;
using bridge::testing::run_ranks;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kVocab = 301;  // tests/tools/hf_models.py's

fs::path scratch(const std::string& name) {
  const fs::path directory = fs::temp_directory_path() / ("bridge_hf_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(directory);
  fs::create_directories(directory);
  return directory;
}

// Whether the tests' Python has transformers: scripts/install_deps.sh installs it beside the torch wheel, which a
// build against LibTorch 2.x uses; transformers needs torch 2.x, so a LibTorch 1.x install has none.
bool has_transformers() {
  static const bool found =
      run_command({BRIDGE_TOOLS_PYTHON, "-c", "import transformers, safetensors"}, std::chrono::seconds(120))
          .exit_code == 0;
  return found;
}

// Runs tests/tools/hf_models.py; throws (a test failure) with its output when it fails.
void python(const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {BRIDGE_TOOLS_PYTHON, BRIDGE_HF_MODELS};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  const auto result = run_command(argv, std::chrono::seconds(300));
  if (result.exit_code != 0) {
    std::string command;
    for (const std::string& word : argv) command += word + " ";
    throw std::runtime_error(command + "failed:\n" + result.output +
                             "\n(scripts/install_deps.sh installs transformers and safetensors in .venv)");
  }
}

torch::Tensor logits_in(const fs::path& file) {
  return bridge::utils::read_safetensors(file).tensors.at("logits").slice(-1, 0, kVocab);
}

// One transformers model per family, made by the first test that needs it and kept in the build directory for the
// others (each test is its own process, and making one costs seconds of Python start-up). BRIDGE_HF_REFERENCES is
// named by hf_models.py's digest, so editing the script makes them again.
struct Reference {
  fs::path directory, hf, ids, logits, generated;
};
const Reference& reference(const std::string& family) {
  static std::map<std::string, Reference> made;
  auto it = made.find(family);
  if (it != made.end()) return it->second;
  Reference r;
  r.directory = fs::path(BRIDGE_HF_REFERENCES) / family;
  r.hf = r.directory / "hf";
  r.ids = r.directory / "ids.safetensors";
  r.logits = r.directory / "logits.safetensors";
  r.generated = r.directory / "generated.safetensors";
  if (!fs::exists(r.directory)) {
    // Made aside and renamed into place whole, so that no process reads a half-made one; a process that loses the
    // race to rename keeps the winner's (the same model: hf_models.py seeds everything).
    const fs::path aside = r.directory.string() + ".making." + std::to_string(::getpid());
    fs::remove_all(aside);
    fs::create_directories(aside);
    python({"make", family, aside.string()});
    std::error_code lost;
    fs::rename(aside, r.directory, lost);
    if (lost) fs::remove_all(aside);
  }
  return made.emplace(family, r).first->second;
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// `ep`, `etp`: an MoE model's expert layout (etp 0: tp). The world is the smallest that both the dense layout
// (tp x pp x dp) and the expert one (etp x ep x expert dp x pp) divide.
fs::path run_layout(const std::string& family, const std::string& name, int tp, int pp, int vpp, int ep = 1,
                    int etp = 0) {
  const Reference& r = reference(family);
  const fs::path out = scratch(family + "_" + name);
  const int world = std::lcm(tp * pp, (etp > 0 ? etp : tp) * ep * pp);
  const auto results = run_ranks(BRIDGE_GPT_WORKER,
                                 {"hf", r.hf.string(), r.ids.string(), out.string(), std::to_string(tp),
                                  std::to_string(pp), std::to_string(vpp), std::to_string(ep), std::to_string(etp)},
                                 world, std::chrono::seconds(300));
  expect_all_ok(results, "hf: ok");
  return out;
}

// Every test needs transformers; a LibTorch 1.x install cannot have it.
class HuggingFace : public ::testing::Test {
 protected:
  void SetUp() override {
    if (has_transformers()) return;
    if (TORCH_VERSION_MAJOR < 2) GTEST_SKIP() << "transformers needs torch 2.x; this LibTorch 1.x install has none";
    FAIL() << BRIDGE_TOOLS_PYTHON << " has no transformers: run scripts/install_deps.sh";
  }
};

// A family in a tp/pp/vpp layout (vpp 0: no virtual pipeline), with an MoE model's experts over ep ranks, each split
// over etp (0: tp).
struct Layout {
  const char* family;
  int tp, pp, vpp;
  int ep = 1, etp = 0;
};
std::string layout_name(const Layout& layout) {
  std::string name = std::string(layout.family) + "_tp" + std::to_string(layout.tp) + "_pp" + std::to_string(layout.pp);
  if (layout.vpp) name += "_vpp" + std::to_string(layout.vpp);
  if (layout.ep > 1) name += "_ep" + std::to_string(layout.ep);
  return layout.etp ? name + "_etp" + std::to_string(layout.etp) : name;
}

class HuggingFaceLogits : public HuggingFace, public ::testing::WithParamInterface<Layout> {};

// checkpoint.pretrained_checkpoint=hf:<dir> gives transformers' logits to fp32 round-off, with GQA groups split over
// tp2, the layers over pipeline stages and virtual chunks, and an MoE model's experts over expert-parallel ranks (tp2
// runs it sequence-parallel, as Megatron-Core requires).
TEST_P(HuggingFaceLogits, ImportedLogitsAreTransformers) {
  const Layout& layout = GetParam();
  const fs::path out =
      run_layout(layout.family, layout_name(layout), layout.tp, layout.pp, layout.vpp, layout.ep, layout.etp);
  const torch::Tensor expected = logits_in(reference(layout.family).logits);
  const torch::Tensor ours = logits_in(out / "start.safetensors");
  ASSERT_EQ(ours.sizes(), expected.sizes());
  const double difference = max_difference(ours, expected);
  std::printf("%s: largest difference to transformers' logits %.2e (logits up to %.2f)\n", layout_name(layout).c_str(),
              difference, expected.abs().max().item<double>());
  EXPECT_LT(difference, 2e-5) << layout_name(layout);  // GPT-2's exact GeLU instead of gelu_new moves them by 3.8e-4
  // The TextGenerator's greedy continuation is transformers' generate()'s.
  const torch::Tensor ours_tokens = bridge::utils::read_safetensors(out / "generated.safetensors").tensors.at("tokens");
  const torch::Tensor their_tokens =
      bridge::utils::read_safetensors(reference(layout.family).generated).tensors.at("tokens");
  EXPECT_TRUE(ours_tokens.equal(their_tokens)) << ours_tokens << their_tokens;
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(
    Families, HuggingFaceLogits,
    ::testing::Values(Layout{"gpt2", 1, 1, 0}, Layout{"gpt2", 2, 1, 0}, Layout{"gpt2", 1, 2, 0},
                      Layout{"gpt2", 1, 2, 2}, Layout{"llama", 1, 1, 0}, Layout{"llama", 2, 1, 0},
                      Layout{"llama", 1, 2, 0}, Layout{"llama", 1, 2, 2}, Layout{"llama31", 1, 1, 0},
                      Layout{"llama31", 2, 1, 0}, Layout{"mistral", 2, 1, 0}, Layout{"qwen2", 1, 1, 0},
                      Layout{"qwen2", 2, 1, 0}, Layout{"qwen3", 1, 1, 0}, Layout{"qwen3", 2, 1, 0},
                      Layout{"qwen3", 1, 2, 0}, Layout{"qwen3_yarn", 1, 1, 0}, Layout{"qwen3_moe", 1, 1, 0},
                      Layout{"qwen3_moe", 2, 1, 0}, Layout{"qwen3_moe", 1, 2, 0}, Layout{"qwen3_moe", 1, 1, 0, 2},
                      Layout{"qwen3_moe", 2, 1, 0, 2, 1}, Layout{"qwen2_moe", 1, 1, 0}, Layout{"qwen2_moe", 1, 1, 0, 2},
                      Layout{"qwen2_moe", 2, 1, 0, 2, 1}, Layout{"mixtral", 1, 1, 0}, Layout{"mixtral", 1, 1, 0, 2},
                      Layout{"mixtral", 2, 1, 0, 2, 1}, Layout{"olmoe", 1, 1, 0}, Layout{"olmoe", 2, 1, 0},
                      Layout{"olmoe", 2, 1, 0, 2, 1}),
    [](const ::testing::TestParamInfo<Layout>& info) { return layout_name(info.param); });

class HuggingFaceExport : public HuggingFace, public ::testing::WithParamInterface<const char*> {};

// What a directory holds: each file's name, size and modification time.
std::map<std::string, std::pair<std::uintmax_t, fs::file_time_type>> listing(const fs::path& directory) {
  std::map<std::string, std::pair<std::uintmax_t, fs::file_time_type>> files;
  for (const auto& entry : fs::directory_iterator(directory)) {
    files[entry.path().filename().string()] = {entry.is_regular_file() ? entry.file_size() : 0,
                                               entry.last_write_time()};
  }
  return files;
}

// One training step at tp2 (an MoE model's experts over ep2, whole on each rank), bridge-export, then
// AutoModelForCausalLM.from_pretrained: transformers' logits are the trained model's, the exported config.json names
// the family it came from, and the export keeps the source's context (Llama 3.1's 128 positions, not the training
// 32), token ids, generation_config.json and tokenizer (Llama's: AutoTokenizer encodes as the source's does, and a run
// started from the export takes it as its tokenizer).
TEST_P(HuggingFaceExport, TrainedAtTp2ExportsToWhatTransformersLoads) {
  const std::string family = GetParam();
  const bool moe = family.find("_moe") != std::string::npos || family == "mixtral";
  const fs::path out = run_layout(family, "roundtrip", 2, 1, 0, moe ? 2 : 1, moe ? 1 : 0);
  const fs::path exported = out / "exported";
  fs::create_directories(exported);
  std::ofstream(exported / "README.md") << "a file of the user's, which an export leaves alone\n";
  std::vector<std::string> command = {BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir",
                                      exported.string()};
  if (family == "mistral") command.insert(command.end(), {"--model-type", "mistral"});
  // Llama 3.1's export in shards of at most 100 kB (as real 8B checkpoints come, in 5 GB ones): transformers reads
  // them through model.safetensors.index.json.
  const bool sharded = family == "llama31";
  if (sharded) command.insert(command.end(), {"--max-shard-size", "100KB"});
  const auto exporting = run_command(command, std::chrono::seconds(120));
  ASSERT_EQ(exporting.exit_code, 0) << exporting.output;
  const std::string model_type = family == "llama31" ? "llama" : family;
  EXPECT_THAT(exporting.output, HasSubstr("a " + model_type + " model"));
  EXPECT_EQ(fs::exists(exported / "model.safetensors.index.json"), sharded);
  EXPECT_EQ(fs::exists(exported / "model.safetensors"), !sharded);
  if (sharded) {
    int shards = 0;
    for (const auto& entry : fs::directory_iterator(exported)) {
      if (entry.path().extension() != ".safetensors") continue;
      ++shards;
      EXPECT_THAT(entry.path().filename().string(),
                  ::testing::MatchesRegex("model-0000[1-9]-of-0000[2-9].safetensors"));
      EXPECT_LE(fs::file_size(entry.path()), 100'000u + 16'384u) << entry.path();  // the limit plus its header
    }
    EXPECT_GE(shards, 3);
  }
  EXPECT_TRUE(fs::exists(exported / "README.md"));
  EXPECT_TRUE(fs::exists(exported / "generation_config.json"));
  for (const auto& entry : fs::directory_iterator(exported)) {
    EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".bridge-export"))) << "a staging folder was left";
  }
  // What it kept of the source, as the source has it: GPT-2's context is n_positions (the position table's rows), and
  // Qwen's config.json has no token ids, nor OLMoE's as hf_models.py makes it (its defaults are outside the
  // vocabulary).
  const bool no_ids = family.rfind("qwen", 0) == 0 || family == "olmoe";
  EXPECT_THAT(exporting.output, HasSubstr(family == "gpt2" ? "kept the token ids and generation_config.json of "
                                          : no_ids         ? "kept the context length (max_position_embeddings "
                                                   : "kept the token ids, context length (max_position_embeddings "));
  const bool has_tokenizer = family == "llama";  // hf_models.py gives llama alone a tokenizer
  if (has_tokenizer) {
    EXPECT_THAT(exporting.output, HasSubstr("tokenizer.json, tokenizer_config.json"));
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) EXPECT_TRUE(fs::exists(exported / file));
  } else {
    EXPECT_THAT(exporting.output, AllOf(HasSubstr("has no tokenizer files"), HasSubstr("give --tokenizer")));
  }
  python({"exported", reference(family).hf.string(), exported.string(), reference(family).ids.string(),
          (out / "loaded.safetensors").string()});
  const torch::Tensor trained = logits_in(out / "end.safetensors");
  const torch::Tensor loaded = logits_in(out / "loaded.safetensors");
  const double difference = max_difference(loaded, trained);
  std::printf("%s trained at tp2, exported: largest difference of transformers' logits to bridge's %.2e\n",
              family.c_str(), difference);
  EXPECT_LT(difference, 2e-5);
  EXPECT_GT(max_difference(trained, logits_in(out / "start.safetensors")), 1e-4) << "the step changed the model";
  if (has_tokenizer) {
    // A run started from the export reads and writes its tokens with the export's tokenizer, not bytes.
    const auto reimport = run_command({BRIDGE_PRETRAIN, "checkpoint.pretrained_checkpoint=hf:" + exported.string(),
                                       "model.seq_length=32", "--print-config"},
                                      std::chrono::seconds(120));
    ASSERT_EQ(reimport.exit_code, 0) << reimport.output;
    EXPECT_THAT(reimport.output,
                AllOf(HasSubstr("tokenizer_type: HuggingFaceTokenizer"),
                      HasSubstr("tokenizer_model: " + exported.string()), HasSubstr("eod_token_id: 1")));
    // A failed export leaves the directory as it was: a source whose config.json is not JSON is read before anything
    // is written.
    const fs::path bad_source = out / "bad_source";
    fs::create_directories(bad_source);
    std::ofstream(bad_source / "config.json") << "{ not json";
    const auto before = listing(exported);
    const auto failing = run_command({BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir",
                                      exported.string(), "--hf-source", bad_source.string()},
                                     std::chrono::seconds(120));
    EXPECT_EQ(failing.exit_code, 1) << failing.output;
    EXPECT_THAT(failing.output, HasSubstr("config.json is not JSON"));
    EXPECT_EQ(listing(exported), before) << "a failed export changed the directory";
    // The kept line names only what was kept: a tokenizer of another directory (--tokenizer) replaces the token ids,
    // and a source without generation_config.json gives none.
    const auto retokenized =
        run_command({BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir", (out / "retokenized").string(),
                     "--tokenizer", (exported / "tokenizer.json").string()},
                    std::chrono::seconds(120));
    ASSERT_EQ(retokenized.exit_code, 0) << retokenized.output;
    EXPECT_THAT(retokenized.output, AllOf(HasSubstr("kept the context length (max_position_embeddings "),
                                          HasSubstr("and generation_config.json (with the tokenizer's bos/eos ids)"),
                                          Not(HasSubstr("token ids,")), Not(HasSubstr("kept the token ids"))));
    const fs::path bare_source = out / "bare_source";
    fs::create_directories(bare_source);
    fs::copy_file(reference(family).hf / "config.json", bare_source / "config.json");
    const auto bare = run_command({BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir",
                                   (out / "bare").string(), "--hf-source", bare_source.string()},
                                  std::chrono::seconds(120));
    ASSERT_EQ(bare.exit_code, 0) << bare.output;
    EXPECT_THAT(bare.output, AllOf(HasSubstr("kept the token ids and context length (max_position_embeddings "),
                                   Not(HasSubstr("generation_config.json of"))));
    // A source whose context is shorter than the training seq_length (32): the export says it wrote the latter.
    const fs::path short_source = out / "short_source";
    fs::create_directories(short_source);
    nlohmann::json short_config;
    std::ifstream(reference(family).hf / "config.json") >> short_config;
    short_config["max_position_embeddings"] = 16;
    std::ofstream(short_source / "config.json") << short_config.dump();
    const auto shorter = run_command({BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir",
                                      (out / "short").string(), "--hf-source", short_source.string()},
                                     std::chrono::seconds(120));
    ASSERT_EQ(shorter.exit_code, 0) << shorter.output;
    EXPECT_THAT(shorter.output,
                AllOf(HasSubstr("max_position_embeddings 32: the training seq_length, longer than the source's 16"),
                      Not(HasSubstr("context length"))));
    // A bare tokenizer.json (no tokenizer_config.json beside it), named relative to the working directory, into the
    // export made above: it has no EOS token, the messages say which ids config.json keeps and name a real folder
    // for the fix, and the earlier export's tokenizer_config.json goes.
    const fs::path bare_tokenizer = out / "bare_tokenizer";
    fs::create_directories(bare_tokenizer);
    fs::copy_file(exported / "tokenizer.json", bare_tokenizer / "my-tokenizer.json");
    const auto rebare = run_command(
        {"sh", "-c",
         "cd '" + bare_tokenizer.string() + "' && '" + BRIDGE_EXPORT + "' --checkpoint '" + (out / "ckpt").string() +
             "' --hf-dir '" + exported.string() + "' --tokenizer my-tokenizer.json"},
        std::chrono::seconds(120));
    ASSERT_EQ(rebare.exit_code, 0) << rebare.output;
    EXPECT_THAT(rebare.output, AllOf(HasSubstr("the tokenizer names no EOS token"),
                                     HasSubstr("keep the source's token ids (bos_token_id 0, eos_token_id 1)"),
                                     HasSubstr("kept the token ids"), Not(HasSubstr("have no bos/eos ids")),
                                     HasSubstr(".save_pretrained(\"" + bare_tokenizer.string() + "\")"),
                                     Not(HasSubstr(".save_pretrained(\"\")"))));
    EXPECT_FALSE(fs::exists(exported / "tokenizer_config.json")) << "the earlier export's tokenizer_config.json stayed";
    EXPECT_TRUE(fs::exists(exported / "tokenizer.json"));
    EXPECT_TRUE(fs::exists(exported / "README.md"));
    // A tokenizer with more ids than the model's 301 is refused (exit 2) naming both sizes; nothing is written.
    nlohmann::json larger;
    std::ifstream(bare_tokenizer / "my-tokenizer.json") >> larger;
    for (int id = kVocab; id < kVocab + 9; ++id) {
      larger["added_tokens"].push_back({{"id", id},
                                        {"content", "<extra_" + std::to_string(id) + ">"},
                                        {"single_word", false},
                                        {"lstrip", false},
                                        {"rstrip", false},
                                        {"normalized", false},
                                        {"special", true}});
    }
    std::ofstream(bare_tokenizer / "larger.json") << larger.dump();
    const auto too_large =
        run_command({BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir", (out / "too_large").string(),
                     "--tokenizer", (bare_tokenizer / "larger.json").string()},
                    std::chrono::seconds(120));
    EXPECT_EQ(too_large.exit_code, 2) << too_large.output;
    EXPECT_THAT(too_large.output,
                HasSubstr("--tokenizer " + (bare_tokenizer / "larger.json").string() +
                          " has 310 ids (added tokens included), more than the model's vocab_size 301"));
    EXPECT_FALSE(fs::exists(out / "too_large"));
  }
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Families, HuggingFaceExport,
                         ::testing::Values("gpt2", "llama", "llama31", "mistral", "qwen2", "qwen3", "qwen3_moe",
                                           "qwen2_moe", "mixtral", "olmoe"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// The message of what `run` throws ("" when it throws nothing).
template <class F>
std::string thrown_by(F run) {
  try {
    run();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

// The MoE families' config.json as bridge's moe_* fields: the expert count (num_experts or num_local_experts), the
// expert width, norm_topk_prob as moe_router_pre_softmax = !norm_topk_prob (Mixtral always renormalises),
// decoder_sparse_step and mlp_only_layers as an explicit moe_layer_freq list, the shared expert and its gate,
// router_aux_loss_coef; an export picks the family back from the shape, and an hf: start adopts the experts.
TEST_F(HuggingFace, MoeConfigJsonAsBridgesFields) {
  using bridge::hf::hf_model_config;
  using bridge::hf::hf_model_type_for;
  const bridge::models::GPTConfig qwen3 = hf_model_config(reference("qwen3_moe").hf);
  ASSERT_TRUE(qwen3.num_moe_experts.has_value());
  EXPECT_EQ(*qwen3.num_moe_experts, 4);  // config.json's num_local_experts, as transformers 5.23 writes it
  EXPECT_EQ(qwen3.moe_router_topk, 2);
  EXPECT_EQ(qwen3.moe_ffn_size(), 32);
  EXPECT_EQ(qwen3.ffn_size(), 96);                                              // the dense layer's
  EXPECT_EQ(qwen3.moe_layer_freq.pattern, (std::vector<int64_t>{1, 0, 1, 1}));  // mlp_only_layers [1]
  EXPECT_FALSE(qwen3.moe_router_pre_softmax);                                   // norm_topk_prob true
  EXPECT_FALSE(qwen3.moe_shared_expert_intermediate_size.has_value());
  EXPECT_TRUE(qwen3.qk_layernorm);
  EXPECT_DOUBLE_EQ(qwen3.moe_aux_loss_coeff, 0.001);
  EXPECT_EQ(hf_model_type_for(qwen3), "qwen3_moe");
  const bridge::models::GPTConfig qwen2 = hf_model_config(reference("qwen2_moe").hf);
  EXPECT_EQ(qwen2.moe_layer_freq.pattern, (std::vector<int64_t>{0, 1, 0, 1}));  // decoder_sparse_step 2
  EXPECT_TRUE(qwen2.moe_router_pre_softmax);                                    // norm_topk_prob false
  EXPECT_EQ(qwen2.moe_shared_expert_intermediate_size, std::optional<int64_t>(48));
  EXPECT_TRUE(qwen2.moe_shared_expert_gate);
  EXPECT_TRUE(qwen2.add_qkv_bias);
  EXPECT_FALSE(qwen2.add_bias_linear);
  EXPECT_EQ(hf_model_type_for(qwen2), "qwen2_moe");
  const bridge::models::GPTConfig mixtral = hf_model_config(reference("mixtral").hf);
  EXPECT_EQ(mixtral.num_moe_experts, std::optional<int64_t>(4));
  EXPECT_TRUE(mixtral.moe_layer_freq.pattern.empty());  // every layer
  EXPECT_EQ(mixtral.moe_layer_freq.every, 1);
  EXPECT_EQ(mixtral.moe_ffn_size(), 32);  // intermediate_size
  EXPECT_FALSE(mixtral.moe_router_pre_softmax);
  EXPECT_DOUBLE_EQ(mixtral.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(hf_model_type_for(mixtral), "mixtral");
  // An hf: start takes the experts from config.json; the run's own training choices stay.
  bridge::models::GPTConfig run;
  run.moe_aux_loss_coeff = 0.05;
  const bridge::models::GPTConfig adopted = bridge::hf::with_hf_architecture(run, qwen3);
  EXPECT_EQ(adopted.num_moe_experts, qwen3.num_moe_experts);
  EXPECT_EQ(adopted.moe_layer_freq, qwen3.moe_layer_freq);
  EXPECT_DOUBLE_EQ(adopted.moe_aux_loss_coeff, 0.05);
  EXPECT_THAT(bridge::hf::architecture_differences(run, qwen3),
              ::testing::IsSupersetOf({"model.num_moe_experts (null, config.json: 4)",
                                       "model.moe_layer_freq (1, config.json: [1, 0, 1, 1])",
                                       "model.moe_ffn_hidden_size (null, config.json: 32)"}));
}

// YaRN's rope_parameters, as Qwen's and DeepSeek's config.json carry them and with transformers' defaults for what is
// absent, imported as bridge's yarn_* fields (Megatron-Core's) give the frequencies and attention factor that
// transformers' own _compute_yarn_parameters computes from config.json; the export of each writes a config.json from
// which transformers computes them again, and which bridge imports back to them.
TEST_F(HuggingFace, YarnFrequenciesAndAttentionFactorAreTransformers) {
  using bridge::hf::hf_model_config;
  using bridge::models::GPTConfig;
  using bridge::models::RotaryEmbedding;
  using nlohmann::json;
  const Reference& r = reference("qwen3_yarn");
  json source;
  std::ifstream(r.hf / "config.json") >> source;  // a Qwen3 with max_position_embeddings 16384
  struct Case {
    const char* name;
    json rope;
  };
  const std::vector<Case> cases = {
      {"qwen3",
       {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}}},
      // Both mscales: their ratio of get_mscale's is the attention factor.
      {"deepseek_mscales",
       {{"rope_type", "yarn"},
        {"rope_theta", 10000.0},
        {"factor", 40.0},
        {"original_max_position_embeddings", 4096},
        {"beta_fast", 32},
        {"beta_slow", 1},
        {"mscale", 1.0},
        {"mscale_all_dim", 0.8}}},
      // No original length: the config's max_position_embeddings.
      {"original_from_context", {{"rope_type", "yarn"}, {"rope_theta", 1000000.0}, {"factor", 2.0}}},
      {"explicit_untruncated_partial",
       {{"rope_type", "yarn"},
        {"rope_theta", 10000.0},
        {"factor", 8.0},
        {"original_max_position_embeddings", 64},
        {"beta_fast", 16.0},
        {"beta_slow", 2.0},
        {"attention_factor", 0.9},
        {"truncate", false},
        {"partial_rotary_factor", 0.5}}},
      // mscale without mscale_all_dim: transformers ignores it (0.1 ln 4 + 1).
      {"mscale_alone",
       {{"rope_type", "yarn"},
        {"rope_theta", 10000.0},
        {"factor", 4.0},
        {"original_max_position_embeddings", 256},
        {"mscale", 2.0}}},
  };
  const fs::path out = scratch("yarn");
  const std::map<std::string, torch::Tensor> weights = bridge::hf::load_hf_weights(r.hf, hf_model_config(r.hf));
  std::vector<GPTConfig> imported, reimported;
  std::vector<std::string> directories;
  for (const Case& c : cases) {
    const fs::path from = out / c.name / "source", to = out / c.name / "exported";
    fs::create_directories(from);
    json config = source;
    config["rope_parameters"] = c.rope;
    std::ofstream(from / "config.json") << config.dump(2);
    GPTConfig gpt = hf_model_config(from);
    gpt.seq_length = 32;
    bridge::hf::save_hf(to, weights, gpt);
    imported.push_back(gpt);
    reimported.push_back(hf_model_config(to));
    directories.insert(directories.end(), {from.string(), to.string()});
  }
  std::vector<std::string> arguments = {"rope", (out / "rope.safetensors").string()};
  arguments.insert(arguments.end(), directories.begin(), directories.end());
  python(arguments);
  const auto theirs = bridge::utils::read_safetensors(out / "rope.safetensors").tensors;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const torch::Tensor inv_freq = theirs.at("inv_freq" + std::to_string(2 * i));
    const double attention_factor = theirs.at("attention_factor" + std::to_string(2 * i)).item<double>();
    const RotaryEmbedding ours(imported[i]), back(reimported[i]);
    EXPECT_EQ(imported[i].position_embedding_type, bridge::models::PositionEmbeddingType::kYarn);
    // The same operations in the same order: the frequencies to the bit.
    EXPECT_TRUE(ours.inv_freq().equal(inv_freq)) << ours.inv_freq() << inv_freq;
    EXPECT_DOUBLE_EQ(ours.attention_factor(), attention_factor);
    // The export: transformers reads the same parameters from it, and bridge the same fields.
    EXPECT_TRUE(theirs.at("inv_freq" + std::to_string(2 * i + 1)).equal(inv_freq));
    EXPECT_DOUBLE_EQ(theirs.at("attention_factor" + std::to_string(2 * i + 1)).item<double>(), attention_factor);
    EXPECT_TRUE(back.inv_freq().equal(inv_freq));
    EXPECT_DOUBLE_EQ(back.attention_factor(), attention_factor);
    EXPECT_EQ(bridge::hf::architecture_differences(imported[i], reimported[i]), std::vector<std::string>{});
  }
  // The fields, by Megatron-Core's names, and factors that are not 1 (so that dropping one shows above).
  EXPECT_DOUBLE_EQ(imported[0].yarn_rotary_scaling_factor, 4.0);
  EXPECT_EQ(imported[0].yarn_original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(RotaryEmbedding(imported[0]).attention_factor(), 0.1 * std::log(4.0) + 1);
  EXPECT_DOUBLE_EQ(imported[1].yarn_mscale_all_dim, 0.8);
  EXPECT_DOUBLE_EQ(RotaryEmbedding(imported[1]).attention_factor(),
                   (0.1 * std::log(40.0) + 1) / (0.1 * 0.8 * std::log(40.0) + 1));
  EXPECT_EQ(imported[2].yarn_original_max_position_embeddings, 16384);
  EXPECT_EQ(imported[3].yarn_attention_factor, std::optional<double>(0.9));
  EXPECT_FALSE(imported[3].yarn_correction_range_round_to_int);
  EXPECT_DOUBLE_EQ(imported[3].yarn_beta_fast, 16.0);
  EXPECT_EQ(RotaryEmbedding(imported[3]).inv_freq().numel(), 6);  // partial_rotary_factor 0.5 of 24 channels
  EXPECT_DOUBLE_EQ(imported[4].yarn_mscale, 1.0);
  // An hf: start with a YaRN model needs position_embedding_type yarn and the same attention factor.
  GPTConfig rope = imported[0];
  rope.position_embedding_type = bridge::models::PositionEmbeddingType::kRope;
  EXPECT_THAT(thrown_by([&] { bridge::hf::check_hf_config(out / "qwen3" / "source", rope); }),
              HasSubstr("model.position_embedding_type must be yarn"));
  GPTConfig louder = imported[0];
  louder.yarn_mscale = 2.0;
  EXPECT_THAT(thrown_by([&] { bridge::hf::check_hf_config(out / "qwen3" / "source", louder); }),
              HasSubstr("model.yarn_attention_factor must be 1.13863"));
  fs::remove_all(out);
}

// What bridge cannot compute is refused at import, naming the file and the key: OLMoE's clip_qkv, Mixtral's router
// jitter, biases in an MoE model, top-1 routing with
// the weight renormalised to 1, two expert counts that disagree; an export as a family the model is not of names the
// model.* field.
TEST_F(HuggingFace, MoeRefusesWhatBridgeCannotCompute) {
  const fs::path out = scratch("moe_refusals");
  const auto edited = [&](const std::string& family, const std::string& name, const nlohmann::json& changes) {
    const fs::path directory = out / name;
    fs::create_directories(directory);
    nlohmann::json config;
    std::ifstream(reference(family).hf / "config.json") >> config;
    config.update(changes);
    std::ofstream(directory / "config.json") << config.dump();
    return directory;
  };
  const auto expect_refused = [&](const fs::path& directory, const std::string& part) {
    EXPECT_THAT(thrown_by([&] { bridge::hf::hf_model_config(directory); }),
                AllOf(HasSubstr((directory / "config.json").string()), HasSubstr(part)));
  };
  expect_refused(edited("olmoe", "clip", {{"clip_qkv", 8.0}}),
                 "clip_qkv is 8.0: OLMoE clamps q, k and v to that bound");
  expect_refused(edited("mixtral", "jitter", {{"router_jitter_noise", 0.1}}),
                 "router_jitter_noise is 0.1: Mixtral multiplies its MoE input by uniform noise in training");
  expect_refused(edited("qwen3_moe", "bias", {{"attention_bias", true}}),
                 "attention_bias is true; bridge's Mixture-of-Experts models have no biases");
  expect_refused(edited("qwen3_moe", "top1", {{"num_experts_per_tok", 1}}),
                 "num_experts_per_tok is 1 with the chosen expert's weight renormalised to 1 (norm_topk_prob true)");
  expect_refused(edited("qwen3_moe", "counts", {{"num_experts", 8}}),
                 "num_experts (8) and num_local_experts (4) disagree");
  const bridge::models::GPTConfig qwen3 = bridge::hf::hf_model_config(reference("qwen3_moe").hf);
  const auto weights = bridge::hf::load_hf_weights(reference("qwen3_moe").hf, qwen3);
  EXPECT_THAT(thrown_by([&] { bridge::hf::save_hf(out / "dense", weights, qwen3, "qwen3"); }),
              HasSubstr("cannot write a qwen3 model: it has no experts (model.num_moe_experts is set"));
  EXPECT_THAT(thrown_by([&] { bridge::hf::save_hf(out / "olmoe", weights, qwen3, "olmoe"); }),
              HasSubstr("cannot write a olmoe model: its q/k norms are over all heads "
                        "(model.qk_layernorm_across_heads)"));
  bridge::models::GPTConfig unnormalised = qwen3;
  unnormalised.qk_layernorm = false;
  unnormalised.moe_router_pre_softmax = true;
  EXPECT_THAT(thrown_by([&] { bridge::hf::save_hf(out / "mixtral", weights, unnormalised); }),
              HasSubstr("cannot write a mixtral model: it always renormalises the chosen experts' weights "
                        "(model.moe_router_pre_softmax must be false)"));
  EXPECT_FALSE(fs::exists(out / "dense") || fs::exists(out / "olmoe") || fs::exists(out / "mixtral"));
  fs::remove_all(out);
}

// transformers' Llama family rotates the two halves of each head's channels only: an import leaves
// model.rotary_interleaved false (an hf: start adopts that, and an override of it disagrees with config.json), and
// the export of an interleaved model is refused naming the field, before anything is written.
TEST_F(HuggingFace, InterleavedRopeIsNeitherImportedNorExported) {
  const fs::path out = scratch("interleaved_rope");
  const bridge::models::GPTConfig llama = bridge::hf::hf_model_config(reference("llama").hf);
  EXPECT_FALSE(llama.rotary_interleaved);
  bridge::models::GPTConfig run;
  run.rotary_interleaved = true;
  EXPECT_FALSE(bridge::hf::with_hf_architecture(run, llama).rotary_interleaved);
  EXPECT_THAT(bridge::hf::architecture_differences(run, llama),
              ::testing::Contains(std::string("model.rotary_interleaved (true, config.json: false)")));
  bridge::models::GPTConfig interleaved = llama;
  interleaved.rotary_interleaved = true;
  const auto weights = bridge::hf::load_hf_weights(reference("llama").hf, llama);
  for (const char* type : {"", "llama"}) {  // the type bridge picks, and the one asked for
    EXPECT_THAT(
        thrown_by([&] { bridge::hf::save_hf(out / "interleaved", weights, interleaved, type); }),
        AllOf(HasSubstr("cannot write a llama model: its RoPE turns channel i with channel i + head_dim / 2"),
              HasSubstr("model.rotary_interleaved is true"), HasSubstr("train with model.rotary_interleaved=false")));
  }
  EXPECT_FALSE(fs::exists(out / "interleaved"));
  fs::remove_all(out);
}

// An export of an imported MoE model holds what save_pretrained wrote: the same tensor names (per-expert hub names,
// Mixtral's block_sparse_moe), shapes and bytes, and the config.json keys transformers reads, Qwen3-MoE's expert count
// under num_local_experts (as 5.23 writes it) and num_experts (as 4.x reads it).
TEST_F(HuggingFace, MoeExportHoldsWhatSavePretrainedWrote) {
  const fs::path out = scratch("moe_files");
  for (const char* family : {"qwen3_moe", "qwen2_moe", "mixtral"}) {
    const fs::path source = reference(family).hf;
    const bridge::models::GPTConfig config = bridge::hf::hf_model_config(source);
    bridge::hf::save_hf(out / family, bridge::hf::load_hf_weights(source, config), config);
    const auto theirs = bridge::utils::read_safetensors(source / "model.safetensors").tensors;
    const auto ours = bridge::utils::read_safetensors(out / family / "model.safetensors").tensors;
    std::set<std::string> their_names, our_names;
    for (const auto& entry : theirs) their_names.insert(entry.first);
    for (const auto& entry : ours) our_names.insert(entry.first);
    EXPECT_EQ(our_names, their_names) << family;
    for (const auto& [name, tensor] : theirs) {
      if (ours.count(name)) {
        EXPECT_TRUE(torch::equal(ours.at(name), tensor)) << family << " " << name;
      }
    }
    nlohmann::json their_config, our_config;
    std::ifstream(source / "config.json") >> their_config;
    std::ifstream(out / family / "config.json") >> our_config;
    EXPECT_EQ(our_config.value("model_type", ""), family);
    for (const char* key : {"architectures", "num_experts", "num_local_experts", "num_experts_per_tok",
                            "moe_intermediate_size", "intermediate_size", "norm_topk_prob",
                            "shared_expert_intermediate_size", "qkv_bias", "router_aux_loss_coef"}) {
      if (their_config.contains(key)) {
        EXPECT_EQ(our_config[key], their_config[key]) << family << " " << key;
      }
    }
    // decoder_sparse_step 2 is written as step 1 with mlp_only_layers [0, 2]: the same layers.
    EXPECT_THAT(bridge::hf::architecture_differences(bridge::hf::hf_model_config(out / family), config),
                ::testing::IsEmpty())
        << family;
  }
  nlohmann::json qwen3;
  std::ifstream(out / "qwen3_moe" / "config.json") >> qwen3;
  EXPECT_EQ(qwen3.value("num_experts", 0), 4);
  EXPECT_EQ(qwen3.value("num_local_experts", 0), 4);
  fs::remove_all(out);
}

// transformers 5.x's in-memory layout (save_pretrained(save_original_format=False): the fused experts
// mlp.experts.gate_up_proj [E, 2F, H] and down_proj [E, H, F], Mixtral's router under mlp.gate) reads as the hub's
// per-expert names do; and a load restricted to some experts (an expert-parallel rank's) does not read the shards that
// hold only others.
TEST_F(HuggingFace, MoeReadsFusedExpertsAndOnlyTheExpertsWanted) {
  const fs::path out = scratch("moe_fused");
  const fs::path hub = reference("mixtral").hf;
  python({"fused", hub.string(), (out / "fused").string()});
  ASSERT_EQ(bridge::utils::read_safetensors(out / "fused" / "model.safetensors")
                .tensors.count("model.layers.0.mlp.experts.gate_up_proj"),
            1u);
  const bridge::models::GPTConfig mixtral = bridge::hf::hf_model_config(hub);
  const auto from_hub = bridge::hf::load_hf_weights(hub, mixtral);
  const auto from_fused = bridge::hf::load_hf_weights(out / "fused", mixtral);
  ASSERT_EQ(from_fused.size(), from_hub.size());
  for (const auto& [name, tensor] : from_hub) {
    ASSERT_EQ(from_fused.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(from_fused.at(name), tensor)) << name;
  }
  // Qwen3-MoE in shards of 16 kB (two expert tensors each); the shards holding only experts 2 and 3 go away.
  const fs::path source = reference("qwen3_moe").hf;
  const bridge::models::GPTConfig qwen3 = bridge::hf::hf_model_config(source);
  const auto weights = bridge::hf::load_hf_weights(source, qwen3);
  const fs::path sharded = out / "sharded";
  bridge::hf::save_hf(sharded, weights, qwen3, "", 16 * 1024);
  nlohmann::json index;
  std::ifstream(sharded / "model.safetensors.index.json") >> index;
  const auto other_expert = [](const std::string& name) {
    return name.find("experts.2.") != std::string::npos || name.find("experts.3.") != std::string::npos;
  };
  std::map<std::string, bool> only_others;  // shard -> whether all it holds is experts 2 and 3's
  for (const auto& [name, file] : index["weight_map"].items()) {
    const auto [it, added] = only_others.emplace(file.get<std::string>(), true);
    it->second = it->second && other_expert(name);
  }
  int removed = 0;
  for (const auto& [file, others] : only_others) {
    if (others) removed += fs::remove(sharded / file) ? 1 : 0;
  }
  ASSERT_GE(removed, 2);
  const auto wanted = [](const std::string& name) {
    return name.find(".local_experts.2.") == std::string::npos && name.find(".local_experts.3.") == std::string::npos;
  };
  const auto mine = bridge::hf::load_hf_weights(sharded, qwen3, wanted);
  std::size_t expected = 0;
  for (const auto& [name, tensor] : weights) {
    if (!wanted(name)) continue;
    ++expected;
    ASSERT_EQ(mine.count(name), 1u) << name;
    EXPECT_TRUE(torch::equal(mine.at(name), tensor)) << name;
  }
  EXPECT_EQ(mine.size(), expected);
  EXPECT_THAT(thrown_by([&] { bridge::hf::load_hf_weights(sharded, qwen3); }), HasSubstr(".safetensors"));
  fs::remove_all(out);
}

// checkpoint.also_save_hf_checkpoint's copies in `ckpt` (iterations 2 and 3 kept of 1..3): whole (no hf.partial)
// and gone with their iterations; the newest holds, file for file and byte for byte, what bridge-export writes from
// the same checkpoint (config.json, model.safetensors, generation_config.json and the source's tokenizer), which
// HuggingFaceExport.TrainedAtTp2ExportsToWhatTransformersLoads/llama loads in transformers with bridge's logits (a
// transformers start here would cost 7 s).
void expect_hf_checkpoints(const fs::path& ckpt, const fs::path& out) {
  EXPECT_FALSE(fs::exists(ckpt / "iter_0000001")) << "most_recent_k kept the oldest";
  for (const char* iteration : {"iter_0000002", "iter_0000003"}) {
    EXPECT_TRUE(fs::is_regular_file(ckpt / iteration / "hf" / "config.json")) << iteration;
    EXPECT_FALSE(fs::exists(ckpt / iteration / "hf.partial")) << iteration;
  }
  const fs::path hf = ckpt / "iter_0000003" / "hf";
  const fs::path exported = out / "exported_iter3";
  const auto exporting = run_command({BRIDGE_EXPORT, "--checkpoint", ckpt.string(), "--hf-dir", exported.string()},
                                     std::chrono::seconds(120));
  ASSERT_EQ(exporting.exit_code, 0) << exporting.output;
  const auto read_text = [](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::map<std::string, std::string> ours, theirs;
  for (const auto& entry : fs::directory_iterator(hf)) ours[entry.path().filename().string()] = read_text(entry);
  for (const auto& entry : fs::directory_iterator(exported))
    theirs[entry.path().filename().string()] = read_text(entry);
  std::set<std::string> names;
  for (const auto& entry : ours) names.insert(entry.first);
  EXPECT_THAT(names, ::testing::ElementsAre("config.json", "generation_config.json", "model.safetensors",
                                            "tokenizer.json", "tokenizer_config.json"));
  for (const auto& [name, bytes] : theirs) {
    ASSERT_EQ(ours.count(name), 1u) << name << " is missing from " << hf;
    EXPECT_TRUE(ours.at(name) == bytes) << name << " differs from bridge-export's";
  }
  // The trained weights, not the source's: the step moved them.
  const auto trained = bridge::utils::read_safetensors(hf / "model.safetensors").tensors;
  const auto source = bridge::utils::read_safetensors(reference("llama").hf / "model.safetensors").tensors;
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  EXPECT_GT(max_difference(trained.at(name), source.at(name)), 1e-5) << name;
}

// bridge-pretrain with hf:<dir> takes the model from config.json (AutoBridge): the embedded recipe's GPT sizes give
// way with no model.* given, and a model.* the user gives that disagrees is an error (exit 2, before any rank
// starts) naming both values.
TEST_F(HuggingFace, PretrainTakesTheModelFromConfigJson) {
  const Reference& llama = reference("llama");
  const fs::path out = scratch("autobridge");
  const std::string source = "checkpoint.pretrained_checkpoint=hf:" + llama.hf.string();
  const auto printed =
      run_command({BRIDGE_PRETRAIN, source, "model.seq_length=32", "--print-config"}, std::chrono::seconds(120));
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  for (const char* line :
       {"num_query_groups: 2", "normalization: RMSNorm", "position_embedding_type: rope", "rotary_base: 5e+05",
        "gated_linear_unit: true", "activation_func: silu", "add_bias_linear: false",
        "share_embeddings_and_output_weights: false", "vocab_size: 301", "hidden_size: 64", "ffn_hidden_size: 96"}) {
    EXPECT_THAT(printed.output, HasSubstr(line));
  }
  // Two ranks at tp2 saving every step (asynchronously), keeping the newest two, each with its Hugging Face copy
  // (checkpoint.also_save_hf_checkpoint), written by the last rank on a thread from the committed checkpoint.
  const fs::path ckpt = out / "ckpt";
  const auto trained = run_ranks(
      BRIDGE_PRETRAIN,
      {source, "model.seq_length=32", "train.train_iters=3", "train.eval_iters=0",
       "parallelism.tensor_model_parallel_size=2", "checkpoint.save=" + ckpt.string(), "checkpoint.save_interval=1",
       "checkpoint.most_recent_k=2", "checkpoint.async_save=true", "checkpoint.also_save_hf_checkpoint=true"},
      2, std::chrono::seconds(300));
  expect_all_ok(trained, "");
  EXPECT_THAT(trained.at(0).output, HasSubstr("loading the weights of the Hugging Face model"));
  expect_hf_checkpoints(ckpt, out);
  const auto disagreeing = run_command({BRIDGE_PRETRAIN, source, "model.hidden_size=128", "model.num_query_groups=2"},
                                       std::chrono::seconds(120));
  EXPECT_EQ(disagreeing.exit_code, 2) << disagreeing.output;
  EXPECT_THAT(disagreeing.output,
              AllOf(HasSubstr("takes the model from its config.json, but model.hidden_size (128, config.json: 64)"),
                    Not(HasSubstr("model.num_query_groups ("))));
  const auto missing = run_command({BRIDGE_PRETRAIN, "checkpoint.pretrained_checkpoint=hf:" + (out / "none").string()},
                                   std::chrono::seconds(120));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("config.json"));
  fs::remove_all(out);
}

// The exporter's errors: no checkpoint, a bad flag, an unknown model type.
TEST(HuggingFaceExportErrors, NamedWithTheirExitCodes) {
  const fs::path out = scratch("export_errors");
  const auto missing =
      run_command({BRIDGE_EXPORT, "--checkpoint", (out / "absent").string(), "--hf-dir", (out / "x").string()},
                  std::chrono::seconds(60));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("no latest_checkpointed_iteration.txt"));
  EXPECT_EQ(run_command({BRIDGE_EXPORT, "--hf-dir", "x"}, std::chrono::seconds(60)).exit_code, 2);
  const auto bad_type = run_command({BRIDGE_EXPORT, "--checkpoint", "c", "--hf-dir", "x", "--model-type", "bert"},
                                    std::chrono::seconds(60));
  EXPECT_EQ(bad_type.exit_code, 2);
  EXPECT_THAT(bad_type.output, HasSubstr("--model-type must be gpt2, llama, mistral, qwen2, qwen3, qwen2_moe, "
                                         "qwen3_moe, mixtral or olmoe, got 'bert'"));
  const auto bad_size = run_command({BRIDGE_EXPORT, "--checkpoint", "c", "--hf-dir", "x", "--max-shard-size", "5XB"},
                                    std::chrono::seconds(60));
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_THAT(bad_size.output, HasSubstr("--max-shard-size: '5XB' is not a size"));
  // --tokenizer and --hf-source are checked before the checkpoint is read.
  const auto no_tokenizer =
      run_command({BRIDGE_EXPORT, "--checkpoint", "c", "--hf-dir", "x", "--tokenizer", (out / "absent").string()},
                  std::chrono::seconds(60));
  EXPECT_EQ(no_tokenizer.exit_code, 2);
  EXPECT_THAT(no_tokenizer.output, HasSubstr("--tokenizer " + (out / "absent").string() + " does not exist"));
  const auto empty_tokenizer = run_command(
      {BRIDGE_EXPORT, "--checkpoint", "c", "--hf-dir", "x", "--tokenizer", out.string()}, std::chrono::seconds(60));
  EXPECT_EQ(empty_tokenizer.exit_code, 2);
  EXPECT_THAT(empty_tokenizer.output, HasSubstr("holds no tokenizer.json, tokenizer.model or vocab.json + merges.txt"));
  const auto no_source = run_command({BRIDGE_EXPORT, "--checkpoint", "c", "--hf-dir", "x", "--hf-source", out.string()},
                                     std::chrono::seconds(60));
  EXPECT_EQ(no_source.exit_code, 2);
  EXPECT_THAT(no_source.output, HasSubstr("--hf-source " + out.string() + " holds no config.json"));
  fs::remove_all(out);
}

// write_directory's failures, called directly: one inside the staging folder leaves an earlier export as it was, a
// failed first export leaves no directory, and a failed move into place leaves no staging folder; another tokenizer's
// ids replace the source's pad id too.
TEST(HuggingFaceExportFiles, AFailedExportLeavesTheDirectoryAsItWas) {
  using bridge::hf::detail::write_directory;
  const fs::path out = scratch("export_files");
  const nlohmann::json config = {{"model_type", "llama"}, {"max_position_embeddings", 64}};
  const auto no_staging_folder = [](const fs::path& directory) {
    for (const auto& entry : fs::directory_iterator(directory)) {
      EXPECT_THAT(entry.path().filename().string(), Not(HasSubstr(".bridge-export"))) << "a staging folder was left";
    }
  };
  // Two shards of 16 bytes: the earlier export.
  const fs::path exported = out / "exported";
  write_directory(exported, {{"a", torch::ones({4})}, {"b", torch::ones({4})}}, config, 16, {});
  std::ofstream(exported / "README.md") << "a file of the user's\n";
  const auto before = listing(exported);
  ASSERT_EQ(before.count("model-00001-of-00002.safetensors"), 1u);
  // Its second shard's tensor has a dtype safetensors has no name for, so write_safetensors throws once the first
  // shard (8 bytes of data now) is written. Written in place, that shard would have replaced the earlier export's
  // model-00001-of-00002.safetensors (another size and time) before the throw, and this listing would differ; only the
  // staging folder keeps it equal.
  const std::map<std::string, torch::Tensor> bad = {{"a", torch::zeros({2})},
                                                    {"b", torch::zeros({4}, torch::kComplexFloat)}};
  EXPECT_THROW(write_directory(exported, bad, config, 16, {}), std::invalid_argument);
  EXPECT_EQ(listing(exported), before) << "a failed export changed the directory";
  no_staging_folder(exported);
  // A failed first export makes no directory (nor the folders above it that it would have made).
  EXPECT_THROW(write_directory(out / "new" / "exported", bad, config, 16, {}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(out / "new"));
  // A file cannot move onto a directory of its name: the error says how far the move got, and the staging folder goes.
  const fs::path blocked = out / "blocked";
  fs::create_directories(blocked / "generation_config.json");
  try {
    write_directory(blocked, {{"a", torch::ones({4})}}, config, 16, {});
    ADD_FAILURE() << "moved a file onto a directory";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("moving the export into " + blocked.string() + " failed with 1 of its 3"),
                                HasSubstr("export again")));
  }
  no_staging_folder(blocked);
  // The source's ids and generation_config.json are kept; another tokenizer's bos/eos replace them, pad id included.
  const fs::path source = out / "source";
  fs::create_directories(source);
  std::ofstream(source / "config.json") << R"({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 7})";
  std::ofstream(source / "generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 7})";
  const auto read = [](const fs::path& file) {
    std::ifstream in(file);
    return nlohmann::json::parse(in);
  };
  bridge::hf::HfArtifacts artifacts;
  artifacts.source = source;
  write_directory(out / "same", {{"a", torch::ones({4})}}, config, 16, artifacts);
  EXPECT_EQ(read(out / "same" / "config.json").value("pad_token_id", -1), 7);
  EXPECT_EQ(read(out / "same" / "generation_config.json"), read(source / "generation_config.json"));
  artifacts.bos_token_id = 10;
  artifacts.eos_token_id = 11;
  write_directory(out / "other", {{"a", torch::ones({4})}}, config, 16, artifacts);
  for (const char* file : {"config.json", "generation_config.json"}) {
    const nlohmann::json written = read(out / "other" / file);
    EXPECT_EQ(written.value("bos_token_id", -1), 10) << file;
    EXPECT_EQ(written.value("eos_token_id", -1), 11) << file;
    EXPECT_FALSE(written.contains("pad_token_id")) << file << " kept the source tokenizer's pad id";
  }
  // An export that writes tokenizer files removes an earlier export's that it does not write (AutoTokenizer would read
  // an old tokenizer_config.json's eos_token with the new tokenizer.json); one that writes none keeps them, and a
  // file of the user's stays.
  const fs::path tokenized = out / "tokenized";
  std::ofstream(out / "tokenizer.json") << "{}\n";
  std::ofstream(out / "tokenizer_config.json") << R"({"eos_token": "[SEP]"})";
  bridge::hf::HfArtifacts with_config;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) with_config.files[name] = out / name;
  with_config.texts["special_tokens_map.json"] = "{}\n";
  write_directory(tokenized, {{"a", torch::ones({4})}}, config, 16, with_config);
  std::ofstream(tokenized / "README.md") << "a file of the user's\n";
  write_directory(tokenized, {{"a", torch::ones({4})}}, config, 16, {});
  EXPECT_TRUE(fs::exists(tokenized / "tokenizer_config.json")) << "an export without a tokenizer removed one";
  bridge::hf::HfArtifacts bare;
  bare.files["tokenizer.json"] = out / "tokenizer.json";
  write_directory(tokenized, {{"a", torch::ones({4})}}, config, 16, bare);
  EXPECT_TRUE(fs::exists(tokenized / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(tokenized / "README.md"));
  for (const char* stale : {"tokenizer_config.json", "special_tokens_map.json"}) {
    EXPECT_FALSE(fs::exists(tokenized / stale)) << stale << " of the earlier export survived";
  }
  fs::remove_all(out);
}

TEST(Safetensors, RoundTripsAndRefusesDamagedFiles) {
  const fs::path directory = scratch("safetensors");
  const std::map<std::string, torch::Tensor> tensors = {{"a", torch::randn({3, 5})},
                                                        {"b", torch::arange(7, torch::kInt64)},
                                                        {"c", torch::randn({2}).to(torch::kBFloat16)}};
  bridge::utils::write_safetensors(directory / "t.safetensors", tensors);
  const bridge::utils::Safetensors read = bridge::utils::read_safetensors(directory / "t.safetensors");
  EXPECT_EQ(read.metadata.at("format"), "pt");
  ASSERT_EQ(read.tensors.size(), 3u);
  for (const auto& [name, tensor] : tensors) EXPECT_TRUE(torch::equal(read.tensors.at(name), tensor)) << name;
  const auto expect_refused = [&](const std::string& bytes, const std::string& part) {
    std::ofstream(directory / "bad.safetensors", std::ios::binary) << bytes;
    try {
      bridge::utils::read_safetensors(directory / "bad.safetensors");
      ADD_FAILURE() << "read a damaged file: " << part;
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(part));
    }
  };
  std::ifstream in(directory / "t.safetensors", std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  expect_refused(good.substr(0, good.size() - 4), "outside the data");  // truncated data
  expect_refused(std::string("\xff\xff\0\0\0\0\0\0{}", 10), "runs past the file");
  expect_refused(good + "xxxx", "bytes after the last tensor");
  expect_refused(std::string("\x02\0\0\0\0\0\0\0[]", 10), "not a JSON object");
  expect_refused("\x01\x02", "shorter than");
  fs::remove_all(directory);
}

}  // namespace
