// The one interface the training loop writes its metrics (loss, learning rate, grad norm, ...) through, whatever
// the sinks behind it are: TensorBoard event files, JSON Lines, or several at once (utils/fanout_writer.h).
#pragma once

#include <cstdint>
#include <string>

namespace bridge::utils {

/// A sink for scalar metrics and texts, modelled on TensorBoard's SummaryWriter. Implementations are not thread-safe:
/// the loop writes from one thread.
class MetricWriter {
 public:
  virtual ~MetricWriter() = default;
  /// One scalar under `tag` at `step` (TensorBoard's add_scalar). Tags may contain spaces and '/'.
  virtual void add_scalar(const std::string& tag, double value, int64_t step) = 0;
  /// A text (UTF-8; invalid bytes may be replaced) under `tag` at `step` (TensorBoard's add_text), e.g. the
  /// continuations TextGenerator writes.
  virtual void add_text(const std::string& tag, const std::string& text, int64_t step) = 0;
  /// Makes everything written so far visible to readers (the loop calls it after each log point and at the end).
  virtual void flush() = 0;
};

}  // namespace bridge::utils
