// Checkpoints over real ranks: N steps straight equal N/2, save, resume, N/2 bit for bit at tp2 x pp2 x dp2 (8 ranks)
// and with an interleaved pipeline (pp2 x 2 chunks); a checkpoint saved at tp2 x pp2 x dp2 resumes at tp1 x pp1, at
// pp2 with 2 chunks and at tp4, optimizer state included, with the original layout's losses to fp32 round-off;
// the distributed optimizer's state resumes bit for bit and in other data-parallel sizes, with or without it; under
// mpirun, a SIGTERM to one rank of four saves the same step on every rank, and the resume is bit-exact. MoE models
// with expert parallelism: each layout resumes bit for bit from its files (legacy mp_rank_<tp>[_<pp>]_<ep>, or one
// torch_dist file per rank), a checkpoint reshards between expert-parallel sizes (and tensor, expert tensor and
// pipeline ones) to fp32 round-off, and a legacy one without an expert-parallel rank's file is refused naming it.
// After every save the worker reads the checkpoint back whole and checks it holds each of its rank's slices (experts
// and the fp32 expert_bias included). Checkpoints are checkpoint.ckpt_format torch_dist (the default) unless a case
// pins the legacy files (+ckpt_torch). torch_dist's own case: every rank of tp2 x dp2 writes its own DCP file, the
// distributed optimizer's dp_reshardable buckets resume bit for bit and at another data-parallel size (another
// tensor-parallel size refused), its fully_reshardable state at tp1 and pp2 x 2 chunks, Python's
// torch.distributed.checkpoint reads every weight equal to the legacy format's save of the same run (tp2 x dp2, and the
// MoE block at tp2 x pp2 x ep2), and the same state rewritten in Python as Megatron-Bridge writes it trains on alike.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/dist/spawn.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "training/checkpointing/sharded_state_dict.h"
#include "utils/dcp.h"
#include "utils/safetensors.h"

namespace bridge::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kWorker = BRIDGE_GPT_WORKER;
constexpr int kSteps = 4;

fs::path fresh_directory(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / ("bridge_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

// What the ranks of one run wrote: "loss <step> <hex>", "gradnorm <step> <hex>", "param <name> <tp rank> <crc>",
// "end <step> <on_train_end fired>".
struct Record {
  std::map<int64_t, double> loss, grad_norm;
  std::set<std::string> params;   // "<name> <tp rank> <crc>"
  std::set<std::string> buffers;  // "<name> <dtype> <crc>": the MoE routers' expert_bias
  std::set<int64_t> end_steps;    // where each rank's pretrain() returned
  bool train_end = false;         // on_train_end fired on some rank
};

std::vector<std::string> worker_args(const fs::path& out, int tp, int pp, int vpp, int64_t steps,
                                     const std::string& save, const std::string& load,
                                     const std::string& block = "gpt") {
  return {"resume",
          out.string(),
          std::to_string(tp),
          std::to_string(pp),
          std::to_string(vpp),
          std::to_string(steps),
          save.empty() ? "-" : save,
          load.empty() ? "-" : load,
          block};
}

Record read_record(const fs::path& out) {
  Record record;
  for (const auto& entry : fs::directory_iterator(out)) {
    if (entry.path().filename().string().rfind("rank", 0) != 0) continue;
    std::ifstream in(entry.path());
    std::string kind;
    while (in >> kind) {
      if (kind == "param" || kind == "buffer") {
        std::string param, rank, crc;
        in >> param >> rank >> crc;
        (kind == "param" ? record.params : record.buffers).insert(param + " " + rank + " " + crc);
        continue;
      }
      if (kind == "end") {
        int64_t step = 0;
        int fired = 0;
        in >> step >> fired;
        record.end_steps.insert(step);
        record.train_end = record.train_end || fired != 0;
        continue;
      }
      int64_t step = 0;
      std::string hex;
      in >> step >> hex;
      (kind == "loss" ? record.loss : record.grad_norm)[step] = std::strtod(hex.c_str(), nullptr);
    }
  }
  return record;
}

Record run(const std::string& name, int world, int tp, int pp, int vpp, int64_t steps, const std::string& save,
           const std::string& load, const std::string& block = "gpt") {
  const fs::path out = fresh_directory(name);
  const auto results =
      run_ranks(kWorker, worker_args(out, tp, pp, vpp, steps, save, load, block), world, std::chrono::seconds(240));
  expect_all_ok(results, "resume: ok");
  Record record = read_record(out);
  fs::remove_all(out);
  return record;
}

// `rank_files`: the files the save must have written (relative to the iteration directory); none: not checked.
void expect_bit_exact_resume(const std::string& name, int world, int tp, int pp, int vpp,
                             const std::string& block = "gpt", const std::vector<std::string>& rank_files = {}) {
  const fs::path saved = fresh_directory(name + "_save");
  const Record straight = run(name + "_straight", world, tp, pp, vpp, kSteps, "", "", block);
  const Record first = run(name + "_first", world, tp, pp, vpp, kSteps / 2, saved.string(), "", block);
  // Legacy files are mp_rank_* directories; torch_dist's are __<rank>_0.distcp files.
  const auto is_rank_file = [](const fs::directory_entry& entry) {
    return entry.is_directory() || entry.path().extension() == ".distcp";
  };
  for (const std::string& file : rank_files) {
    const fs::path path = saved / "iter_0000002" / file;
    EXPECT_TRUE(fs::exists(path.extension() == ".distcp" ? path : path / "model_optim_rng.pt"))
        << name << ": no " << file;
  }
  if (!rank_files.empty()) {
    int found = 0;
    for (const auto& entry : fs::directory_iterator(saved / "iter_0000002")) found += is_rank_file(entry);
    EXPECT_EQ(found, static_cast<int>(rank_files.size())) << name << ": other rank files than expected";
  }
  const Record second = run(name + "_second", world, tp, pp, vpp, kSteps, saved.string(), "", block);  // auto_resume
  ASSERT_EQ(straight.loss.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(second.loss.size(), static_cast<std::size_t>(kSteps / 2));
  for (const auto& [step, loss] : second.loss) {
    EXPECT_EQ(loss, straight.loss.at(step)) << name << " loss at step " << step;
    EXPECT_EQ(second.grad_norm.at(step), straight.grad_norm.at(step)) << name << " grad norm at step " << step;
  }
  for (const auto& [step, loss] : first.loss) EXPECT_EQ(loss, straight.loss.at(step)) << name << " step " << step;
  EXPECT_FALSE(straight.params.empty());
  EXPECT_EQ(second.params, straight.params) << name << ": the final parameters differ (CRC per slice)";
  EXPECT_EQ(second.buffers, straight.buffers) << name << ": the final expert_bias differs (CRC per layer)";
  fs::remove_all(saved);
}

TEST(CheckpointResume, BitExactAtTp2Pp2Dp2) { expect_bit_exact_resume("tp2pp2dp2", 8, 2, 2, 0); }
TEST(CheckpointResume, BitExactWithInterleavedPipeline) { expect_bit_exact_resume("pp2vpp2", 2, 1, 2, 2); }

TEST(CheckpointResume, Tp2Pp2Dp2CheckpointResumesInOtherLayouts) {
  const fs::path saved = fresh_directory("reshard_save");
  const Record original = run("reshard_straight", 8, 2, 2, 0, kSteps, "", "");
  run("reshard_first", 8, 2, 2, 0, kSteps / 2, saved.string(), "");
  struct Layout {
    const char* name;
    int world, tp, pp, vpp;
  };
  for (const Layout& layout :
       {Layout{"tp1pp1", 1, 1, 1, 0}, Layout{"pp2vpp2", 2, 1, 2, 2}, Layout{"tp4", 4, 4, 1, 0}}) {
    const Record resumed = run(std::string("reshard_") + layout.name, layout.world, layout.tp, layout.pp, layout.vpp,
                               kSteps, "", saved.string());
    ASSERT_EQ(resumed.loss.size(), static_cast<std::size_t>(kSteps / 2)) << layout.name;
    for (const auto& [step, loss] : resumed.loss) {
      const double expected = original.loss.at(step);
      EXPECT_LE(std::abs(loss - expected) / expected, 2e-6)
          << layout.name << " loss at step " << step << ": " << loss << " vs tp2 x pp2 x dp2 " << expected;
      const double norm = original.grad_norm.at(step);
      EXPECT_LE(std::abs(resumed.grad_norm.at(step) - norm) / norm, 2e-5) << layout.name << " grad norm " << step;
    }
  }
  fs::remove_all(saved);
}

// The Llama block (grouped queries split over tp, q/k norms, RoPE, SwiGLU, untied): a tp2 run resumes bit for bit, and
// its checkpoint resumes at tp1 and at pp2 x 2 chunks to fp32 round-off.
TEST(CheckpointResume, LlamaBlockResumesBitExactAndInOtherLayouts) {
  const fs::path saved = fresh_directory("llama_save");
  const Record straight = run("llama_straight", 2, 2, 1, 0, kSteps, "", "", "llama");
  run("llama_first", 2, 2, 1, 0, kSteps / 2, saved.string(), "", "llama");
  struct Layout {
    const char* name;
    int world, tp, pp, vpp;
  };
  for (const Layout& layout : {Layout{"tp2", 2, 2, 1, 0}, Layout{"tp1", 1, 1, 1, 0}, Layout{"pp2vpp2", 2, 1, 2, 2}}) {
    const Record resumed = run(std::string("llama_resumed_") + layout.name, layout.world, layout.tp, layout.pp,
                               layout.vpp, kSteps, "", saved.string(), "llama");
    ASSERT_EQ(resumed.loss.size(), static_cast<std::size_t>(kSteps / 2)) << layout.name;
    const bool same_layout = layout.tp == 2;
    for (const auto& [step, loss] : resumed.loss) {
      const double expected = straight.loss.at(step);
      if (same_layout) {
        EXPECT_EQ(loss, expected) << "loss at step " << step;
        EXPECT_EQ(resumed.grad_norm.at(step), straight.grad_norm.at(step)) << "grad norm at step " << step;
      } else {
        EXPECT_LE(std::abs(loss - expected) / expected, 2e-6) << layout.name << " loss at step " << step;
        EXPECT_LE(std::abs(resumed.grad_norm.at(step) - straight.grad_norm.at(step)) / straight.grad_norm.at(step),
                  2e-5)
            << layout.name << " grad norm at step " << step;
      }
    }
    if (same_layout) {
      EXPECT_EQ(resumed.params, straight.params) << "the final parameters differ (CRC per slice)";
    }
  }
  fs::remove_all(saved);
}

// Losses and grad norms of `resumed` against `reference` at every step it ran, to `tolerance` (relative; 0: equal).
void expect_follows(const Record& resumed, const Record& reference, double tolerance, const std::string& what) {
  ASSERT_EQ(resumed.loss.size(), static_cast<std::size_t>(kSteps / 2)) << what;
  for (const auto& [step, loss] : resumed.loss) {
    const double expected = reference.loss.at(step), norm = reference.grad_norm.at(step);
    EXPECT_LE(std::abs(loss - expected), tolerance * expected) << what << " loss at step " << step;
    EXPECT_LE(std::abs(resumed.grad_norm.at(step) - norm), tolerance * norm) << what << " grad norm at step " << step;
  }
}

// The distributed optimizer's Adam moments are gathered to data-parallel rank 0 and saved as an optimizer without
// sharding saves them: a dp2 run resumes bit for bit, its checkpoint resumes without the distributed optimizer (one
// process) and with it at dp4 and at tp2 x dp2, and a dp2 checkpoint without it resumes with it.
TEST(CheckpointResume, DistributedOptimizerResumesBitExactAndReshards) {
  const fs::path saved = fresh_directory("distopt_save"), plain = fresh_directory("distopt_plain_save");
  const Record straight = run("distopt_straight", 2, 1, 1, 0, kSteps, "", "", "gpt+distopt");
  run("distopt_first", 2, 1, 1, 0, kSteps / 2, saved.string(), "", "gpt+distopt");
  struct Layout {
    const char* name;
    int world, tp;
    const char* block;
  };
  // Its dp_reshardable buckets load at any data-parallel size, with the distributed optimizer or without (another
  // tensor-parallel size needs fully_reshardable: TorchDistCheckpoint).
  for (const Layout& layout : {Layout{"dp1_plain", 1, 1, "gpt"}, Layout{"dp4", 4, 1, "gpt+distopt"}}) {
    const Record resumed = run(std::string("distopt_") + layout.name, layout.world, layout.tp, 1, 0, kSteps, "",
                               saved.string(), layout.block);
    expect_follows(resumed, straight, 2e-5, layout.name);
  }
  // Last: it saves iteration 4 into the directory.
  const Record second = run("distopt_second", 2, 1, 1, 0, kSteps, saved.string(), "", "gpt+distopt");
  expect_follows(second, straight, 0.0, "dp2 resumed");
  EXPECT_EQ(second.params, straight.params) << "the final parameters differ (CRC per slice)";
  run("distopt_plain_first", 2, 1, 1, 0, kSteps / 2, plain.string(), "", "gpt");
  expect_follows(run("distopt_from_plain", 2, 1, 1, 0, kSteps, "", plain.string(), "gpt+distopt"), straight, 2e-5,
                 "plain dp2 checkpoint resumed with the distributed optimizer");
  fs::remove_all(saved);
  fs::remove_all(plain);
}

// In bf16 the fp32 main params are gathered and saved too: a dp2 run resumes bit for bit, which it would not from the
// bf16 weights, and its checkpoint resumes in bf16 without the distributed optimizer.
TEST(CheckpointResume, DistributedOptimizerInBf16KeepsTheFp32MainParams) {
  const fs::path saved = fresh_directory("distopt_bf16_save");
  const Record straight = run("distopt_bf16_straight", 2, 1, 1, 0, kSteps, "", "", "gpt+distopt+bf16");
  run("distopt_bf16_first", 2, 1, 1, 0, kSteps / 2, saved.string(), "", "gpt+distopt+bf16");
  expect_follows(run("distopt_bf16_dp1", 1, 1, 1, 0, kSteps, "", saved.string(), "gpt+bf16"), straight, 1e-2,
                 "bf16 dp1 without the distributed optimizer");
  const Record second = run("distopt_bf16_second", 2, 1, 1, 0, kSteps, saved.string(), "", "gpt+distopt+bf16");
  expect_follows(second, straight, 0.0, "bf16 dp2 resumed");
  EXPECT_EQ(second.params, straight.params) << "the final parameters differ (CRC per slice)";
  fs::remove_all(saved);
}

// MoE layouts on 2 ranks and two on 4 (the MoE block of gpt_worker_support.h: 4 experts, 3 MoE layers of 4, shared
// experts): each resumes bit for bit. Three save Megatron's legacy files mp_rank_<tp>[_<pp>][_<ep>] (the
// expert-parallel rank last, only at ep > 1), which every expert-parallel rank writes with its own experts; the others
// torch_dist (the default), where every rank writes its own file. A save that lost one rank's experts fails the
// resume (its experts missing) and the worker's read-back after the save.
TEST(MoECheckpointResume, BitExactInEveryExpertLayout) {
  struct Layout {
    const char* name;
    int world, tp, pp;
    const char* block;
    std::vector<std::string> files;
  };
  const std::vector<std::string> two_ranks = {"__0_0.distcp", "__1_0.distcp"};
  const std::vector<Layout> layouts = {
      // ep2 over the 2 data-parallel ranks: dense data-parallel rank 0 and expert data-parallel rank 0 of ep rank 1.
      {"ep2", 2, 1, 1, "moe+ep2+ckpt_torch", {"mp_rank_00_000", "mp_rank_00_001"}},
      // The distributed optimizer shards the dense state over dp 2 and keeps each rank's experts' state whole.
      {"ep2_distopt", 2, 1, 1, "moe+ep2+distopt", two_ranks},
      // tp2 x ep2 on the same two ranks, sequence parallel, experts whole (etp1): tp rank r holds ep rank r's experts.
      {"tp2_ep2_etp1_sp", 2, 2, 1, "moe+ep2+etp1+sp", two_ranks},
      // bf16 with the auxiliary-loss-free expert_bias (fp32 buffers), the alltoall dispatcher and the distributed
      // optimizer (its fp32 main params in dp_reshardable buckets).
      {"ep2_bf16_expert_bias", 2, 1, 1, "moe+ep2+alltoall+distopt+expert_bias+bf16", two_ranks},
      // Experts split over 2 expert tensor-parallel ranks at tp 1: their legacy files are told apart by the etp rank.
      {"etp2", 2, 1, 1, "moe+etp2+ckpt_torch", {"mp_rank_00_etp00", "mp_rank_00_etp01"}},
      // pp2 x ep2: the pipeline rank, then the expert-parallel rank.
      {"pp2_ep2",
       4,
       1,
       2,
       "moe+ep2+ckpt_torch",
       {"mp_rank_00_000_000", "mp_rank_00_000_001", "mp_rank_00_001_000", "mp_rank_00_001_001"}},
      // dp4 x ep2 (expert dp 2) with the distributed optimizer: each rank writes its own shard, none gathered.
      {"ep2_dp4_distopt", 4, 1, 1, "moe+ep2+distopt", {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    expect_bit_exact_resume(std::string("moe_") + layout.name, layout.world, layout.tp, layout.pp, 0, layout.block,
                            layout.files);
  }
}

// A checkpoint saved in one expert layout resumes in others (experts found by their global names, expert
// tensor-parallel slices by their shard metadata), continuing the saving layout's straight run to fp32 round-off
// (bf16: 1e-2), and the ep1 run as if it had never been interrupted.
TEST(MoECheckpointResume, ReshardsBetweenExpertLayouts) {
  struct Target {
    const char* name;
    int world, tp, pp;
    const char* block;
  };
  struct Source {
    const char* name;
    int tp;
    const char* block;
    double tolerance;
    std::vector<Target> targets;
  };
  const std::vector<Source> sources = {
      {"ep2", 1, "moe+ep2", 2e-5, {{"ep1", 2, 1, 1, "moe"}, {"pp2", 2, 1, 2, "moe"}, {"tp2_etp2", 2, 2, 1, "moe+sp"}}},
      {"ep1", 1, "moe", 2e-5, {{"ep2", 2, 1, 1, "moe+ep2"}, {"tp2_ep2_etp1", 2, 2, 1, "moe+ep2+etp1+sp"}}},
      {"tp2_ep2_etp1", 2, "moe+ep2+etp1+sp", 2e-5, {{"ep1_dp1", 1, 1, 1, "moe"}, {"etp2", 2, 1, 1, "moe+etp2"}}},
      // The expert state in model space (fully_reshardable): dp_reshardable buckets load only at the saved ep.
      {"ep2_distopt", 1, "moe+ep2+distopt+fully_reshardable", 2e-5, {{"ep1_plain", 2, 1, 1, "moe"}}},
      {"ep2_bf16_bias", 1, "moe+ep2+expert_bias+bf16", 1e-2, {{"ep1", 2, 1, 1, "moe+expert_bias+bf16"}}},
  };
  const Record ep1_straight = run("moe_reshard_ep1_straight", 2, 1, 1, 0, kSteps, "", "", "moe");
  for (const Source& source : sources) {
    SCOPED_TRACE(source.name);
    const std::string prefix = std::string("moe_reshard_") + source.name;
    const fs::path saved = fresh_directory(prefix + "_save");
    const Record straight = std::string(source.block) == "moe"
                                ? ep1_straight
                                : run(prefix + "_straight", 2, source.tp, 1, 0, kSteps, "", "", source.block);
    run(prefix + "_first", 2, source.tp, 1, 0, kSteps / 2, saved.string(), "", source.block);
    for (const Target& target : source.targets) {
      const Record resumed = run(prefix + "_to_" + target.name, target.world, target.tp, target.pp, 0, kSteps, "",
                                 saved.string(), target.block);
      const std::string what = std::string(source.name) + " -> " + target.name;
      expect_follows(resumed, straight, source.tolerance, what);
      if (std::string(target.block) == "moe") expect_follows(resumed, ep1_straight, source.tolerance, what + " (ep1)");
    }
    fs::remove_all(saved);
  }
}

// An ep2 checkpoint in the legacy format without ep rank 1's file (its experts) is refused on every rank, naming the
// file, before a step; so is one whose common.pt no longer lists an expert (checkpoint_test's MoECheckpoint cases).
TEST(MoECheckpointResume, AMissingExpertParallelRankFileIsRefusedNamingIt) {
  const fs::path saved = fresh_directory("moe_missing_save");
  run("moe_missing_first", 2, 1, 1, 0, kSteps / 2, saved.string(), "", "moe+ep2+ckpt_torch");
  const fs::path lost = saved / "iter_0000002" / "mp_rank_00_001";
  ASSERT_TRUE(fs::exists(lost / "model_optim_rng.pt"));
  fs::remove_all(lost);
  for (const char* block : {"moe+ep2", "moe"}) {
    const fs::path out = fresh_directory("moe_missing_resume");
    const auto results =
        run_ranks(kWorker, worker_args(out, 1, 1, 0, kSteps, "", saved.string(), block), 2, std::chrono::seconds(240));
    for (const RankResult& result : results) {
      EXPECT_EQ(result.exit_code, 1) << block << ":\n" << describe(results);
      EXPECT_THAT(result.output, ::testing::HasSubstr((lost / "model_optim_rng.pt").string() + " is missing")) << block;
    }
    EXPECT_FALSE(fs::exists(out / "pid0")) << block << ": training started";
    fs::remove_all(out);
  }
  fs::remove_all(saved);
}

// checkpoint.ckpt_format torch_dist (Megatron-Core's distributed checkpoint) over real ranks, in one test to keep CI's
// cost small. A tp2 x dp2 run of the Llama block with the distributed optimizer: every rank writes its own
// __<rank>_0.distcp (replicated chunks spread over their holders, each rank's optimizer shard saved where it lies as
// Megatron-Core's dp_reshardable 1-D bucket chunks), the run resumes bit for bit and at tp2 x dp1 to fp32 round-off,
// a tp1 resume is refused naming the fix, and the same run saved with dist_ckpt_optim_fully_reshardable resumes at
// tp1 x pp1 (plain optimizer) and at pp2 x 2 chunks to fp32 round-off. Python's torch.distributed.checkpoint loads it,
// and every weight it reads, split back into bridge's names, equals the legacy format's save of the same
// (deterministic) run: the legacy reader shares no code with the DCP writer. An MoE ep2 run in bf16 with the
// distributed optimizer and the fp32 expert_bias resumes bit for bit.
// Every tensor Python's DCP reader wrote to `from_python` (saved keys, layers stacked) equals the weight of the legacy
// checkpoint in `legacy` (the same run saved in Megatron's files), and together they are all of its weights.
void expect_python_tensors_equal_legacy(const fs::path& from_python, const fs::path& legacy, const std::string& what) {
  SCOPED_TRACE(what);
  const training::SavedWeights reference = training::load_saved_weights(legacy.string());
  const training::ShardedKeyOptions options = training::ShardedKeyOptions::from(reference.config.model);
  std::set<std::string> compared;
  for (const auto& [key, tensor] : utils::read_safetensors(from_python).tensors) {
    for (const training::NamedPart& part : training::named_parts(key, tensor.sizes().vec(), options)) {
      torch::Tensor value = tensor;
      for (int64_t index : part.prefix) value = value.select(0, index);
      const auto found = reference.tensors.find(part.name);
      if (found == reference.tensors.end()) {
        ADD_FAILURE() << key << " holds " << part.name << ", which the legacy checkpoint does not have";
        continue;
      }
      EXPECT_TRUE(torch::equal(value.to(torch::kFloat32), found->second))
          << key << " -> " << part.name << " differs from the legacy checkpoint's";
      compared.insert(part.name);
    }
  }
  std::set<std::string> legacy_names;
  for (const auto& [name, tensor] : reference.tensors) legacy_names.insert(name);
  EXPECT_EQ(compared, legacy_names) << "Python's tensors cover other weights than the legacy checkpoint";
  fs::remove(from_python);
}

TEST(TorchDistCheckpoint, EveryRankWritesResumesBitExactReshardsAndOpensInPython) {
  const fs::path saved = fresh_directory("torch_dist_save"), legacy = fresh_directory("torch_dist_legacy");
  // The Llama block: its SwiGLU fc1 is two chunks per tensor-parallel rank ([gate; up]), its QKV grouped.
  const std::string block = "llama+distopt+torch_dist";
  const Record straight = run("torch_dist_straight", 4, 2, 1, 0, kSteps, "", "", block);
  const Record first = run("torch_dist_first", 4, 2, 1, 0, kSteps / 2, saved.string(), "", block);
  expect_follows(first, straight, 0.0, "the saving run");

  const fs::path iteration = saved / "iter_0000002";
  for (const char* file :
       {".metadata", "metadata.json", "bridge_checksums.json", "train_state.pt", "run_config.yaml"}) {
    EXPECT_TRUE(fs::exists(iteration / file)) << "no " << file;
  }
  EXPECT_TRUE(fs::exists(saved / "latest_train_state.pt"));
  std::set<std::string> data_files;
  for (const auto& entry : fs::directory_iterator(iteration)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".distcp") data_files.insert(name);
  }
  EXPECT_EQ(data_files, (std::set<std::string>{"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"}))
      << "every rank writes its own shard";

  // Python's reader against the legacy format's save of the same run.
  run("torch_dist_legacy_first", 4, 2, 1, 0, kSteps / 2, legacy.string(), "", "llama+distopt+ckpt_torch");
  const fs::path from_python = saved / "from_python.safetensors";
  const RankResult python =
      run_command({BRIDGE_TOOLS_PYTHON, BRIDGE_READ_TORCH_DIST, iteration.string(), from_python.string()},
                  std::chrono::seconds(120));
  ASSERT_EQ(python.exit_code, 0) << python.output;
  // Its index lists the common state, each tensor-parallel rank's RNG object and the distributed optimizer's buckets
  // (dp_reshardable, Megatron-Core's default): per tensor-parallel rank (dp_group_idx) 1-D tensors and the objects.
  const std::string bucket = "optimizer.distributed.dp_group_idx_1.gbuf_idx_0.dtype_(torch.float32, torch.float32)";
  for (const std::string& item :
       {std::string("\"common_state/shard_0_1\""), std::string("\"rng_state/shard_0.0_1.2\""),
        std::string("\"rng_state/shard_0.1_1.2\""), "\"" + bucket + ".bucket_idx_0.exp_avg_sq\"",
        std::string("\"optimizer.distributed.dp_group_idx_0.per_bucket_numel_unpadded/shard_0_1\"")}) {
    EXPECT_THAT(python.output, ::testing::HasSubstr(item));
  }
  const utils::dcp::Reader index(iteration);
  int buckets = 0;
  for (const auto& [key, info] : index.tensors()) {
    if (key.rfind("optimizer.", 0) != 0) continue;
    EXPECT_NE(key.find(".bucket_idx_"), std::string::npos) << key << ": the optimizer's state in model space";
    EXPECT_EQ(info.global_shape.size(), 1u) << key;
    EXPECT_GE(info.chunks.size(), 2u) << key << ": one chunk per parameter slice of each data-parallel rank";
    ++buckets;
  }
  EXPECT_TRUE(buckets > 0 && buckets % (2 * 3) == 0)
      << buckets << " tensors: param, exp_avg and exp_avg_sq of each bucket of both tensor-parallel ranks";
  expect_python_tensors_equal_legacy(from_python, legacy, "tp2 x dp2, the Llama block");
  // The MoE block at tp2 x pp2 x ep2: the experts a second axis of Megatron-Core's keys, each expert-parallel rank's
  // experts its own chunks, the layers of both pipeline stages one axis.
  const fs::path moe = fresh_directory("torch_dist_moe"), moe_legacy = fresh_directory("torch_dist_moe_legacy");
  run("torch_dist_moe_first", 4, 2, 2, 0, kSteps / 2, moe.string(), "", "moe+ep2+etp1+sp");
  run("torch_dist_moe_legacy_first", 4, 2, 2, 0, kSteps / 2, moe_legacy.string(), "", "moe+ep2+etp1+sp+ckpt_torch");
  const fs::path moe_from_python = moe / "from_python.safetensors";
  const RankResult moe_python = run_command(
      {BRIDGE_TOOLS_PYTHON, BRIDGE_READ_TORCH_DIST, (moe / "iter_0000002").string(), moe_from_python.string()},
      std::chrono::seconds(120));
  ASSERT_EQ(moe_python.exit_code, 0) << moe_python.output;
  expect_python_tensors_equal_legacy(moe_from_python, moe_legacy, "tp2 x pp2 x ep2, the MoE block");
  fs::remove_all(moe);
  fs::remove_all(moe_legacy);

  // dp_reshardable resumes at another data-parallel size (each rank reading its pieces' ranges from the other
  // size's chunks), and refuses another tensor-parallel size, naming it and the fix.
  expect_follows(run("torch_dist_tp2dp1", 2, 2, 1, 0, kSteps, "", saved.string(), block), straight, 2e-5, "tp2 x dp1");
  const fs::path refused = fresh_directory("torch_dist_refused");
  for (const RankResult& result : run_ranks(kWorker, worker_args(refused, 1, 1, 0, kSteps, "", saved.string(), "llama"),
                                            1, std::chrono::seconds(240))) {
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_THAT(result.output, ::testing::HasSubstr("tensor_model_parallel_size 2 (this run: 1)"));
    EXPECT_THAT(result.output, ::testing::HasSubstr("checkpoint.dist_ckpt_optim_fully_reshardable=true"));
  }
  fs::remove_all(refused);
  // bridge-checkpoint convert refuses the same move before any rank starts (exit 2), naming the route.
  const RankResult convert = run_command({BRIDGE_CHECKPOINT, "convert", saved.string(),
                                          (saved.parent_path() / "torch_dist_converted").string(), "--to", "torch"},
                                         std::chrono::seconds(120));
  EXPECT_EQ(convert.exit_code, 2) << convert.output;
  EXPECT_THAT(convert.output, ::testing::HasSubstr("tensor_model_parallel_size 2 (here: 1)"));
  EXPECT_THAT(convert.output, ::testing::HasSubstr("checkpoint.dist_ckpt_optim_fully_reshardable=true"));
  EXPECT_FALSE(fs::exists(saved.parent_path() / "torch_dist_converted"));
  // Saved in model space (fully_reshardable) the same state reshards to tp1 and pp2 x 2 chunks.
  const fs::path reshardable = fresh_directory("torch_dist_fully_reshardable");
  expect_follows(
      run("torch_dist_fr_first", 4, 2, 1, 0, kSteps / 2, reshardable.string(), "", block + "+fully_reshardable"),
      straight, 0.0, "the fully_reshardable save");
  struct Layout {
    const char* name;
    int world, tp, pp, vpp;
  };
  Record tp1;
  for (const Layout& layout : {Layout{"tp1pp1", 1, 1, 1, 0}, Layout{"pp2vpp2", 2, 1, 2, 2}}) {
    const Record resumed = run(std::string("torch_dist_") + layout.name, layout.world, layout.tp, layout.pp, layout.vpp,
                               kSteps, "", reshardable.string(), "llama");
    expect_follows(resumed, straight, 2e-5, layout.name);
    if (layout.tp == 1 && layout.pp == 1) tp1 = resumed;
  }
  // The same state as Megatron-Bridge writes it, by PyTorch's DCP in Python: Transformer Engine's fused layer-norm
  // names, _extra_state objects, Megatron-Core's common state (no bridge config, counters or layout),
  // train_state.pt with the counters, Python's and NumPy's RNG states, no bridge checksums. It trains on at tp1
  // exactly as bridge's own save of it does.
  const fs::path megatron_bridge = fresh_directory("torch_dist_megatron_bridge");
  const RankResult rewrite = run_command(
      {BRIDGE_TOOLS_PYTHON, (fs::path(BRIDGE_READ_TORCH_DIST).parent_path() / "megatron_bridge_checkpoint.py").string(),
       (reshardable / "iter_0000002").string(), megatron_bridge.string()},
      std::chrono::seconds(120));
  ASSERT_EQ(rewrite.exit_code, 0) << rewrite.output;
  EXPECT_THAT(rewrite.output, ::testing::HasSubstr("decoder.layers.mlp.linear_fc1._extra_state/shard_3_4"));
  const utils::dcp::Reader rewritten(megatron_bridge / "iter_0000002");
  EXPECT_EQ(rewritten.tensors().count("decoder.layers.mlp.linear_fc1.layer_norm_weight"), 1u);
  EXPECT_EQ(rewritten.tensors().count("decoder.layers.pre_mlp_layernorm.weight"), 0u);
  const Record from_megatron_bridge =
      run("torch_dist_from_megatron_bridge", 1, 1, 1, 0, kSteps, "", megatron_bridge.string(), "llama");
  expect_follows(from_megatron_bridge, tp1, 0.0, "Megatron-Bridge's layout of the save");
  EXPECT_EQ(from_megatron_bridge.params, tp1.params) << "the final parameters differ (CRC per slice)";
  fs::remove_all(megatron_bridge);
  fs::remove_all(reshardable);
  // Last: it saves iteration 4 into the directory.
  const Record second = run("torch_dist_second", 4, 2, 1, 0, kSteps, saved.string(), "", block);
  expect_follows(second, straight, 0.0, "tp2 x dp2 resumed");
  EXPECT_EQ(second.params, straight.params) << "the final parameters differ (CRC per slice)";
  fs::remove_all(saved);
  fs::remove_all(legacy);
}

// SIGKILL to every rank of the job in `out` that wrote its pid: a failed check must not wait out a long run.
void kill_ranks(const fs::path& out, int world) {
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = 0;
    std::ifstream(out / ("pid" + std::to_string(rank))) >> pid;
    if (pid > 0) ::kill(pid, SIGKILL);
  }
}

// train.exit_signal_handler under mpirun: a SIGTERM to one rank of four (tp2 x pp2), at a random moment of training,
// makes every rank save the same step, return without on_train_end and exit 0; resuming from that checkpoint then
// continues the straight run bit for bit.
TEST(CheckpointResume, SigtermToOneRankUnderMpirunSavesAndResumes) {
  const fs::path out = fresh_directory("sigterm");
  const fs::path saved = fresh_directory("sigterm_save");
  std::vector<std::string> command = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4", kWorker};
  for (const std::string& arg : worker_args(out, 2, 2, 0, 100000, saved.string(), "")) command.push_back(arg);
  auto job = std::async(std::launch::async, [&] { return run_command(command, std::chrono::seconds(240)); });

  constexpr int kSignalled = 2;
  const fs::path pid_file = out / ("pid" + std::to_string(kSignalled));
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(pid_file) && std::chrono::steady_clock::now() < give_up &&
         job.wait_for(std::chrono::milliseconds(20)) == std::future_status::timeout) {
  }
  if (!fs::exists(pid_file)) {
    kill_ranks(out, 4);
    FAIL() << "rank " << kSignalled << " never started training:\n" << job.get().output;
  }
  const unsigned delay_ms = 200 + std::random_device{}() % 800;
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  if (pid <= 0 || ::kill(pid, SIGTERM) != 0) {
    kill_ranks(out, 4);
    FAIL() << "could not signal rank " << kSignalled << " (pid " << pid << "):\n" << job.get().output;
  }
  const RankResult result = job.get();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("rank " + std::to_string(kSignalled) +
                                                  ": train.exit_signal_handler: SIGTERM received"));

  const Record signalled = read_record(out);
  ASSERT_EQ(signalled.end_steps.size(), 1U) << "the ranks left training at different steps";
  const int64_t step = *signalled.end_steps.begin();
  EXPECT_FALSE(signalled.train_end) << "on_train_end fired on an exit";
  std::ifstream tracker(saved / "latest_checkpointed_iteration.txt");
  int64_t latest = -1;
  tracker >> latest;
  EXPECT_EQ(latest, step);

  const Record resumed = run("sigterm_resumed", 4, 2, 2, 0, step + 2, saved.string(), "");
  const Record straight = run("sigterm_straight", 4, 2, 2, 0, step + 2, "", "");
  ASSERT_EQ(resumed.loss.size(), 2U);
  for (const auto& [at, loss] : resumed.loss) EXPECT_EQ(loss, straight.loss.at(at)) << "loss at step " << at;
  for (const auto& [at, loss] : signalled.loss) EXPECT_EQ(loss, straight.loss.at(at)) << "loss at step " << at;
  EXPECT_EQ(resumed.params, straight.params);
  std::printf(
      "SIGTERM to rank %d %u ms into training: every rank saved and left after step %lld; the resume "
      "matched bit for bit\n",
      kSignalled, delay_ms, static_cast<long long>(step));
  fs::remove_all(out);
  fs::remove_all(saved);
}

}  // namespace
}  // namespace bridge::testing
