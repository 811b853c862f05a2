// nlohmann-json behind utils/jsonl_writer.h (kept out of the header so users of the writer need not have it).
#include "utils/jsonl_writer.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

namespace bridge::utils {

JsonlWriter::JsonlWriter(std::string path)
    : file_(std::make_unique<OutputFile>(std::move(path), OutputFile::Mode::kAppend, "JsonlWriter")) {}

JsonlWriter::~JsonlWriter() {
  try {
    flush();
  } catch (...) {  // a destructor must not throw; flush() reports the same error to callers who ask
  }
}

void JsonlWriter::add_scalar(const std::string& tag, double value, int64_t step) { add(tag, value, step); }

void JsonlWriter::add_text(const std::string& tag, const std::string& text, int64_t step) { add(tag, text, step); }

void JsonlWriter::add(const std::string& tag, std::variant<double, std::string> value, int64_t step) {
  if (tag == "step") {
    throw std::invalid_argument("JsonlWriter: the tag 'step' is taken by the step number of every line in '" + path() +
                                "'; give the metric another name");
  }
  if (pending_step_ && *pending_step_ != step) write_pending_line();
  pending_step_ = step;
  pending_.emplace_back(tag, std::move(value));
}

void JsonlWriter::flush() {
  write_pending_line();
  file_->flush();
}

void JsonlWriter::write_pending_line() {
  if (!pending_step_) return;
  nlohmann::ordered_json line;
  line["step"] = *pending_step_;
  for (auto& [tag, value] : pending_) {
    if (auto* text = std::get_if<std::string>(&value)) {
      line[tag] = std::move(*text);
    } else if (const double number = std::get<double>(value); std::isfinite(number)) {
      line[tag] = number;
    } else {
      line[tag] = nullptr;
    }
  }
  pending_step_.reset();
  pending_.clear();
  // A generated text may end inside a UTF-8 sequence: replace what is not UTF-8 rather than fail the whole line.
  file_->write(line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
}

}  // namespace bridge::utils
