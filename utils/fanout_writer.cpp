// The forwarding and the error policy behind utils/fanout_writer.h.
#include "utils/fanout_writer.h"

#include <algorithm>
#include <exception>
#include <utility>

namespace bridge::utils {
namespace {

// Calls `call` on every writer, then rethrows the first exception any of them threw.
template <class Call>
void call_each(const std::vector<std::shared_ptr<MetricWriter>>& writers, const Call& call) {
  std::exception_ptr first_error;
  for (const auto& writer : writers) {
    try {
      call(*writer);
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace

FanoutWriter::FanoutWriter(std::vector<std::shared_ptr<MetricWriter>> writers) {
  for (auto& writer : writers) {
    if (writer) writers_.push_back(std::move(writer));
  }
}

void FanoutWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  call_each(writers_, [&](MetricWriter& writer) { writer.add_scalar(tag, value, step); });
}

void FanoutWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  call_each(writers_, [&](MetricWriter& writer) { writer.add_text(tag, text, step); });
}

void FanoutWriter::flush() {
  call_each(writers_, [](MetricWriter& writer) { writer.flush(); });
}

std::shared_ptr<MetricWriter> build_metric_writer(std::shared_ptr<MetricWriter> tensorboard,
                                                  std::vector<std::shared_ptr<MetricWriter>> others) {
  const bool any_other =
      std::any_of(others.begin(), others.end(), [](const auto& writer) { return writer != nullptr; });
  if (!any_other) return tensorboard;
  others.insert(others.begin(), std::move(tensorboard));
  return std::make_shared<FanoutWriter>(std::move(others));
}

}  // namespace bridge::utils
