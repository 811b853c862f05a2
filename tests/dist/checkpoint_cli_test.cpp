// Damaged checkpoints as a user meets them, through bridge-pretrain and bridge-checkpoint: bytes flipped in a rank
// file or common.pt are named as damage on every rank and nothing is trained on them; checkpoint.auto_resume falls
// back to the newest complete older checkpoint loudly (the damaged one kept aside, the tracker moved in the open) and
// resumes bit-exact from it; bridge-checkpoint verify names the damaged file; a truncated file's error carries no
// C++ backtrace; a checkpoint.load that does not exist exits 2; all in Megatron's legacy files (torch_dist's damage:
// checkpoint_test). An MoE checkpoint of two expert-parallel ranks: verify
// checks both rank files, bridge-export gathers every expert, and damage in expert-parallel rank 1's file is named.
// bridge-checkpoint convert: torch -> torch_dist -> torch, each resumed bit-exact (CheckpointConvert).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/dist/spawn.h"

namespace bridge::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr const char* kPretrain = BRIDGE_PRETRAIN;
constexpr const char* kCheckpoint = BRIDGE_CHECKPOINT;
// bridge-export, built beside bridge-checkpoint in tools/ (a full build makes both).
const std::string kExport = (fs::path(BRIDGE_CHECKPOINT).parent_path() / "bridge-export").string();
constexpr std::chrono::seconds kDeadline(300);
constexpr char kRankFile[] = "iter_0000020/mp_rank_00/model_optim_rng.pt";

class DamagedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("bridge_damaged_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "cache");
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path save() const { return root_ / "ckpt"; }

  // The embedded tiny recipe (a rank file of several MB), saving every 10 iterations in Megatron's legacy files
  // (torch_dist's damage cases: checkpoint_test's TorchDistCheckpoint).
  RankResult pretrain(int iterations, std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv = {kPretrain,
                                     "checkpoint.ckpt_format=torch",
                                     "train.train_iters=" + std::to_string(iterations),
                                     "train.eval_interval=0",
                                     "logging.log_interval=1",
                                     "train.num_threads=1",
                                     "checkpoint.save=" + save().string(),
                                     "checkpoint.save_interval=10"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, kDeadline, {{"XDG_CACHE_HOME", (root_ / "cache").string()}});
  }

  RankResult verify(std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv = {kCheckpoint, "verify", save().string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, kDeadline);
  }

  fs::path root_;
};

// What the tester did: 16 bytes flipped at offset 300000 of a rank file.
void flip(const fs::path& path, std::size_t offset, std::size_t count) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file) << path;
  for (std::size_t i = 0; i < count; ++i) {
    file.seekg(static_cast<std::streamoff>(offset + i));
    const int byte = file.get();
    ASSERT_NE(byte, EOF) << path << " has fewer than " << offset + count << " bytes";
    file.seekp(static_cast<std::streamoff>(offset + i));
    file.put(static_cast<char>(byte ^ 0xFF));
  }
}

std::string tracker(const fs::path& save) {
  std::ifstream in(save / "latest_checkpointed_iteration.txt");
  std::string text;
  in >> text;
  return text;
}

// "iteration N/ M ... lm loss: X" of the training log, by iteration.
std::map<int, std::string> losses(const std::string& output) {
  std::map<int, std::string> found;
  const std::regex pattern("iteration +([0-9]+)/ +[0-9]+ .*? lm loss: ([-+0-9.eE]+)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pattern); it != std::sregex_iterator(); ++it) {
    found[std::stoi((*it)[1])] = (*it)[2];
  }
  return found;
}

TEST_F(DamagedCheckpoint, FlippedBytesAreNamedNeverTrainedOnAndAutoResumeFallsBack) {
  const RankResult first = pretrain(20);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::map<int, std::string> first_losses = losses(first.output);
  ASSERT_EQ(first_losses.size(), 20U) << first.output;
  flip(save() / kRankFile, 300000, 16);

  const RankResult verified = verify();
  EXPECT_EQ(verified.exit_code, 1) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr("DAMAGED  mp_rank_00/model_optim_rng.pt"));
  EXPECT_THAT(verified.output, HasSubstr("ok       common.pt (whole-file CRC32)"));

  // An explicit load of it: an error naming the file, and nothing written.
  const auto before = fs::last_write_time(save() / kRankFile);
  const RankResult refused = pretrain(30, {"checkpoint.load=" + save().string()});
  EXPECT_EQ(refused.exit_code, 93) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr((save() / kRankFile).string() + " is damaged"));
  EXPECT_THAT(refused.output, Not(HasSubstr("Exception raised from")));
  EXPECT_EQ(tracker(save()), "20");
  EXPECT_FALSE(fs::exists(save() / "iter_0000030"));
  EXPECT_EQ(fs::last_write_time(save() / kRankFile), before);

  // Auto-resume: loudly back to iteration 10, the damaged one kept aside, then the same losses as the first run.
  const RankResult resumed = pretrain(30, {"checkpoint.auto_resume=true"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr((save() / kRankFile).string() + " is damaged"));
  EXPECT_THAT(resumed.output, HasSubstr("checkpoint iteration 20 is damaged; it is kept as " +
                                        (save() / "iter_0000020.damaged").string()));
  EXPECT_TRUE(fs::exists(save() / "iter_0000020.damaged" / "mp_rank_00" / "model_optim_rng.pt"));
  const std::map<int, std::string> resumed_losses = losses(resumed.output);
  ASSERT_EQ(resumed_losses.size(), 20U) << resumed.output;  // iterations 11..30
  for (int iteration = 11; iteration <= 20; ++iteration) {
    EXPECT_EQ(resumed_losses.at(iteration), first_losses.at(iteration)) << "iteration " << iteration;
  }
  EXPECT_EQ(tracker(save()), "30");
  const RankResult clean = verify();
  EXPECT_EQ(clean.exit_code, 0) << clean.output;
  EXPECT_THAT(clean.output, HasSubstr("iter_0000030"));
}

// common.pt damaged: named as damage (it used to read as "a checkpoint of another model").
TEST_F(DamagedCheckpoint, DamagedCommonIsNamedAsDamage) {
  ASSERT_EQ(pretrain(10).exit_code, 0);
  const fs::path common = save() / "iter_0000010" / "common.pt";
  flip(common, fs::file_size(common) / 2, 1);
  const RankResult refused = pretrain(20, {"checkpoint.load=" + save().string()});
  EXPECT_EQ(refused.exit_code, 93) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr(common.string() + " is damaged"));
  EXPECT_THAT(refused.output, Not(HasSubstr("another model")));
  // Nothing older to fall back to: auto-resume says so and fails.
  const RankResult alone = pretrain(20, {"checkpoint.auto_resume=true"});
  EXPECT_EQ(alone.exit_code, 93) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("holds no complete older checkpoint to fall back to"));
  EXPECT_EQ(tracker(save()), "10");
}

TEST_F(DamagedCheckpoint, ATruncatedFileIsDamageWithoutABacktrace) {
  ASSERT_EQ(pretrain(10).exit_code, 0);
  const fs::path file = save() / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt";
  fs::resize_file(file, fs::file_size(file) / 2);
  const RankResult refused = pretrain(20, {"checkpoint.load=" + save().string()});
  EXPECT_EQ(refused.exit_code, 93) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr(file.string() + " is damaged"));
  EXPECT_THAT(refused.output, Not(HasSubstr("Exception raised from")));
  EXPECT_THAT(refused.output, Not(HasSubstr("frame #")));
  const RankResult verified = verify({"--iteration", "10"});
  EXPECT_EQ(verified.exit_code, 1) << verified.output;
  fs::remove(file);
  const RankResult missing = verify();
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("mp_rank_00/model_optim_rng.pt: missing"));
}

TEST_F(DamagedCheckpoint, ALoadThatDoesNotExistExits2) {
  const RankResult refused = pretrain(5, {"checkpoint.load=" + (root_ / "no_such_dir").string()});
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("checkpoint.load: no directory at '" + (root_ / "no_such_dir").string()));
  EXPECT_THAT(refused.output, HasSubstr("checkpoint.auto_resume=true"));
  const RankResult usage = run_command({kCheckpoint, "verify", (root_ / "no_such_dir").string()}, kDeadline);
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
}

// Two ranks (tp=2): the damage is in rank 1's file; both ranks fail, rank 1 naming it; auto-resume falls back on both.
TEST_F(DamagedCheckpoint, EveryRankAgreesOnDamageFoundByOne) {
  const std::vector<std::string> args = {"checkpoint.ckpt_format=torch", "parallelism.tensor_model_parallel_size=2",
                                         "model.num_layers=2",           "model.hidden_size=32",
                                         "train.num_threads=1",          "train.eval_interval=0",
                                         "parallelism.timeout=2min",     "checkpoint.save=" + save().string(),
                                         "checkpoint.save_interval=10"};
  const auto run = [&](int iterations, std::vector<std::string> extra) {
    std::vector<std::string> all = args;
    all.push_back("train.train_iters=" + std::to_string(iterations));
    all.insert(all.end(), extra.begin(), extra.end());
    return run_ranks(kPretrain, all, 2, kDeadline, {{"XDG_CACHE_HOME", (root_ / "cache").string()}});
  };
  const std::vector<RankResult> first = run(20, {});
  ASSERT_EQ(first[0].exit_code, 0) << describe(first);
  ASSERT_EQ(first[1].exit_code, 0) << describe(first);
  const fs::path theirs = save() / "iter_0000020" / "mp_rank_01" / "model_optim_rng.pt";
  flip(theirs, fs::file_size(theirs) - 100, 1);
  const std::vector<RankResult> refused = run(30, {"checkpoint.load=" + save().string()});
  EXPECT_EQ(refused[0].exit_code, 93) << describe(refused);
  EXPECT_EQ(refused[1].exit_code, 93) << describe(refused);
  EXPECT_THAT(refused[1].output, HasSubstr(theirs.string() + " is damaged"));
  // Rank 0 names rank 1's failure, or the file itself where it reads that file too (replicated parameters).
  EXPECT_THAT(refused[0].output, AnyOf(HasSubstr("failed on rank(s) 1"), HasSubstr(theirs.string() + " is damaged")));
  const std::vector<RankResult> resumed = run(30, {"checkpoint.auto_resume=true"});
  EXPECT_EQ(resumed[0].exit_code, 0) << describe(resumed);
  EXPECT_EQ(resumed[1].exit_code, 0) << describe(resumed);
  EXPECT_TRUE(fs::exists(save() / "iter_0000020.damaged"));
  EXPECT_EQ(tracker(save()), "30");
}

// The names of the tensors in a safetensors file: its JSON header, read as text.
std::string safetensors_header(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char size_bytes[8] = {};
  in.read(reinterpret_cast<char*>(size_bytes), 8);
  uint64_t size = 0;
  for (int i = 7; i >= 0; --i) size = size << 8 | size_bytes[i];
  std::string header(size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(size));
  return header;
}

// An MoE model (the Llama block, 4 experts) trained by bridge-pretrain over 2 ranks at expert_model_parallel_size 2:
// one rank file per expert-parallel rank, both verified; bridge-export writes every expert (2 and 3 live only in ep
// rank 1's file); flipped bytes in ep rank 1's file are named by verify and by a load on every rank.
TEST_F(DamagedCheckpoint, AnExpertParallelCheckpointIsVerifiedAndExportedWhole) {
  const std::vector<std::string> args = {"checkpoint.ckpt_format=torch",
                                         "model.num_layers=2",
                                         "model.hidden_size=32",
                                         "model.num_query_groups=2",
                                         "model.normalization=RMSNorm",
                                         "model.position_embedding_type=rope",
                                         "model.gated_linear_unit=true",
                                         "model.activation_func=silu",
                                         "model.add_bias_linear=false",
                                         "model.share_embeddings_and_output_weights=false",
                                         "model.num_moe_experts=4",
                                         "model.moe_ffn_hidden_size=32",
                                         "parallelism.expert_model_parallel_size=2",
                                         "parallelism.timeout=2min",
                                         "train.num_threads=1",
                                         "train.eval_interval=0",
                                         "checkpoint.save=" + save().string(),
                                         "checkpoint.save_interval=10"};
  const auto run = [&](int iterations, std::vector<std::string> extra) {
    std::vector<std::string> all = args;
    all.push_back("train.train_iters=" + std::to_string(iterations));
    all.insert(all.end(), extra.begin(), extra.end());
    return run_ranks(kPretrain, all, 2, kDeadline, {{"XDG_CACHE_HOME", (root_ / "cache").string()}});
  };
  const std::vector<RankResult> first = run(10, {});
  ASSERT_EQ(first[0].exit_code, 0) << describe(first);
  ASSERT_EQ(first[1].exit_code, 0) << describe(first);
  const RankResult verified = verify();
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr("ok       mp_rank_00_000/model_optim_rng.pt"));
  EXPECT_THAT(verified.output, HasSubstr("ok       mp_rank_00_001/model_optim_rng.pt"));
  EXPECT_THAT(verified.output, HasSubstr("all 3 files intact"));

  ASSERT_TRUE(fs::exists(kExport)) << kExport << " is not built: build the bridge-export target";
  const fs::path hf = root_ / "hf";
  const RankResult exported =
      run_command({kExport, "--checkpoint", save().string(), "--hf-dir", hf.string()}, kDeadline);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string header = safetensors_header(hf / "model.safetensors");
  for (int layer = 0; layer < 2; ++layer) {
    for (int expert = 0; expert < 4; ++expert) {
      EXPECT_THAT(header, HasSubstr("model.layers." + std::to_string(layer) + ".block_sparse_moe.experts." +
                                    std::to_string(expert) + ".w1.weight"));
    }
  }

  const fs::path theirs = save() / "iter_0000010" / "mp_rank_00_001" / "model_optim_rng.pt";
  flip(theirs, fs::file_size(theirs) / 2, 16);
  const RankResult damaged = verify();
  EXPECT_EQ(damaged.exit_code, 1) << damaged.output;
  EXPECT_THAT(damaged.output, HasSubstr("DAMAGED  mp_rank_00_001/model_optim_rng.pt"));
  EXPECT_THAT(damaged.output, HasSubstr("ok       mp_rank_00_000/model_optim_rng.pt"));
  const std::vector<RankResult> refused = run(20, {"checkpoint.load=" + save().string()});
  EXPECT_EQ(refused[0].exit_code, 93) << describe(refused);
  EXPECT_EQ(refused[1].exit_code, 93) << describe(refused);
  EXPECT_THAT(refused[1].output, HasSubstr(theirs.string() + " is damaged"));
  EXPECT_EQ(tracker(save()), "10");
}

// bridge-checkpoint convert, one process each: a legacy (torch) save converted to torch_dist, that converted back to
// torch; both verify, and a run resumed from either trains on with the uninterrupted run's losses bit for bit (dropout
// on, so the RNG streams must come through too). Converting into an iteration the destination holds exits 2.
class CheckpointConvert : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("bridge_convert_" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A small model on mock data, dropout on; six iterations in all.
  static std::vector<std::string> pretrain_args(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "model.num_layers=2",          "model.hidden_size=32",   "model.hidden_dropout=0.1",
        "model.attention_dropout=0.1", "dataset.data_path=[]",   "train.train_iters=6",
        "train.eval_interval=0",       "logging.log_interval=1", "train.num_threads=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  RankResult pretrain(const std::vector<std::string>& extra) const {
    std::vector<std::string> argv = pretrain_args(extra);
    argv.insert(argv.begin(), kPretrain);
    return run_command(argv, kDeadline);
  }
  RankResult checkpoint(std::vector<std::string> args) const {
    args.insert(args.begin(), kCheckpoint);
    return run_command(args, kDeadline);
  }

  fs::path root_;
};

TEST_F(CheckpointConvert, BothWaysResumesBitExact) {
  const fs::path legacy = root_ / "legacy", dist = root_ / "dist", back = root_ / "back";
  const RankResult first =
      pretrain({"checkpoint.save=" + legacy.string(), "checkpoint.save_interval=3", "checkpoint.ckpt_format=torch"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::map<int, std::string> expected = losses(first.output);
  ASSERT_EQ(expected.size(), 6U) << first.output;

  const RankResult to_dist =
      checkpoint({"convert", legacy.string(), dist.string(), "--to", "torch_dist", "--iteration", "3"});
  ASSERT_EQ(to_dist.exit_code, 0) << to_dist.output;
  EXPECT_TRUE(fs::exists(dist / "iter_0000003" / ".metadata")) << to_dist.output;
  EXPECT_EQ(tracker(dist), "3");
  const RankResult to_torch = checkpoint({"convert", dist.string(), back.string(), "--to", "torch"});
  ASSERT_EQ(to_torch.exit_code, 0) << to_torch.output;
  EXPECT_TRUE(fs::exists(back / "iter_0000003" / "mp_rank_00" / "model_optim_rng.pt")) << to_torch.output;
  EXPECT_EQ(tracker(legacy), "6");  // the source untouched

  const RankResult again =
      checkpoint({"convert", legacy.string(), dist.string(), "--to", "torch_dist", "--iteration", "3"});
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_THAT(again.output, HasSubstr("already holds " + (dist / "iter_0000003").string()));

  for (const fs::path& converted : {dist, back}) {
    const RankResult verified = checkpoint({"verify", converted.string()});
    EXPECT_EQ(verified.exit_code, 0) << verified.output;
    const RankResult resumed = pretrain({"checkpoint.load=" + converted.string()});
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_THAT(resumed.output, Not(HasSubstr("start from rng.seed")));
    const std::map<int, std::string> resumed_losses = losses(resumed.output);
    ASSERT_EQ(resumed_losses.size(), 3U) << resumed.output;  // iterations 4..6
    for (int iteration = 4; iteration <= 6; ++iteration) {
      EXPECT_EQ(resumed_losses.at(iteration), expected.at(iteration)) << converted << " iteration " << iteration;
    }
  }

  // Under a launcher convert writes the launched layout: the one-rank torch_dist save as a tp2 legacy checkpoint (one
  // file per tensor-parallel rank), from which a tp2 run goes on exactly as a tp2 run resharding the source does.
  const fs::path tp2 = root_ / "tp2";
  const std::string tp2_size = "parallelism.tensor_model_parallel_size=2";
  for (const RankResult& rank :
       run_ranks(kCheckpoint, {"convert", dist.string(), tp2.string(), "--to", "torch", tp2_size}, 2, kDeadline)) {
    EXPECT_EQ(rank.exit_code, 0) << rank.output;
  }
  for (const char* file : {"mp_rank_00", "mp_rank_01"}) {
    EXPECT_TRUE(fs::exists(tp2 / "iter_0000003" / file / "model_optim_rng.pt")) << file;
  }
  EXPECT_EQ(checkpoint({"verify", tp2.string()}).exit_code, 0);
  std::map<int, std::string> at_tp2[2];
  for (int from_converted = 0; from_converted < 2; ++from_converted) {
    const std::vector<std::string> args =
        pretrain_args({tp2_size, "checkpoint.load=" + (from_converted ? tp2 : dist).string()});
    const std::vector<RankResult> ranks = run_ranks(kPretrain, args, 2, kDeadline);
    for (const RankResult& rank : ranks) ASSERT_EQ(rank.exit_code, 0) << rank.output;
    at_tp2[from_converted] = losses(ranks[0].output + ranks[1].output);  // the last rank logs
  }
  EXPECT_EQ(at_tp2[1].size(), 3U);
  EXPECT_EQ(at_tp2[1], at_tp2[0]) << "the tp2 conversion trains on differently from the source resharded at tp2";
}

}  // namespace
}  // namespace bridge::testing
