// bridge-checkpoint: works on checkpoints without training.
//
// `verify` reads every file of an iteration through the same verifying loader a run uses (each file's checksums, then
// its contents) and says, file by file, which are intact, damaged or missing: run it on a copied or archived checkpoint
// before trusting it.
//
//   bridge-checkpoint verify ckpt                      # the iteration latest_checkpointed_iteration.txt names
//   bridge-checkpoint verify ckpt --iteration 200      # another one
//   bridge-checkpoint verify ckpt --all                # every iteration directory in ckpt
//   bridge-checkpoint verify ckpt/iter_0000200         # an iteration directory itself
//
// `convert` writes one iteration again in the other format (torch <-> torch_dist), in any parallel layout: the saved
// run is rebuilt from the config the checkpoint carries, loaded whole (weights, optimizer, scheduler, counters, RNG,
// callbacks' state) and saved at the same iteration into the destination, tracker included; the source is only read,
// nothing is trained. One process writes the tp1 x pp1 layout; under torchrun or mpirun, KEY=VALUE overrides give
// another (training/checkpointing/checkpoint_convert.h).
//
//   bridge-checkpoint convert ckpt ckpt_dist --to torch_dist                   # the tracker's iteration
//   bridge-checkpoint convert ckpt_dist ckpt_legacy --to torch --iteration 200
//   torchrun --nproc_per_node 2 --no_python bridge-checkpoint convert ckpt ckpt_tp2 --to torch_dist
//       parallelism.tensor_model_parallel_size=2                             # (one command line)
//
// Exit status: 0 done (every file intact, or converted), 1 a file damaged or missing (or the conversion failed),
// 2 bad command line or not a checkpoint (or an iteration the destination already holds).
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/launch_env.h"
#include "training/checkpointing/checkpoint_convert.h"
#include "training/checkpointing/checkpointing.h"
#include "training/checkpointing/saved_checkpoint.h"
#include "utils/exception_message.h"
#include "utils/zip_archive.h"

namespace {

namespace fs = std::filesystem;

constexpr int kExitDamaged = 1;
constexpr int kExitBadCommandLine = 2;

// The iteration directories `path` names: itself when it is one, else the tracker's iteration of a checkpoint.save
// directory, the one asked for, or all of them.
std::vector<fs::path> iterations_to_verify(const fs::path& path, std::optional<int64_t> iteration, bool all) {
  std::error_code error;
  if (!fs::is_directory(path, error)) throw std::invalid_argument("no directory at '" + path.string() + "'");
  if (fs::exists(path / "common.pt") || bridge::training::iteration_of_directory_name(path.filename().string())) {
    if (iteration || all) throw std::invalid_argument(path.string() + " is an iteration directory itself");
    return {path};
  }
  if (all) {
    std::map<int64_t, fs::path> by_iteration;  // in iteration order, past 10^7 too
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::optional<int64_t> named =
          bridge::training::iteration_of_directory_name(entry.path().filename().string());
      if (entry.is_directory() && named) by_iteration.emplace(*named, entry.path());
    }
    std::vector<fs::path> found;
    for (const auto& [iteration_number, directory] : by_iteration) found.push_back(directory);
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

cxxopts::Options make_options() {
  cxxopts::Options options("bridge-checkpoint",
                           "Verifies bridge checkpoints without training (every file's checksums and contents), and "
                           "converts them between the torch and torch_dist formats and parallel layouts.");
  options.custom_help(
      "verify DIR [--iteration N | --all]\n  bridge-checkpoint convert SRC DST --to torch|torch_dist [--iteration N] "
      "[KEY=VALUE ...]");
  options.positional_help("");
  // clang-format off
  options.add_options()
      ("command", "verify or convert", cxxopts::value<std::string>())
      ("directory", "a checkpoint.save directory, or one iteration directory in it", cxxopts::value<std::string>())
      ("destination", "convert: the directory to write the converted iteration into", cxxopts::value<std::string>())
      ("iteration", "the iteration to verify or convert; default: the tracker's (latest_checkpointed_iteration.txt)",
       cxxopts::value<int64_t>(), "N")
      ("all", "verify: every iteration directory")
      ("to", "convert: the format to write, torch (Megatron's legacy files) or torch_dist (Megatron-Core's "
       "distributed checkpoint)", cxxopts::value<std::string>(), "FORMAT")
      ("h,help", "print this help and exit");
  // clang-format on
  options.parse_positional({"command", "directory", "destination"});
  return options;
}

constexpr char kConvertHelp[] = R"(
convert:
  Writes one iteration of SRC again into DST in the format --to names, at the same iteration, tracker included:
  model, optimizer state, scheduler, counters, RNG streams and callbacks' state, as a resumed run would load them.
  The saved run is rebuilt from the config the checkpoint carries; SRC is only read and nothing is trained. An
  iteration DST already holds is refused. KEY=VALUE overrides (as bridge-pretrain takes them) apply to that config:
  the parallel layout is 1 unless they set it (parallelism.tensor_model_parallel_size=2, ...), and a layout of
  several ranks runs under a launcher with that many ranks:
    torchrun --nproc_per_node 2 --no_python bridge-checkpoint convert ckpt ckpt_tp2 --to torch_dist \
        parallelism.tensor_model_parallel_size=2

Exit status: 0 done, 1 a file damaged or missing (verify) or the conversion failed, 2 bad command line or not a
checkpoint.
)";

// A bad command line: on rank 0 the error and where the options are; another rank says its error too, since it may see
// what rank 0 did not (files on a disk of its own).
int bad_command_line(const std::exception& error, int rank = 0) {
  if (rank != 0) {
    std::fprintf(stderr, "bridge-checkpoint: rank %d: error: %s\n", rank, bridge::utils::describe(error).c_str());
  } else {
    std::fprintf(stderr, "bridge-checkpoint: error: %s\nRun bridge-checkpoint --help for the options.\n",
                 bridge::utils::describe(error).c_str());
  }
  return kExitBadCommandLine;
}

int run_verify(const cxxopts::ParseResult& args) {
  std::vector<fs::path> iterations;
  try {
    if (!args.unmatched().empty()) {
      throw std::invalid_argument("unexpected argument '" + args.unmatched().front() + "'");
    }
    if (args.count("destination")) {
      throw std::invalid_argument("unexpected argument '" + args["destination"].as<std::string>() + "'");
    }
    if (args.count("to")) throw std::invalid_argument("--to is convert's");
    if (!args.count("directory")) throw std::invalid_argument("verify needs a checkpoint directory");
    std::optional<int64_t> iteration;
    if (args.count("iteration")) iteration = args["iteration"].as<int64_t>();
    iterations = iterations_to_verify(args["directory"].as<std::string>(), iteration, args.count("all") > 0);
  } catch (const std::exception& e) {
    return bad_command_line(e);
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

// Every rank plans (the same answer from the same files) before the world starts; rank 0 says why it cannot be done.
int run_convert(const cxxopts::ParseResult& args, const bridge::parallel::LaunchEnv& env) {
  using namespace bridge::training;
  ConversionPlan plan;
  try {
    if (args.count("all")) throw std::invalid_argument("--all is verify's: convert takes one iteration");
    if (!args.count("directory") || !args.count("destination")) {
      throw std::invalid_argument("convert needs a source and a destination directory");
    }
    if (!args.count("to")) throw std::invalid_argument("convert needs --to torch or --to torch_dist");
    ConvertRequest request;
    request.source = args["directory"].as<std::string>();
    request.destination = args["destination"].as<std::string>();
    request.format = args["to"].as<std::string>();
    if (args.count("iteration")) request.iteration = args["iteration"].as<int64_t>();
    for (const std::string& argument : args.unmatched()) {
      if (argument.find('=') == std::string::npos && argument.rfind('~', 0) != 0) {
        throw std::invalid_argument("unexpected argument '" + argument +
                                    "': overrides are KEY=VALUE (e.g. parallelism.tensor_model_parallel_size=2)");
      }
      request.overrides.push_back(argument);
    }
    plan = plan_checkpoint_conversion(request, env.world_size);
  } catch (const bridge::utils::DamagedFileError& e) {
    if (env.rank == 0) std::fprintf(stderr, "bridge-checkpoint: error: %s\n", bridge::utils::describe(e).c_str());
    return kExitDamaged;
  } catch (const std::exception& e) {
    return bad_command_line(e, env.rank);
  }
  try {
    convert_checkpoint(plan);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bridge-checkpoint: rank %d: converting %s failed: %s\n", env.rank,
                 plan.source_directory.string().c_str(), bridge::utils::describe(e).c_str());
    return kExitDamaged;
  }
  if (env.rank == 0) {
    std::printf("bridge-checkpoint: converted %s (%s) to %s (%s)\n", plan.source_directory.string().c_str(),
                plan.source_format.c_str(), plan.destination_directory.string().c_str(),
                plan.config.checkpoint.ckpt_format.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines from several ranks interleave whole
  bridge::parallel::LaunchEnv env;
  cxxopts::Options options = make_options();
  std::string command;
  std::optional<cxxopts::ParseResult> args;
  try {
    env = bridge::parallel::detect_launch_env();  // the launcher's rank: errors print once
    args = options.parse(argc, argv);
    if (args->count("help")) {
      if (env.rank == 0) std::printf("%s%s", options.help().c_str(), kConvertHelp);
      return 0;
    }
    if (args->count("command")) command = (*args)["command"].as<std::string>();
    if (command != "verify" && command != "convert") {
      throw std::invalid_argument(command.empty() ? "give a command: verify or convert"
                                                  : "unknown command '" + command + "': verify or convert");
    }
  } catch (const std::exception& e) {
    return bad_command_line(e, env.rank);
  }
  return command == "verify" ? run_verify(*args) : run_convert(*args, env);
}
