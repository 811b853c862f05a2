// The process-wide bridge logger and its per-rank configuration.
#include "utils/logging.h"

#include <spdlog/details/os.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>

namespace bridge::utils {
namespace {

std::mutex g_mutex;
std::atomic<bool> g_configured{false};

// Marks a line that carries its own timestamp. spdlog's log_msg has no field of ours, and its source location is the
// one thing a sink's formatter sees besides the text; the pattern prints no source, so the mark never shows.
constexpr const char* kTimestampInMessage = "bridge: timestamp in message";

// The pattern's "[YYYY-MM-DD HH:MM:SS] ", left out of a line marked kTimestampInMessage, so that a line has one.
class TimestampFlag : public spdlog::custom_flag_formatter {
 public:
  // The pattern's own time is not passed in: spdlog computes it only for patterns with time flags of its own.
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    if (msg.source.funcname == kTimestampInMessage) return;
    const std::tm time = spdlog::details::os::localtime(spdlog::log_clock::to_time_t(msg.time));
    char text[32];
    const std::size_t size = std::strftime(text, sizeof(text), "[%Y-%m-%d %H:%M:%S] ", &time);
    dest.append(text, text + size);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<TimestampFlag>(); }
};

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
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<TimestampFlag>('*').set_pattern("%*[rank " + std::to_string(rank) + "/" +
                                                      std::to_string(world_size) + "] [%l] %v");
  logger.set_formatter(std::move(formatter));
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

void log_info_on_this_rank(const std::string& message, Timestamp timestamp) {
  spdlog::logger& target = logger();
  const spdlog::source_loc mark{nullptr, 0, timestamp == Timestamp::kInMessage ? kTimestampInMessage : nullptr};
  const spdlog::details::log_msg line(mark, target.name(), spdlog::level::info, message);
  for (const auto& sink : target.sinks()) {
    if (sink->should_log(line.level)) sink->log(line);
  }
  target.flush();
}

}  // namespace bridge::utils
