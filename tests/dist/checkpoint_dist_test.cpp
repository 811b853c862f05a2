// Checkpoints over real ranks: N steps straight equal N/2, save, resume, N/2 bit for bit at tp2 x pp2 x dp2 (8 ranks)
// and with an interleaved pipeline (pp2 x 2 chunks); a checkpoint saved at tp2 x pp2 x dp2 resumes at tp1 x pp1, at
// pp2 with 2 chunks and at tp4, optimizer state included, with the original layout's losses to fp32 round-off;
// the distributed optimizer's state resumes bit for bit and in other data-parallel sizes, with or without it; under
// mpirun, a SIGTERM to one rank of four saves the same step on every rank, and the resume is bit-exact.
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
  std::set<std::string> params;  // "<name> <tp rank> <crc>"
  std::set<int64_t> end_steps;   // where each rank's pretrain() returned
  bool train_end = false;        // on_train_end fired on some rank
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
      if (kind == "param") {
        std::string param, rank, crc;
        in >> param >> rank >> crc;
        record.params.insert(param + " " + rank + " " + crc);
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

void expect_bit_exact_resume(const std::string& name, int world, int tp, int pp, int vpp) {
  const fs::path saved = fresh_directory(name + "_save");
  const Record straight = run(name + "_straight", world, tp, pp, vpp, kSteps, "", "");
  const Record first = run(name + "_first", world, tp, pp, vpp, kSteps / 2, saved.string(), "");
  const Record second = run(name + "_second", world, tp, pp, vpp, kSteps, saved.string(), "");  // auto_resume
  ASSERT_EQ(straight.loss.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(second.loss.size(), static_cast<std::size_t>(kSteps / 2));
  for (const auto& [step, loss] : second.loss) {
    EXPECT_EQ(loss, straight.loss.at(step)) << name << " loss at step " << step;
    EXPECT_EQ(second.grad_norm.at(step), straight.grad_norm.at(step)) << name << " grad norm at step " << step;
  }
  for (const auto& [step, loss] : first.loss) EXPECT_EQ(loss, straight.loss.at(step)) << name << " step " << step;
  EXPECT_FALSE(straight.params.empty());
  EXPECT_EQ(second.params, straight.params) << name << ": the final parameters differ (CRC per slice)";
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
  for (const Layout& layout :
       {Layout{"dp1_plain", 1, 1, "gpt"}, Layout{"dp4", 4, 1, "gpt+distopt"}, Layout{"tp2dp2", 4, 2, "gpt+distopt"}}) {
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
