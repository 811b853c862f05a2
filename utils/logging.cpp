// The process-wide bridge logger and its per-rank configuration.
#include "utils/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace bridge::utils {
namespace {

std::mutex g_mutex;
std::shared_ptr<spdlog::logger> g_logger;

std::shared_ptr<spdlog::logger> make_logger(int rank, int world_size, std::shared_ptr<spdlog::sinks::sink> sink) {
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("bridge", std::move(sink));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S] [rank " + std::to_string(rank) + "/" + std::to_string(world_size) +
                      "] [%l] %v");
  const char* level_name = std::getenv("BRIDGE_LOG_LEVEL");
  const spdlog::level::level_enum level =
      level_name != nullptr ? spdlog::level::from_str(level_name) : spdlog::level::info;
  const char* all_ranks = std::getenv("BRIDGE_LOG_ALL_RANKS");
  const bool every_rank = all_ranks != nullptr && std::string(all_ranks) == "1";
  logger->set_level(rank == 0 || every_rank ? level : std::max(level, spdlog::level::warn));
  logger->flush_on(spdlog::level::warn);
  return logger;
}

}  // namespace

void configure_logging(int rank, int world_size, std::shared_ptr<spdlog::sinks::sink> sink) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_logger = make_logger(rank, world_size, std::move(sink));
}

spdlog::logger& logger() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_logger) g_logger = make_logger(0, 1, nullptr);
  return *g_logger;
}

}  // namespace bridge::utils
