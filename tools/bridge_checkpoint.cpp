// bridge-checkpoint: looks at checkpoints without training. `verify` reads every file of an iteration through the
// same verifying loader a run uses (each file's checksums, then its contents) and says, file by file, which are
// intact, damaged or missing: run it on a copied or archived checkpoint before trusting it.
//
//   bridge-checkpoint verify ckpt                      # the iteration latest_checkpointed_iteration.txt names
//   bridge-checkpoint verify ckpt --iteration 200      # another one
//   bridge-checkpoint verify ckpt --all                # every iteration directory in ckpt
//   bridge-checkpoint verify ckpt/iter_0000200         # an iteration directory itself
//
// Exit status: 0 every file intact, 1 a file damaged or missing, 2 bad command line or not a checkpoint.
#include <algorithm>
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "training/checkpointing/checkpointing.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "utils/exception_message.h"

namespace {

namespace fs = std::filesystem;

constexpr int kExitDamaged = 1;
constexpr int kExitBadCommandLine = 2;

// The iteration directories `path` names: itself when it is one, else the tracker's iteration of a checkpoint.save
// directory, the one asked for, or all of them.
std::vector<fs::path> iterations_to_verify(const fs::path& path, std::optional<int64_t> iteration, bool all) {
  std::error_code error;
  if (!fs::is_directory(path, error)) throw std::invalid_argument("no directory at '" + path.string() + "'");
  if (fs::exists(path / "common.pt") || path.filename().string().rfind("iter_", 0) == 0) {
    if (iteration || all) throw std::invalid_argument(path.string() + " is an iteration directory itself");
    return {path};
  }
  if (all) {
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && name.size() == 12 && name.rfind("iter_", 0) == 0) found.push_back(entry.path());
    }
    std::sort(found.begin(), found.end());
    if (found.empty()) throw std::invalid_argument(path.string() + " holds no iter_* directories");
    return found;
  }
  if (!iteration) iteration = bridge::training::read_latest_checkpointed_iteration(path.string());
  if (!iteration) {
    throw std::invalid_argument(path.string() +
                                " has no latest_checkpointed_iteration.txt: give --iteration N, --all, or an "
                                "iteration directory");
  }
  return {path / bridge::training::checkpoint_directory_name(*iteration)};
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("bridge-checkpoint",
                           "Verifies bridge checkpoints without training: every file's checksums and contents.");
  options.custom_help("verify DIR [--iteration N | --all]");
  options.positional_help("");
  // clang-format off
  options.add_options()
      ("command", "verify", cxxopts::value<std::string>())
      ("directory", "a checkpoint.save directory, or one iteration directory in it", cxxopts::value<std::string>())
      ("iteration", "the iteration to verify; default: the tracker's (latest_checkpointed_iteration.txt)",
       cxxopts::value<int64_t>(), "N")
      ("all", "verify every iteration directory")
      ("h,help", "print this help and exit");
  // clang-format on
  options.parse_positional({"command", "directory"});
  std::vector<fs::path> iterations;
  try {
    const cxxopts::ParseResult args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s", options.help().c_str());
      return 0;
    }
    if (!args.unmatched().empty()) {
      throw std::invalid_argument("unexpected argument '" + args.unmatched().front() + "'");
    }
    if (!args.count("command") || args["command"].as<std::string>() != "verify") {
      throw std::invalid_argument("the command is 'verify'");
    }
    if (!args.count("directory")) throw std::invalid_argument("verify needs a checkpoint directory");
    std::optional<int64_t> iteration;
    if (args.count("iteration")) iteration = args["iteration"].as<int64_t>();
    iterations = iterations_to_verify(args["directory"].as<std::string>(), iteration, args.count("all") > 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-checkpoint: error: %s\nRun bridge-checkpoint --help for the options.\n",
                 bridge::utils::describe(e).c_str());
    return kExitBadCommandLine;
  }
  int damaged = 0, total = 0;
  for (const fs::path& directory : iterations) {
    std::printf("%s\n", directory.string().c_str());
    std::vector<bridge::training::VerifiedFile> files;
    try {
      files = bridge::training::verify_checkpoint(directory.string());
    } catch (const std::exception& e) {
      std::printf("  MISSING  %s\n", bridge::utils::describe(e).c_str());
      ++damaged;
      ++total;
      continue;
    }
    for (const bridge::training::VerifiedFile& file : files) {
      ++total;
      if (file.intact()) {
        std::printf("  ok       %s (%s)\n", file.path.c_str(), file.checked.c_str());
      } else {
        ++damaged;
        std::printf("  DAMAGED  %s: %s\n", file.path.c_str(), file.problem.c_str());
      }
    }
  }
  std::fflush(stdout);
  if (damaged > 0) {
    std::fprintf(stderr, "bridge-checkpoint: %d of %d files damaged or missing\n", damaged, total);
    return kExitDamaged;
  }
  std::printf("bridge-checkpoint: all %d files intact\n", total);
  return 0;
}
