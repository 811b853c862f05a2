// The Hugging Face GPT-2 bridge against transformers itself (tests/tools/hf_gpt2.py, the tests' venv): a tiny random
// GPT2LMHeadModel loaded with checkpoint.pretrained_checkpoint=hf:<dir> gives transformers' logits to fp32 round-off
// at tp1, tp2, pp2 and pp2 x 2 virtual chunks (real ranks); after a training step, bridge-export writes a directory
// that GPT2LMHeadModel.from_pretrained loads, with the logits bridge had. Also the safetensors reader's errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/dist/spawn.h"
#include "utils/safetensors.h"

namespace {

namespace fs = std::filesystem;
using bridge::testing::describe;
using bridge::testing::expect_all_ok;
using bridge::testing::run_command;
using bridge::testing::run_ranks;
using ::testing::HasSubstr;

constexpr int64_t kVocab = 301;  // tests/tools/hf_gpt2.py's

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

void python(const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {BRIDGE_TOOLS_PYTHON, BRIDGE_HF_GPT2};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  const auto result = run_command(argv, std::chrono::seconds(300));
  ASSERT_EQ(result.exit_code, 0) << result.output
                                 << "\n(scripts/install_deps.sh installs transformers and safetensors in .venv)";
}

torch::Tensor logits_in(const fs::path& file) {
  return bridge::utils::read_safetensors(file).tensors.at("logits").slice(-1, 0, kVocab);
}

// One transformers model for the whole binary (each test is its own process: made once there).
struct Reference {
  fs::path directory, hf, ids, logits;
};
const Reference& reference() {
  static const Reference made = [] {
    Reference r;
    r.directory = scratch("reference");
    r.hf = r.directory / "gpt2";
    r.ids = r.directory / "ids.safetensors";
    r.logits = r.directory / "logits.safetensors";
    python({"make", r.hf.string(), r.ids.string(), r.logits.string()});
    return r;
  }();
  return made;
}

double max_difference(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

fs::path run_layout(const std::string& name, int tp, int pp, int vpp) {
  const Reference& r = reference();
  const fs::path out = scratch(name);
  const auto results = run_ranks(
      BRIDGE_GPT_WORKER,
      {"hf", r.hf.string(), r.ids.string(), out.string(), std::to_string(tp), std::to_string(pp), std::to_string(vpp)},
      tp * pp, std::chrono::seconds(300));
  expect_all_ok(results, "hf: ok");
  return out;
}

void expect_transformers_logits(const std::string& name, int tp, int pp, int vpp) {
  const fs::path out = run_layout(name, tp, pp, vpp);
  const torch::Tensor expected = logits_in(reference().logits);
  const torch::Tensor ours = logits_in(out / "start.safetensors");
  ASSERT_EQ(ours.sizes(), expected.sizes());
  const double difference = max_difference(ours, expected);
  std::printf("%s: largest difference to transformers' logits %.2e (logits up to %.2f)\n", name.c_str(), difference,
              expected.abs().max().item<double>());
  EXPECT_LT(difference, 2e-5) << name;  // GeLU's exact form instead of gelu_new moves them by 3.8e-4
  fs::remove_all(out);
}

// Every test needs transformers; a LibTorch 1.x install cannot have it.
class HuggingFaceGpt2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (has_transformers()) return;
    if (TORCH_VERSION_MAJOR < 2) GTEST_SKIP() << "transformers needs torch 2.x; this LibTorch 1.x install has none";
    FAIL() << BRIDGE_TOOLS_PYTHON << " has no transformers: run scripts/install_deps.sh";
  }
};

TEST_F(HuggingFaceGpt2, ImportedLogitsAreTransformersAtTp1) { expect_transformers_logits("tp1", 1, 1, 0); }
TEST_F(HuggingFaceGpt2, ImportedLogitsAreTransformersAtTp2) { expect_transformers_logits("tp2", 2, 1, 0); }
TEST_F(HuggingFaceGpt2, ImportedLogitsAreTransformersAtPp2) { expect_transformers_logits("pp2", 1, 2, 0); }
TEST_F(HuggingFaceGpt2, ImportedLogitsAreTransformersAtPp2WithVirtualChunks) {
  expect_transformers_logits("pp2vpp2", 1, 2, 2);
}

TEST_F(HuggingFaceGpt2, TrainedAtTp2ExportsToWhatTransformersLoads) {
  const fs::path out = run_layout("roundtrip", 2, 1, 0);
  const fs::path exported = out / "exported";
  const auto exporting =
      run_command({BRIDGE_EXPORT, "--checkpoint", (out / "ckpt").string(), "--hf-dir", exported.string()},
                  std::chrono::seconds(120));
  ASSERT_EQ(exporting.exit_code, 0) << exporting.output;
  python({"logits", exported.string(), reference().ids.string(), (out / "loaded.safetensors").string()});
  const torch::Tensor trained = logits_in(out / "end.safetensors");
  const torch::Tensor loaded = logits_in(out / "loaded.safetensors");
  const double difference = max_difference(loaded, trained);
  std::printf("trained at tp2, exported: largest difference of transformers' logits to bridge's %.2e\n", difference);
  EXPECT_LT(difference, 2e-5);
  EXPECT_GT(max_difference(trained, logits_in(out / "start.safetensors")), 1e-4) << "the step changed the model";
  // The exporter's errors: no checkpoint, a bad flag.
  const auto missing =
      run_command({BRIDGE_EXPORT, "--checkpoint", (out / "absent").string(), "--hf-dir", (out / "x").string()},
                  std::chrono::seconds(60));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.output, HasSubstr("no latest_checkpointed_iteration.txt"));
  EXPECT_EQ(run_command({BRIDGE_EXPORT, "--hf-dir", "x"}, std::chrono::seconds(60)).exit_code, 2);
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
