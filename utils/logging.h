// Rank-aware logging over spdlog. Every line is tagged with the rank ("[rank 3/8]"); by default only rank 0 prints
// informational messages, so a job prints them once, while warnings and errors print on every rank.
//
// Environment: BRIDGE_LOG_LEVEL (trace, debug, info, warn, error; default info) and BRIDGE_LOG_ALL_RANKS=1 (every
// rank prints at the configured level). init_distributed configures this; a program alone logs as rank 0 of 1.
#pragma once

#include <spdlog/logger.h>
#include <spdlog/sinks/sink.h>

#include <memory>
#include <string>

namespace bridge::utils {

/// Tags lines with `rank`/`world_size` and applies the per-rank level; keeps the current sinks unless `sink` is
/// given, which then replaces them (stderr by default).
void configure_logging(int rank, int world_size, std::shared_ptr<spdlog::sinks::sink> sink = nullptr);

/// The bridge logger. Example: bridge::utils::logger().info("step {} loss {:.3f}", step, loss);
spdlog::logger& logger();

/// Whether the logger's prefix adds a timestamp to a line (kAdd), or the line carries its own (kInMessage: Megatron's
/// training log line, " [2024-01-01 12:00:00] iteration ..."), so that every line has exactly one.
enum class Timestamp { kAdd, kInMessage };

/// Writes `message` at info level on this rank, past the per-rank filter: for lines only one chosen rank can write,
/// such as the training log on the last rank, which alone holds the losses (Megatron's print_rank_last).
void log_info_on_this_rank(const std::string& message, Timestamp timestamp = Timestamp::kAdd);

}  // namespace bridge::utils
