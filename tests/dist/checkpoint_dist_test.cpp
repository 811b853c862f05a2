// Checkpoints over real ranks: N steps straight equal N/2, save, resume, N/2 bit for bit at tp2 x pp2 x dp2 (8 ranks)
// and with an interleaved pipeline (pp2 x 2 chunks); a checkpoint saved at tp2 x pp2 x dp2 resumes at tp1 x pp1, at
// pp2 with 2 chunks and at tp4, optimizer state included, with the original layout's losses to fp32 round-off.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

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

// What the ranks of one run wrote: "loss <step> <hex>", "gradnorm <step> <hex>", "param <name> <tp rank> <crc>".
struct Record {
  std::map<int64_t, double> loss, grad_norm;
  std::set<std::string> params;  // "<name> <tp rank> <crc>"
};

Record run(const std::string& name, int world, int tp, int pp, int vpp, int64_t steps, const std::string& save,
           const std::string& load) {
  const fs::path out = fresh_directory(name);
  const auto results = run_ranks(kWorker,
                                 {"resume", out.string(), std::to_string(tp), std::to_string(pp), std::to_string(vpp),
                                  std::to_string(steps), save.empty() ? "-" : save, load.empty() ? "-" : load},
                                 world, std::chrono::seconds(240));
  expect_all_ok(results, "resume: ok");
  Record record;
  for (const auto& entry : fs::directory_iterator(out)) {
    std::ifstream in(entry.path());
    std::string kind;
    while (in >> kind) {
      if (kind == "param") {
        std::string param, rank, crc;
        in >> param >> rank >> crc;
        record.params.insert(param + " " + rank + " " + crc);
        continue;
      }
      int64_t step = 0;
      std::string hex;
      in >> step >> hex;
      (kind == "loss" ? record.loss : record.grad_norm)[step] = std::strtod(hex.c_str(), nullptr);
    }
  }
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

}  // namespace
}  // namespace bridge::testing
