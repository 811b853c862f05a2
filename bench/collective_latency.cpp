// all_reduce latency over the world group through bridge's ProcessGroup, for the payload sizes of the reference
// (4 B to 4 MB). Launch it with N ranks (bench/run_collective_latency.sh does, next to the Python reference);
// rank 0 prints one line per size: "cpp <ranks> <bytes> <milliseconds per all_reduce>".
#include <chrono>
#include <cstdio>
#include <vector>

#include "parallel/distributed.h"

int main() {
  using namespace bridge::parallel;
  init_distributed();
  ProcessGroup& world = get_world_group();
  const std::vector<std::pair<int64_t, int>> cases = {{1, 200}, {256, 200}, {65536, 50}, {1048576, 10}};
  for (const auto& [floats, iterations] : cases) {
    torch::Tensor t = torch::ones({floats});
    for (int i = 0; i < 3; ++i) world.all_reduce(t);  // warm-up: connections and buffers
    world.barrier();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) world.all_reduce(t);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (get_rank() == 0)
      std::printf("cpp %d %lld %.4f\n", get_world_size(), static_cast<long long>(floats * 4), ms / iterations);
  }
  destroy_distributed();
  return 0;
}
