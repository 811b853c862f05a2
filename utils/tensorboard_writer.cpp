// The event file format behind utils/tensorboard_writer.h. The protobuf messages involved are encoded by hand: a
// dozen fields do not justify generated code, and there are no .proto files here.
//
//   message Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   message Summary { repeated Value value = 1; }
//   message Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
//
// A text is a string tensor of shape [1] marked for the text plugin, as torch.utils.tensorboard's add_text writes it:
//
//   message SummaryMetadata  { PluginData plugin_data = 1; }   message PluginData { string plugin_name = 1; }
//   message TensorProto      { DataType dtype = 1; TensorShapeProto tensor_shape = 2; repeated bytes string_val = 8; }
//   message TensorShapeProto { repeated Dim dim = 2; }          message Dim { int64 size = 1; }
//
// Each event is one TFRecord: uint64 length, masked CRC32C of those 8 bytes, the bytes, masked CRC32C of the bytes,
// all little-endian.
#include "utils/tensorboard_writer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "utils/crc32c.h"

namespace bridge::utils {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (field << 3) | type); }

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

void put_int64(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));  // negative values take ten bytes, as protobuf's int64 does
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Rounds to the nearest float. Finite values past the point where rounding overflows become infinities, as in
// TensorBoard's Python writers; spelled out because the plain cast is not defined beyond float's range.
float to_float(double value) {
  constexpr double kOverflow = 0x1.ffffffp127;  // float's largest value plus half a unit in the last place
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  if (std::isfinite(value) && std::abs(value) >= kOverflow) return value > 0 ? kInfinity : -kInfinity;
  return static_cast<float>(value);
}

// `text` with every byte that does not belong to a well-formed UTF-8 sequence replaced by U+FFFD: TensorBoard's text
// plugin decodes strictly and shows an error instead of a tag whose text ends inside a character (which a byte-level
// tokenizer's continuation often does).
std::string valid_utf8(const std::string& text) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};  // by length: shorter forms are overlong
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const std::size_t length = lead < 0x80           ? 1
                               : (lead >> 5) == 0x6  ? 2
                               : (lead >> 4) == 0xE  ? 3
                               : (lead >> 3) == 0x1E ? 4
                                                     : 0;
    bool valid = length > 0 && i + length <= text.size();
    uint32_t code_point = length > 1 ? lead & (0xFFu >> (length + 1)) : lead;
    for (std::size_t k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code_point = (code_point << 6) | (next & 0x3Fu);
    }
    if (valid && length > 1) {
      valid =
          code_point >= kSmallest[length] && code_point <= 0x10FFFF && !(code_point >= 0xD800 && code_point <= 0xDFFF);
    }
    if (valid) {
      out.append(text, i, length);
      i += length;
    } else {
      out += kReplacement;
      i += 1;
    }
  }
  return out;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// TensorBoard's file name; the counter keeps two writers opened in the same second by one process apart.
std::string event_file_name() {
  static std::atomic<int> counter{0};
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(unix_seconds_now()));
  return "events.out.tfevents." + std::string(seconds) + "." + hostname() + "." + std::to_string(::getpid()) + "." +
         std::to_string(counter++);
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(std::string log_dir) : log_dir_(std::move(log_dir)) {
  if (log_dir_.empty()) throw std::invalid_argument("TensorBoardWriter: log_dir is empty; give a directory");
  file_ = std::make_unique<OutputFile>(log_dir_ + "/" + event_file_name(), OutputFile::Mode::kTruncate,
                                       "TensorBoardWriter");
  std::string event;
  put_double(event, 1, unix_seconds_now());
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
  file_->flush();  // readers recognise the file from its first record
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    file_->flush();
  } catch (...) {  // a destructor must not throw; flush() reports the same error to callers who ask
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_float(summary_value, 2, to_float(value));
  write_summary_value(summary_value, step);
}

void TensorBoardWriter::add_text(const std::string& tag, const std::string& text, int64_t step) {
  constexpr int64_t kDtString = 7;  // tensorflow.DataType.DT_STRING
  std::string dim;
  put_int64(dim, 1, 1);
  std::string shape;
  put_bytes(shape, 2, dim);
  std::string tensor;
  put_int64(tensor, 1, kDtString);
  put_bytes(tensor, 2, shape);
  put_bytes(tensor, 8, valid_utf8(text));
  std::string plugin_data;
  put_bytes(plugin_data, 1, "text");
  std::string metadata;
  put_bytes(metadata, 1, plugin_data);

  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_bytes(summary_value, 8, tensor);
  put_bytes(summary_value, 9, metadata);
  write_summary_value(summary_value, step);
}

void TensorBoardWriter::write_summary_value(const std::string& summary_value, int64_t step) {
  std::string summary;
  put_bytes(summary, 1, summary_value);

  std::string event;
  put_double(event, 1, unix_seconds_now());
  put_int64(event, 2, step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::flush() { file_->flush(); }

void TensorBoardWriter::write_record(const std::string& event) {
  std::string header;
  put_little_endian(header, event.size(), 8);
  std::string record = header;
  put_little_endian(record, masked_crc32c(header), 4);
  record += event;
  put_little_endian(record, masked_crc32c(event), 4);
  file_->write(record);
}

}  // namespace bridge::utils
