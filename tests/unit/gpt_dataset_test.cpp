// GPT sampling against an independent NumPy port of Megatron-Core's GPTDataset (tests/tools/megatron_gpt_indices.py):
// the cached document, sample and shuffle index files byte for byte and the first samples' tokens, for one epoch,
// several epochs with and without a separate final epoch, and a split that does not start at 0. Also the split
// rounding, NumPy's shuffle, MD5, the .npy reader, the cache (reuse, corruption, staleness, concurrent builders) and
// build_gpt_datasets' config handling.
#include "training/datasets/gpt_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "tests/unit/datasets_test_support.h"
#include "training/config/config.h"
#include "training/datasets/md5.h"
#include "training/datasets/npy.h"
#include "training/datasets/numpy_random_state.h"

namespace bridge::training::datasets {
namespace {

using testing::data_config;
using ::testing::HasSubstr;
using testing::read_bytes;
using testing::run_python_tool;
using testing::ScratchDir;
using testing::write_bytes;
using testing::write_reference_dataset;

TEST(SplitTest, ParsesAndNormalisesLikeMegatron) {
  EXPECT_THAT(parse_split("969,30,1"), ::testing::ElementsAre(0.969, 0.03, 0.001));
  EXPECT_THAT(parse_split("1/1"), ::testing::ElementsAre(0.5, 0.5, 0.0));
  EXPECT_THAT(parse_split("2"), ::testing::ElementsAre(1.0, 0.0, 0.0));
  for (const std::string bad : {"", "a,b", "0,0,0", "1,2,3,4", "-1,2"}) {
    try {
      parse_split(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("dataset.split"));
    }
  }
}

std::vector<std::pair<int64_t, int64_t>> bounds(const std::string& split, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> result;
  for (const SequenceRange& r : split_ranges(parse_split(split), n)) result.emplace_back(r.begin, r.end);
  return result;
}

TEST(SplitTest, BoundsRoundHalfToEven) {
  using P = std::pair<int64_t, int64_t>;
  EXPECT_THAT(bounds("969,30,1", 1000), ::testing::ElementsAre(P{0, 969}, P{969, 999}, P{999, 1000}));
  // 0.5 x 5 = 2.5 rounds to 2 (Python's round), 0.5 x 7 = 3.5 to 4; std::round would give 3 and 4.
  EXPECT_THAT(bounds("1,1", 5), ::testing::ElementsAre(P{0, 2}, P{2, 5}, P{0, 0}));
  EXPECT_THAT(bounds("1,1", 7), ::testing::ElementsAre(P{0, 4}, P{4, 7}, P{0, 0}));
  // 0.25 x 2 = 0.5 -> 0, 0.5 x 2 = 1, 1 x 2 = 2.
  EXPECT_THAT(bounds("1,1,2", 2), ::testing::ElementsAre(P{0, 0}, P{0, 1}, P{1, 2}));
  EXPECT_THAT(bounds("8,1,1", 10), ::testing::ElementsAre(P{0, 8}, P{8, 9}, P{9, 10}));
}

TEST(NumpyRandomStateTest, ShufflesLikeNumpy) {
  ScratchDir dir;
  // Two consecutive shuffles from one RandomState, as GPTDataset makes them, of sizes that exercise the masks.
  const std::string out = dir / "shuffled.npy";
  const std::string script =
      "import numpy, sys; rs = numpy.random.RandomState(1234); a = numpy.arange(1000, dtype=numpy.int32); "
      "rs.shuffle(a); b = numpy.arange(37, dtype=numpy.uint32); rs.shuffle(b); "
      "numpy.save(sys.argv[1], numpy.concatenate([a.astype(numpy.int64), b.astype(numpy.int64)]))";
  ASSERT_EQ(std::system(("'" BRIDGE_NUMPY_PYTHON "' -c '" + script + "' '" + out + "'").c_str()), 0);
  NumpyRandomState random(1234);
  std::vector<int64_t> a(1000), b(37);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  random.shuffle(a);
  random.shuffle(b);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(load_npy(out).values, a);
  EXPECT_THROW(NumpyRandomState(uint64_t{1} << 32), std::invalid_argument);
}

TEST(Md5Test, KnownDigests) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("The quick brown fox jumps over the lazy dog"), "9e107d9d372bb6826bd81d3542a419d6");
  // RFC 1321's 80-character vector crosses a block boundary.
  EXPECT_EQ(md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "57edf4a22be3c955ac49da2e2107b67a");
  // Padding edge cases: 55, 56, 63 and 64 bytes.
  EXPECT_EQ(md5_hex(std::string(55, 'a')), "ef1772b6dff9a122358552954ad0df65");
  EXPECT_EQ(md5_hex(std::string(56, 'a')), "3b0c8ac703f828b04c6c197006d17218");
  EXPECT_EQ(md5_hex(std::string(63, 'a')), "b06521f39153d618550606be297466d5");
  EXPECT_EQ(md5_hex(std::string(64, 'a')), "014842d480b571495a4a0363793f7367");
}

TEST(NpyTest, ReadsNumpyFilesAndRejectsDamagedOnes) {
  ScratchDir dir;
  const std::string script =
      "import numpy, sys; d = sys.argv[1]; "
      "numpy.save(d + '/a.npy', numpy.array([[1, -2], [3, 2147483647]], dtype=numpy.int32)); "
      "numpy.save(d + '/b.npy', numpy.array([4294967295, 0, 7], dtype=numpy.uint32)); "
      "numpy.save(d + '/c.npy', numpy.arange(3, dtype=numpy.int64) - 2**40); "
      "numpy.save(d + '/f.npy', numpy.zeros(3, dtype=numpy.float32))";
  ASSERT_EQ(std::system(("'" BRIDGE_NUMPY_PYTHON "' -c \"" + script + "\" '" + dir.path().string() + "'").c_str()), 0);
  const NpyArray a = load_npy(dir / "a.npy");
  EXPECT_EQ(a.type, NpyType::kInt32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a.values, (std::vector<int64_t>{1, -2, 3, 2147483647}));
  EXPECT_EQ(load_npy(dir / "b.npy").values, (std::vector<int64_t>{4294967295, 0, 7}));
  const int64_t t = int64_t{1} << 40;
  EXPECT_EQ(load_npy(dir / "c.npy").values, (std::vector<int64_t>{-t, 1 - t, 2 - t}));
  // Written back, byte for byte what numpy.save wrote.
  save_npy(dir / "a2.npy", NpyType::kInt32, {2, 2}, a.values);
  EXPECT_EQ(read_bytes(dir / "a2.npy"), read_bytes(dir / "a.npy"));
  save_npy(dir / "b2.npy", NpyType::kUInt32, {3}, {4294967295, 0, 7});
  EXPECT_EQ(read_bytes(dir / "b2.npy"), read_bytes(dir / "b.npy"));
  EXPECT_THROW(save_npy(dir / "x.npy", NpyType::kUInt32, {1}, {-1}), std::invalid_argument);

  const auto expect_bad = [&](const std::string& name, const std::string& part) {
    try {
      load_npy(dir / name);
      ADD_FAILURE() << "loaded " << name;
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(part)) << name;
      EXPECT_THAT(e.what(), HasSubstr(dir / name));
    }
  };
  expect_bad("f.npy", "element type '<f4'");
  const std::string good = read_bytes(dir / "c.npy");
  write_bytes(dir / "short.npy", good.substr(0, good.size() - 1));
  expect_bad("short.npy", "truncated");
  write_bytes(dir / "magic.npy", "PK" + good.substr(2));
  expect_bad("magic.npy", "bad magic");
  write_bytes(dir / "tiny.npy", good.substr(0, 20));
  expect_bad("tiny.npy", "truncated header");
  std::string huge = good;
  huge.replace(huge.find("(3,)"), 4, "(9999999999999,)");
  write_bytes(dir / "huge.npy", huge);
  expect_bad("huge.npy", "shape");
}

// One comparison against the Python reference: the C++ dataset's cache files must equal the reference's .npy files
// byte for byte, and its first samples the reference's.
struct Case {
  std::string dtype;
  int documents;
  SequenceRange range;
  int64_t num_samples, seq_length;
  uint64_t seed;
  int64_t expected_epochs;
  bool expected_separate;
};

void compare_with_reference(const Case& c) {
  ScratchDir dir;
  const std::string prefix = dir / "data";
  write_reference_dataset(prefix, c.dtype, c.documents);
  const std::string reference = dir / "reference";
  const int checked = 40;
  run_python_tool("megatron_gpt_indices.py' '" + prefix + "' " + std::to_string(c.range.begin) + " " +
                  std::to_string(c.range.end) + " " + std::to_string(c.num_samples) + " " +
                  std::to_string(c.seq_length) + " " + std::to_string(c.seed) + " '" + reference + "' " +
                  std::to_string(checked));
  const std::string info = read_bytes(reference + "/info.txt");
  ASSERT_EQ(info, std::to_string(c.expected_epochs) + " " + (c.expected_separate ? "1" : "0") + "\n")
      << "the case does not exercise the branch it is meant to";

  GPTDatasetConfig config;
  config.seq_length = c.seq_length;
  config.random_seed = c.seed;
  config.path_to_cache = dir / "cache";
  IndexedGPTDataset dataset(std::make_shared<const IndexedDataset>(prefix), Split::kValid, c.range, c.num_samples,
                            config);
  EXPECT_EQ(dataset.num_epochs(), c.expected_epochs);
  EXPECT_GE(dataset.size(), c.num_samples);
  for (const std::string name : {"document_index", "sample_index", "shuffle_index"}) {
    const std::string ours = read_bytes(dataset.cache_path_prefix() + name + ".npy");
    ASSERT_FALSE(ours.empty()) << name;
    EXPECT_EQ(ours, read_bytes(reference + "/" + name + ".npy")) << name << " differs from Megatron's";
  }
  const NpyArray samples = load_npy(reference + "/samples.npy");
  ASSERT_EQ(samples.shape, (std::vector<int64_t>{std::min<int64_t>(checked, dataset.size()), c.seq_length + 1}));
  for (int64_t i = 0; i < samples.shape[0]; ++i) {
    const torch::Tensor sample = dataset.sample(i);
    ASSERT_EQ(sample.numel(), c.seq_length + 1);
    const std::vector<int64_t> ours(sample.data_ptr<int64_t>(), sample.data_ptr<int64_t>() + sample.numel());
    const std::vector<int64_t> expected(samples.values.begin() + i * (c.seq_length + 1),
                                        samples.values.begin() + (i + 1) * (c.seq_length + 1));
    ASSERT_EQ(ours, expected) << "sample " << i;
  }
}

// 50 documents of 1..13 tokens (344 tokens); the first 40 hold 274, 34 samples of 8 per epoch.
TEST(IndexedGPTDatasetTest, OneEpochMatchesMegatron) {
  compare_with_reference({"uint16", 50, {0, 40}, 30, 8, 1234, 1, false});
}

TEST(IndexedGPTDatasetTest, SeparateFinalEpochMatchesMegatron) {
  // 38 samples need 2 epochs, the second only 4 samples' worth (< 80% of 34): a separate final epoch.
  compare_with_reference({"uint16", 50, {0, 40}, 38, 8, 1234, 2, true});
}

TEST(IndexedGPTDatasetTest, ManyEpochsWithoutSeparationMatchMegatron) {
  // 64 samples need 2 epochs, the second used 30/34 >= 80%: no separate final epoch.
  compare_with_reference({"uint16", 50, {0, 40}, 64, 8, 1234, 2, false});
  // Five epochs, the last barely used; int32 tokens; a split that starts at sequence 40; another seed.
  compare_with_reference({"int32", 50, {40, 50}, 60, 5, 7, 5, true});
}

TEST(IndexedGPTDatasetTest, RejectsSplitsTooSmallToSample) {
  ScratchDir dir;
  write_reference_dataset(dir / "data", "uint16", 3);  // documents of 1, 8 and 2 tokens
  auto indexed = std::make_shared<const IndexedDataset>(dir / "data");
  GPTDatasetConfig config;
  config.seq_length = 4;
  config.use_cache = false;
  EXPECT_THAT(
      [&] {
        IndexedGPTDataset(indexed, Split::kTrain, {0, 1}, 5, config);
      },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("1 tokens, but a sample needs at least 2")));
  config.seq_length = 100;
  EXPECT_THAT(
      [&] {
        IndexedGPTDataset(indexed, Split::kTrain, {0, 3}, 0, config);
      },
      ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("too few for one sample")));
  // Requested samples repeat the split as often as needed, even a short one.
  IndexedGPTDataset repeated(indexed, Split::kTrain, {0, 3}, 3, config);
  EXPECT_EQ(repeated.num_epochs(), 28);
  EXPECT_EQ(repeated.size(), 3);
  EXPECT_THROW(IndexedGPTDataset(indexed, Split::kTrain, {2, 4}, 1, config), std::invalid_argument);
}

GPTDatasetConfig cached_config(const ScratchDir& dir) {
  GPTDatasetConfig config;
  config.seq_length = 8;
  config.random_seed = 99;
  config.path_to_cache = dir / "cache";
  return config;
}

std::vector<int64_t> all_tokens(const IndexedGPTDataset& dataset) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const torch::Tensor s = dataset.sample(i);
    tokens.insert(tokens.end(), s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
  }
  return tokens;
}

TEST(IndexedGPTDatasetTest, CacheIsWrittenReusedAndRebuiltWhenDamaged) {
  ScratchDir dir;
  write_reference_dataset(dir / "data", "uint16", 30);
  auto indexed = std::make_shared<const IndexedDataset>(dir / "data");
  const GPTDatasetConfig config = cached_config(dir);
  IndexedGPTDataset first(indexed, Split::kTrain, {0, 30}, 20, config);
  EXPECT_FALSE(first.loaded_from_cache());
  const std::string prefix = first.cache_path_prefix();
  EXPECT_EQ(prefix, dir / ("cache/" + md5_hex(first.description()) + "-GPTDataset-train-"));
  EXPECT_EQ(read_bytes(prefix + "description.txt"), first.description());
  EXPECT_THAT(first.description(), HasSubstr("\"random_seed\": 99"));

  IndexedGPTDataset second(indexed, Split::kTrain, {0, 30}, 20, config);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.shuffle_index(), first.shuffle_index());
  EXPECT_EQ(all_tokens(second), all_tokens(first));

  // Damaged cache files are rebuilt (and rewritten), never trusted.
  const std::string shuffle = read_bytes(prefix + "shuffle_index.npy");
  // The digests are md5sum's lines, one per file.
  EXPECT_THAT(
      read_bytes(prefix + "indices.md5"),
      HasSubstr(md5_hex(shuffle) + "  " + testing::fs::path(prefix + "shuffle_index.npy").filename().string() + "\n"));
  for (const std::string damage : {"garbage", "truncate", "out_of_range", "in_range", "no_digests"}) {
    SCOPED_TRACE(damage);
    if (damage == "in_range") {  // two samples swapped: a valid permutation, only the digest can tell
      std::vector<int64_t> values = load_npy(prefix + "shuffle_index.npy").values;
      std::swap(values[0], values[1]);
      save_npy(prefix + "shuffle_index.npy", NpyType::kUInt32, {static_cast<int64_t>(values.size())}, values);
    }
    if (damage == "no_digests") testing::fs::remove(prefix + "indices.md5");
    if (damage == "garbage") write_bytes(prefix + "shuffle_index.npy", "not numpy at all");
    if (damage == "truncate") write_bytes(prefix + "shuffle_index.npy", shuffle.substr(0, shuffle.size() - 4));
    if (damage == "out_of_range") {
      std::vector<int64_t> values = load_npy(prefix + "shuffle_index.npy").values;
      values[0] = 1000000;
      save_npy(prefix + "shuffle_index.npy", NpyType::kUInt32, {static_cast<int64_t>(values.size())}, values);
    }
    IndexedGPTDataset rebuilt(indexed, Split::kTrain, {0, 30}, 20, config);
    EXPECT_FALSE(rebuilt.loaded_from_cache());
    EXPECT_EQ(all_tokens(rebuilt), all_tokens(first));
    EXPECT_EQ(read_bytes(prefix + "shuffle_index.npy"), shuffle);
  }
  // A different sample count, seed or split is another cache entry.
  EXPECT_FALSE(IndexedGPTDataset(indexed, Split::kTrain, {0, 30}, 21, config).loaded_from_cache());
  EXPECT_FALSE(IndexedGPTDataset(indexed, Split::kTrain, {0, 29}, 20, config).loaded_from_cache());
  // Without caching nothing is written.
  GPTDatasetConfig uncached = config;
  uncached.use_cache = false;
  uncached.path_to_cache = dir / "nowhere";
  EXPECT_FALSE(IndexedGPTDataset(indexed, Split::kTrain, {0, 30}, 20, uncached).loaded_from_cache());
  EXPECT_FALSE(testing::fs::exists(dir / "nowhere"));
}

TEST(IndexedGPTDatasetTest, RebuiltDatasetDoesNotReuseStaleIndices) {
  ScratchDir dir;
  write_reference_dataset(dir / "data", "uint16", 30);
  const GPTDatasetConfig config = cached_config(dir);
  std::string old_prefix;
  {
    IndexedGPTDataset old(std::make_shared<const IndexedDataset>(dir / "data"), Split::kTrain, {0, 30}, 20, config);
    old_prefix = old.cache_path_prefix();
  }
  // Same path and document count, other lengths: the indices of the old files would be wrong here.
  IndexedDatasetBuilder builder(dir / "data", DType::kUInt16);
  for (int i = 0; i < 30; ++i) builder.add_document(std::vector<int64_t>(static_cast<std::size_t>(i % 4 + 2), i));
  builder.finalize();
  IndexedGPTDataset fresh(std::make_shared<const IndexedDataset>(dir / "data"), Split::kTrain, {0, 30}, 20, config);
  EXPECT_FALSE(fresh.loaded_from_cache());
  EXPECT_NE(fresh.cache_path_prefix(), old_prefix);
  for (int64_t i = 0; i < fresh.size(); ++i) fresh.sample(i);
}

// Ranks of one job build the same cache at once: every builder gets the same indices and the cache stays whole.
TEST(IndexedGPTDatasetTest, ConcurrentBuildersAgree) {
  ScratchDir dir;
  write_reference_dataset(dir / "data", "uint16", 50);
  auto indexed = std::make_shared<const IndexedDataset>(dir / "data");
  const GPTDatasetConfig config = cached_config(dir);
  std::vector<std::vector<int64_t>> shuffles(8);
  std::vector<std::thread> threads;
  std::atomic<std::size_t> ready{0};
  for (std::size_t t = 0; t < shuffles.size(); ++t) {
    threads.emplace_back([&, t] {
      ++ready;
      while (ready.load() < shuffles.size()) std::this_thread::yield();  // start together, all finding no cache
      IndexedGPTDataset dataset(indexed, Split::kTrain, {0, 50}, 200, config);
      shuffles[t] = dataset.shuffle_index();
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& shuffle : shuffles) EXPECT_EQ(shuffle, shuffles[0]);
  IndexedGPTDataset after(indexed, Split::kTrain, {0, 50}, 200, config);
  EXPECT_TRUE(after.loaded_from_cache());
  EXPECT_EQ(after.shuffle_index(), shuffles[0]);
  int files = 0;
  for (const auto& entry : testing::fs::directory_iterator(dir / "cache")) {
    EXPECT_THAT(entry.path().string(), ::testing::Not(HasSubstr(".tmp"))) << entry.path();
    ++files;
  }
  EXPECT_EQ(files, 5);  // three .npy, their digests and the description
}

TEST(BuildGPTDatasetsTest, SplitsSampleCountsAndCache) {
  ScratchDir dir;
  write_reference_dataset(dir / "data", "uint16", 100);
  ConfigContainer config = data_config(dir);
  EXPECT_THAT(train_valid_test_num_samples(config), ::testing::ElementsAre(20, (5 / 2 + 1) * 2 * 4, 8));
  const GPTDatasets datasets = build_gpt_datasets(config);
  ASSERT_TRUE(datasets.train && datasets.valid && datasets.test);
  const auto& train = dynamic_cast<const IndexedGPTDataset&>(*datasets.train);
  const auto& valid = dynamic_cast<const IndexedGPTDataset&>(*datasets.valid);
  EXPECT_GE(train.size(), 20);
  EXPECT_GE(valid.size(), 24);
  EXPECT_EQ(train.seq_length(), 8);
  // The train split is sequences [0, 80): every document index entry is inside it; valid is [80, 90).
  for (const int64_t d : train.document_index()) EXPECT_LT(d, 80);
  for (const int64_t d : valid.document_index()) EXPECT_TRUE(d >= 80 && d < 90) << d;
  EXPECT_THAT(train.cache_path_prefix(), HasSubstr(dir / "cache/"));
  EXPECT_TRUE(dynamic_cast<const IndexedGPTDataset&>(*build_gpt_datasets(config).train).loaded_from_cache());

  // Megatron's weighted form of one dataset (a blend of one, as megatron-core builds it), and a .bin name instead of
  // the prefix.
  config.dataset.data_path = {"1.0", dir / "data"};
  EXPECT_EQ(build_gpt_datasets(config).train->size(), 20);
  config.dataset.data_path = {dir / "data.bin"};
  EXPECT_TRUE(build_gpt_datasets(config).train);

  // No evaluation: no valid or test dataset; a zero proportion: none for that split.
  config.train.eval_iters = 0;
  GPTDatasets no_eval = build_gpt_datasets(config);
  EXPECT_TRUE(no_eval.train && !no_eval.valid && !no_eval.test);
  config.train.eval_iters = 2;
  config.dataset.split = "9,1,0";
  EXPECT_FALSE(build_gpt_datasets(config).test);
}

TEST(BuildGPTDatasetsTest, ConfigErrorsNameTheField) {
  ScratchDir dir;
  write_reference_dataset(dir / "data", "uint16", 20);
  const auto expect_error = [&](ConfigContainer config, const std::string& part) {
    try {
      build_gpt_datasets(config);
      ADD_FAILURE() << "accepted a config that should name " << part;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(part));
    }
  };
  ConfigContainer config = data_config(dir);
  config.dataset.data_path = {"0", dir / "data", "1", dir / "data"};
  expect_error(config, "dataset.data_path: the weight '0'");
  config = data_config(dir);
  config.dataset.split = "98,1,1";  // 20 x 0.01 rounds to no valid sequence
  expect_error(config, "dataset.split");
  config = data_config(dir);
  config.rng.seed = uint64_t{1} << 33;
  expect_error(config, "rng.seed");
  // validate() catches the split and the seed before anything is built.
  config = data_config(dir);
  config.dataset.split = "a,b";
  EXPECT_THAT([&] { config.validate(1); }, ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("dataset.split")));
  config = data_config(dir);
  config.rng.seed = uint64_t{1} << 33;
  EXPECT_THAT([&] { config.validate(1); }, ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("rng.seed")));
  config = data_config(dir);
  EXPECT_NO_THROW(config.validate(1));
  config.dataset.data_path = {dir / "absent"};
  EXPECT_THROW(build_gpt_datasets(config), std::runtime_error);

  // Token ids the model cannot embed are found at startup (dataset.validate_tokens, on by default for small data),
  // naming the first one's document; document 1 starts with 1009 (known_document).
  config = data_config(dir);
  config.model.vocab_size = 1000;
  EXPECT_THAT([&] { build_gpt_datasets(config); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  ::testing::AllOf(HasSubstr("token id 1009 (document 1, sequence 1, token 0)"),
                                   HasSubstr("model.vocab_size = 1000"), HasSubstr("dataset.validate_tokens=false"))));
  config.model.vocab_size = 65536;
  EXPECT_NO_THROW(build_gpt_datasets(config));
  // Negative ids (a signed dtype) are as wrong as large ones.
  write_reference_dataset(dir / "signed", "int32", 20);
  {
    std::string bin = read_bytes(dir / "signed.bin");
    const int32_t negative = -5;
    std::memcpy(bin.data() + 4 * 3, &negative, 4);  // token 3 of the file: document 0 has one token
    write_bytes(dir / "signed.bin", bin);
  }
  config.dataset.data_path = {dir / "signed"};
  config.model.vocab_size = std::numeric_limits<int32_t>::max();
  EXPECT_THAT([&] { build_gpt_datasets(config); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                                       HasSubstr("token id -5 (document 1, sequence 1, token 2)")));

  // Unchecked (dataset.validate_tokens=false), they are an error when sampled, naming model.vocab_size.
  config = data_config(dir);
  config.model.vocab_size = 1000;
  config.dataset.validate_tokens = false;
  const GPTDatasets datasets = build_gpt_datasets(config);
  try {
    for (int64_t i = 0; i < datasets.train->size(); ++i) datasets.train->sample(i);
    FAIL() << "sampled token ids >= model.vocab_size";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.vocab_size (1000)"));
  }
}

}  // namespace
}  // namespace bridge::training::datasets
