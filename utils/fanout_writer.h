// One MetricWriter that forwards to several (TensorBoard plus JSON Lines, ...): Megatron-Bridge's MoE metric fanout
// writer, generalised from its fixed TensorBoard/Comet/MLflow trio to any list of sinks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "utils/metric_writer.h"

namespace bridge::utils {

/// Forwards every add_scalar, add_text and flush to each of its writers, in the order given. A writer that throws does
/// not stop the others: every writer gets the call, then the first error is rethrown (so one full disk does not also
/// cost the metrics of the other sinks).
class FanoutWriter : public MetricWriter {
 public:
  /// Null entries are skipped.
  explicit FanoutWriter(std::vector<std::shared_ptr<MetricWriter>> writers);

  void add_scalar(const std::string& tag, double value, int64_t step) override;
  void add_text(const std::string& tag, const std::string& text, int64_t step) override;
  void flush() override;

  /// The non-null writers, in order.
  const std::vector<std::shared_ptr<MetricWriter>>& writers() const { return writers_; }

 private:
  std::vector<std::shared_ptr<MetricWriter>> writers_;
};

/// The writer the training loop should use: `tensorboard` itself (the same object, even null) when `others` holds no
/// non-null writer, else a FanoutWriter over `tensorboard` (when not null) followed by `others`.
///
/// Example: build_metric_writer(tb, {}) == tb; build_metric_writer(nullptr, {jsonl}) fans out to {jsonl}.
std::shared_ptr<MetricWriter> build_metric_writer(std::shared_ptr<MetricWriter> tensorboard,
                                                  std::vector<std::shared_ptr<MetricWriter>> others);

}  // namespace bridge::utils
