// Scalars as JSON Lines: one object per step, easy to read back with any JSON parser (pandas.read_json(lines=True)).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "utils/metric_writer.h"
#include "utils/output_file.h"

namespace bridge::utils {

/// Groups the scalars of one step into one line, keys in the order they were added:
///   {"step": 10, "lm loss": 2.31, "learning-rate": 0.0003}
/// A line is written when a scalar of another step arrives, or on flush(). Non-finite values are written as null
/// (JSON has no NaN). A tag added twice at one step keeps its first position and its last value.
class JsonlWriter : public MetricWriter {
 public:
  /// Opens `path` for appending, creating its parent directories, so a resumed run continues the same file. Throws
  /// std::runtime_error naming the path if it cannot be opened.
  explicit JsonlWriter(std::string path);
  /// Writes the pending line and flushes; errors are ignored here (call flush() to see them).
  ~JsonlWriter() override;

  /// Throws std::invalid_argument for the tag "step", which every line already uses for the step.
  void add_scalar(const std::string& tag, double value, int64_t step) override;
  void flush() override;

  const std::string& path() const { return file_->path(); }

 private:
  void write_pending_line();

  std::unique_ptr<OutputFile> file_;
  std::optional<int64_t> pending_step_;
  std::vector<std::pair<std::string, double>> pending_;  // this step's scalars, in the order added
};

}  // namespace bridge::utils
