// Scalars as a TensorBoard event file (read with `tensorboard --logdir <dir>`), written without TensorFlow.
#pragma once

#include <memory>
#include <string>

#include "utils/metric_writer.h"
#include "utils/output_file.h"

namespace bridge::utils {

/// Writes one event file in `log_dir`, named as TensorBoard's own writers name theirs
/// (events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter>), so TensorBoard and its EventAccumulator read it:
/// TFRecord framing around Event protos, the first carrying file_version "brain.Event:2", then one per scalar with
/// the value as a float (simple_value), as TensorBoard stores it.
class TensorBoardWriter : public MetricWriter {
 public:
  /// Creates `log_dir` (and parents) and a new event file in it; throws std::runtime_error naming the path if either
  /// cannot be created.
  explicit TensorBoardWriter(std::string log_dir);
  /// Flushes what is buffered; errors are ignored here (call flush() to see them).
  ~TensorBoardWriter() override;

  void add_scalar(const std::string& tag, double value, int64_t step) override;
  void add_text(const std::string& tag, const std::string& text, int64_t step) override;
  void flush() override;

  const std::string& log_dir() const { return log_dir_; }
  /// The event file this writer appends to.
  const std::string& file_path() const { return file_->path(); }

 private:
  void write_summary_value(const std::string& summary_value, int64_t step);  // one Summary.Value as an event
  void write_record(const std::string& event);

  std::string log_dir_;
  std::unique_ptr<OutputFile> file_;
};

}  // namespace bridge::utils
