// Blended data against an independent NumPy port of megatron-core's blend arithmetic
// (tests/tools/megatron_blend_indices.py): the weights normalised to the last bit (NumPy's pairwise sum), the sizes
// each dataset is built with, the weighted and the exhaustive blending indices; then data_path's forms, and the
// datasets build_gpt_datasets blends from two indexed datasets.
#include "training/datasets/blended_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/unit/datasets_test_support.h"
#include "training/config/config.h"
#include "training/datasets/gpt_dataset.h"

namespace bridge::training::datasets {
namespace {

using ::testing::HasSubstr;
using testing::read_bytes;
using testing::run_python_tool;
using testing::ScratchDir;
using testing::write_reference_dataset;

// The reference's answer for `arguments` (a file of its own: the test's ScratchDir is in use).
nlohmann::json reference(const std::string& arguments) {
  static int calls = 0;
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("bridge_blend_reference_" + std::to_string(::getpid()) + "_" + std::to_string(calls++)))
                              .string();
  run_python_tool("megatron_blend_indices.py' " + arguments + " > '" + out + "'");
  const nlohmann::json result = nlohmann::json::parse(read_bytes(out));
  std::filesystem::remove(out);
  return result;
}

std::string hex(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%a", value);
  return text;
}

// Python's float.hex() and C's %a differ in spelling ("0x1.3333333333333p-2" vs "0x1.3333333333333p-2"; for 1.0,
// "0x1.0000000000000p+0" vs "0x1p+0"): compare the values they spell.
double from_hex(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

std::string joined(const std::vector<double>& weights) {
  std::string text;
  for (const double weight : weights) text += " " + hex(weight);
  return text;
}

TEST(BlendTest, WeightsNormaliseToNumpysLastBit) {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> uniform(0.001, 1000.0);
  // Below 8, up to 128 and beyond: the three shapes of NumPy's pairwise sum.
  for (const int count : {2, 3, 7, 9, 17, 64, 129, 300}) {
    std::vector<double> weights;
    for (int i = 0; i < count; ++i) weights.push_back(uniform(random));
    const nlohmann::json expected = reference("weighted 0.005 1" + joined(weights));
    const std::vector<double> ours = normalize_weights(weights);
    ASSERT_EQ(expected["weights"].size(), ours.size());
    for (std::size_t i = 0; i < ours.size(); ++i) {
      ASSERT_EQ(ours[i], from_hex(expected["weights"][i].get<std::string>())) << count << " weights, weight " << i;
    }
  }
}

TEST(BlendTest, WeightedIndicesAndSizesMatchMegatron) {
  for (const auto& [weights, size] : std::vector<std::pair<std::vector<double>, int64_t>>{
           {{0.3, 0.7}, 881}, {{30, 70}, 7}, {{1.0}, 50}, {{0.2, 0.5, 0.1, 0.2}, 1000}, {{1, 1, 1}, 999}}) {
    const nlohmann::json expected = reference("weighted 0.005 " + std::to_string(size) + joined(weights));
    const std::vector<double> normalized = normalize_weights(weights);
    int64_t blend_size = 0;
    for (std::size_t d = 0; d < weights.size(); ++d) {
      const double share = std::ceil(static_cast<double>(size) * normalized[d]);
      blend_size += static_cast<int64_t>(share);
      EXPECT_EQ(static_cast<int64_t>(std::ceil(share * 1.005)), expected["built"][d].get<int64_t>());
    }
    ASSERT_EQ(blend_size, expected["size"].get<int64_t>());
    const BlendingIndices ours = build_blending_indices(normalize_weights(normalized), blend_size);
    EXPECT_EQ(std::vector<int64_t>(ours.dataset_index.begin(), ours.dataset_index.end()),
              expected["dataset_index"].get<std::vector<int64_t>>());
    EXPECT_EQ(ours.dataset_sample_index, expected["dataset_sample_index"].get<std::vector<int64_t>>());
  }
  // The blend asks for 882 samples of 881 (265 + 617): Megatron's ceil per dataset.
  EXPECT_EQ(reference("weighted 0.005 881 0.3 0.7")["size"].get<int64_t>(), 882);
  // Megatron's first steps for 0.3/0.7, from its helpers.cpp.
  const BlendingIndices first = build_blending_indices({0.3, 0.7}, 8);
  EXPECT_EQ(std::vector<int>(first.dataset_index.begin(), first.dataset_index.end()),
            (std::vector<int>{1, 0, 1, 1, 0, 1, 1, 0}));
}

TEST(BlendTest, ExhaustiveIndicesMatchMegatron) {
  for (const std::vector<int64_t>& sizes : std::vector<std::vector<int64_t>>{{3, 1, 2}, {40, 13, 27, 1}, {5, 5}}) {
    std::string arguments = "exhaustive";
    for (const int64_t size : sizes) arguments += " " + std::to_string(size);
    const nlohmann::json expected = reference(arguments);
    const BlendingIndices ours = build_exhaustive_blending_indices(sizes);
    EXPECT_EQ(std::vector<int64_t>(ours.dataset_index.begin(), ours.dataset_index.end()),
              expected["dataset_index"].get<std::vector<int64_t>>());
    EXPECT_EQ(ours.dataset_sample_index, expected["dataset_sample_index"].get<std::vector<int64_t>>());
  }
}

TEST(BlendTest, DataPathFormsAreMegatrons) {
  const Blend weighted = parse_blend({"0.3", "/d/a", "0.7", "/d/b"});
  EXPECT_EQ(weighted.prefixes, (std::vector<std::string>{"/d/a", "/d/b"}));
  EXPECT_EQ(weighted.weights, (std::vector<double>{0.3, 0.7}));
  const Blend one_string = parse_blend({"0.3 /d/a 0.7 /d/b"});
  EXPECT_EQ(one_string.prefixes, weighted.prefixes);
  EXPECT_EQ(one_string.weights, weighted.weights);
  EXPECT_EQ(parse_blend({"1.0 /d/a"}).weights, std::vector<double>{1.0});
  const Blend unweighted = parse_blend({"/d/a", "/d/b"});
  EXPECT_EQ(unweighted.prefixes.size(), 2u);
  EXPECT_TRUE(unweighted.weights.empty());
  EXPECT_TRUE(parse_blend({"/d/a", "/d/b", "/d/c"}).weights.empty());           // odd: prefixes
  EXPECT_EQ(parse_blend({"0.3", "/d/a", "/d/b", "/d/c"}).prefixes.size(), 4u);  // a weight that is not one
  // A path with a space that names a dataset stays whole.
  ScratchDir dir;
  write_reference_dataset(dir / "b c", "uint16", 3);
  EXPECT_EQ(parse_blend({dir / "b c"}).prefixes, std::vector<std::string>{dir / "b c"});
  for (const char* weight : {"0", "-1", "inf", "nan"}) {
    EXPECT_THAT(
        [&] {
          parse_blend({weight, "/d/a"});
        },
        ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("dataset.data_path: the weight")))
        << weight;
  }
}

ConfigContainer blend_config(const ScratchDir& dir) {
  ConfigContainer config = testing::data_config(dir);
  config.train.train_iters = 50;
  config.train.eval_interval = 25;
  config.dataset.data_path = {"0.3", dir / "a", "0.7", dir / "b"};
  return config;
}

TEST(BlendTest, BuildGPTDatasetsBlendsInMegatronsOrder) {
  ScratchDir dir;
  write_reference_dataset(dir / "a", "uint16", 300);
  write_reference_dataset(dir / "b", "uint16", 400);
  const ConfigContainer config = blend_config(dir);
  const GPTDatasets datasets = build_gpt_datasets(config);
  ASSERT_TRUE(datasets.train && datasets.valid && datasets.test);
  const auto& train = dynamic_cast<const BlendedDataset&>(*datasets.train);
  // 200 train samples: a built for ceil(ceil(200 x 0.3) x 1.005) = 61, b for ceil(140 x 1.005) = 141.
  const nlohmann::json expected = reference("weighted 0.005 200 0.3 0.7");
  ASSERT_EQ(train.size(), expected["size"].get<int64_t>());
  const auto& a = dynamic_cast<const IndexedGPTDataset&>(*train.datasets()[0]);
  const auto& b = dynamic_cast<const IndexedGPTDataset&>(*train.datasets()[1]);
  EXPECT_EQ(a.num_samples(), expected["built"][0].get<int64_t>());
  EXPECT_EQ(b.num_samples(), expected["built"][1].get<int64_t>());
  for (int64_t i = 0; i < train.size(); ++i) {
    const int64_t d = expected["dataset_index"][i].get<int64_t>();
    const int64_t j = expected["dataset_sample_index"][i].get<int64_t>();
    ASSERT_TRUE(torch::equal(train.sample(i), (d == 0 ? a : b).sample(j))) << "sample " << i;
  }
  // Each dataset is split by its own size: b's train split holds its first 320 of 400 sequences.
  for (const int64_t document : b.document_index()) EXPECT_LT(document, 320);
  // The same blend written as one string, and an unweighted blend of every sample once.
  ConfigContainer one_string = config;
  one_string.dataset.data_path = {"0.3 " + (dir / "a") + " 0.7 " + (dir / "b")};
  const GPTDatasets same_datasets = build_gpt_datasets(one_string);
  const auto& same = dynamic_cast<const BlendedDataset&>(*same_datasets.train);
  EXPECT_EQ(same.indices().dataset_sample_index, train.indices().dataset_sample_index);
  ConfigContainer unweighted = config;
  unweighted.dataset.data_path = {dir / "a", dir / "b"};
  const GPTDatasets all_datasets = build_gpt_datasets(unweighted);
  const auto& all = dynamic_cast<const BlendedDataset&>(*all_datasets.train);
  EXPECT_EQ(all.size(), 200) << "the 200 samples asked for, of the datasets' one epoch each";
  EXPECT_EQ(all.datasets()[0]->size() + all.datasets()[1]->size() >= 200, true);
}

TEST(BlendTest, ABlendThatOverdrawsADatasetNamesTheSurplus) {
  ScratchDir dir;
  write_reference_dataset(dir / "a", "uint16", 300);
  write_reference_dataset(dir / "b", "uint16", 300);
  std::vector<std::shared_ptr<const training::GPTDataset>> parts;
  GPTDatasetConfig config;
  config.seq_length = 8;
  config.path_to_cache = dir / "cache";
  for (const char* name : {"a", "b"}) {
    parts.push_back(std::make_shared<IndexedGPTDataset>(std::make_shared<const IndexedDataset>(dir / name),
                                                        Split::kTrain, SequenceRange{0, 10}, 0, config));
  }
  EXPECT_THAT(
      [&] {
        BlendedDataset(parts, {0.5, 0.5}, 1000);
      },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("dataset.mid_level_dataset_surplus")));
}

}  // namespace
}  // namespace bridge::training::datasets
