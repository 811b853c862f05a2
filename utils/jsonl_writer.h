// Scalars as JSON Lines: one object per step, easy to read back with any JSON parser (pandas.read_json(lines=True)).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "utils/metric_writer.h"
#include "utils/output_file.h"

namespace bridge::utils {

/// Groups the scalars of one step into one line, keys in the order they were added:
///   {"step": 10, "lm loss": 2.31, "learning-rate": 0.0003}
/// A line is written when a scalar of another step arrives, or on flush(). Non-finite values are written as null
/// (JSON has no NaN); texts are JSON strings, invalid UTF-8 replaced by U+FFFD. A tag added twice at one step keeps
/// its first position and its last value.
class JsonlWriter : public MetricWriter {
 public:
  /// Opens `path` for appending, creating its parent directories, so a resumed run continues the same file. Throws
  /// std::runtime_error naming the path if it cannot be opened.
  explicit JsonlWriter(std::string path);
  /// Writes the pending line and flushes; errors are ignored here (call flush() to see them).
  ~JsonlWriter() override;

  /// Both throw std::invalid_argument for the tag "step", which every line already uses for the step.
  void add_scalar(const std::string& tag, double value, int64_t step) override;
  void add_text(const std::string& tag, const std::string& text, int64_t step) override;
  void flush() override;

  const std::string& path() const { return file_->path(); }

 private:
  void add(const std::string& tag, std::variant<double, std::string> value, int64_t step);
  void write_pending_line();

  std::unique_ptr<OutputFile> file_;
  std::optional<int64_t> pending_step_;
  std::vector<std::pair<std::string, std::variant<double, std::string>>> pending_;  // this step's, in the order added
};

}  // namespace bridge::utils
