// Prints the parallel layout of a job, the same binary alone, under torchrun or under mpirun:
//
//   parallel_layout --tp 2 --pp 2
//   torchrun --nproc_per_node=4 --no_python ./parallel_layout --tp 2 --pp 2
//   mpirun -np 8 ./parallel_layout --tp 2 --pp 2
//
// Rank 0 prints every group of the job, then every rank reports the groups it actually joined (gathered over the
// world group), which must agree with the layout.
#include <cstdio>
#include <cxxopts.hpp>
#include <set>
#include <string>
#include <vector>

#include "parallel/distributed.h"
#include "parallel/parallel_state.h"
#include "parallel/rank_generator.h"
#include "utils/logging.h"
#include "utils/strings.h"

namespace {

using namespace bridge::parallel;

std::string format_groups(const RankGroups& groups) {
  std::string text;
  for (const auto& group : groups) text += "[" + bridge::utils::join(group, ",") + "] ";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options cli("parallel_layout", "Prints the tensor/pipeline/data-parallel layout of a job.");
  cli.add_options()("tp", "Tensor-parallel size", cxxopts::value<int>()->default_value("1"))(
      "pp", "Pipeline-parallel size", cxxopts::value<int>()->default_value("1"))(
      "vpp", "Virtual pipeline size (model chunks per stage; 0: none)", cxxopts::value<int>()->default_value("0"))(
      "h,help", "Print usage");
  try {
    const auto args = cli.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s\n", cli.help().c_str());
      return 0;
    }
    init_distributed();
    ParallelOptions options;
    options.tensor_model_parallel_size = args["tp"].as<int>();
    options.pipeline_model_parallel_size = args["pp"].as<int>();
    if (args["vpp"].as<int>() > 0) options.virtual_pipeline_model_parallel_size = args["vpp"].as<int>();
    initialize_model_parallel(options);

    auto& log = bridge::utils::logger();
    const RankLayout& layout = get_rank_layout();
    const RankGenerator generator(options.tensor_model_parallel_size, 1, layout.data_parallel_size,
                                  options.pipeline_model_parallel_size, 1, options.order);
    std::vector<std::vector<int>> embedding_groups;
    for (const auto& pipeline : generator.get_ranks("pp")) embedding_groups.push_back(embedding_ranks(pipeline));
    log.info("world {} = tp {} x pp {} x dp {} (order {}), launched by {}", get_world_size(),
             options.tensor_model_parallel_size, options.pipeline_model_parallel_size, layout.data_parallel_size,
             generator.order(), to_string(get_launch_env().launcher));
    log.info("tensor-parallel groups:   {}", format_groups(generator.get_ranks("tp")));
    log.info("pipeline-parallel groups: {}", format_groups(generator.get_ranks("pp")));
    log.info("data-parallel groups:     {}", format_groups(generator.get_ranks("dp")));
    log.info("model-parallel groups:    {}", format_groups(generator.get_ranks("tp-pp")));
    log.info("embedding groups:         {}", format_groups(embedding_groups));

    // What each rank actually joined: (tp rank, pp rank, dp rank, in embedding group), gathered to everyone.
    torch::Tensor mine = torch::tensor({get_tensor_model_parallel_rank(), get_pipeline_model_parallel_rank(),
                                        get_data_parallel_rank(), is_rank_in_embedding_group(true) ? 1 : 0});
    const std::vector<torch::Tensor> all = get_world_group().all_gather(mine);
    for (int rank = 0; rank < get_world_size(); ++rank) {
      const auto& r = all[static_cast<std::size_t>(rank)];
      const RankLayout expected = compute_rank_layout(get_world_size(), rank, options);
      const bool agrees = r[0].item<int>() == expected.tensor_model_parallel_rank() &&
                          r[1].item<int>() == expected.pipeline_model_parallel_rank() &&
                          r[2].item<int>() == expected.data_parallel_rank() &&
                          (r[3].item<int>() == 1) == !expected.embedding.empty();
      log.info("rank {}: tp rank {} pp rank {} dp rank {}{} {}", rank, r[0].item<int>(), r[1].item<int>(),
               r[2].item<int>(), r[3].item<int>() ? " embedding" : "", agrees ? "" : "(DISAGREES with the layout)");
      if (!agrees) throw std::runtime_error("rank " + std::to_string(rank) + " joined groups other than its layout's");
    }
    destroy_model_parallel();
    destroy_distributed();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "parallel_layout: %s\n", error.what());
    return 1;
  }
}
