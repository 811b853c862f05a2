// The process-wide bridge logger and its per-rank configuration.
#include "utils/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace bridge::utils {
namespace {

std::mutex g_mutex;
std::atomic<bool> g_configured{false};

spdlog::level::level_enum level_from_environment() {
  const char* name = std::getenv("BRIDGE_LOG_LEVEL");
  if (name == nullptr) return spdlog::level::info;
  const spdlog::level::level_enum level = spdlog::level::from_str(name);
  if (level == spdlog::level::off && std::string(name) != "off") {
    std::fprintf(stderr,
                 "bridge: BRIDGE_LOG_LEVEL='%s' is unknown; use trace, debug, info, warn, error or off. "
                 "Logging at info.\n",
                 name);
    return spdlog::level::info;
  }
  return level;
}

// The one logger; configure_logging changes it in place, so references to it stay valid.
spdlog::logger& instance() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto created = std::make_shared<spdlog::logger>("bridge", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    created->flush_on(spdlog::level::warn);
    return created;
  }();
  return *logger;
}

void apply(spdlog::logger& logger, int rank, int world_size) {
  logger.set_pattern("[%Y-%m-%d %H:%M:%S] [rank " + std::to_string(rank) + "/" + std::to_string(world_size) +
                     "] [%l] %v");
  const spdlog::level::level_enum level = level_from_environment();
  const char* all_ranks = std::getenv("BRIDGE_LOG_ALL_RANKS");
  const bool every_rank = all_ranks != nullptr && std::string(all_ranks) == "1";
  logger.set_level(rank == 0 || every_rank ? level : std::max(level, spdlog::level::warn));
}

}  // namespace

void configure_logging(int rank, int world_size, std::shared_ptr<spdlog::sinks::sink> sink) {
  std::lock_guard<std::mutex> lock(g_mutex);
  spdlog::logger& logger = instance();
  if (sink) logger.sinks() = {std::move(sink)};
  apply(logger, rank, world_size);
  g_configured = true;
}

spdlog::logger& logger() {
  if (!g_configured) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_configured) apply(instance(), 0, 1);  // alone until init_distributed says otherwise
    g_configured = true;
  }
  return instance();
}

void log_info_on_this_rank(const std::string& message) {
  spdlog::logger& target = logger();
  const spdlog::details::log_msg line(target.name(), spdlog::level::info, message);
  for (const auto& sink : target.sinks()) {
    if (sink->should_log(line.level)) sink->log(line);
  }
  target.flush();
}

}  // namespace bridge::utils
