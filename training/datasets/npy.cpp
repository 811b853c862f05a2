// .npy writer and reader.
#include "training/datasets/npy.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "utils/durable_file.h"

namespace bridge::training::datasets {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;

const char* descr(NpyType type) {
  switch (type) {
    case NpyType::kInt32:
      return "<i4";
    case NpyType::kUInt32:
      return "<u4";
    case NpyType::kInt64:
      return "<i8";
  }
  return "?";
}

std::size_t item_size(NpyType type) { return type == NpyType::kInt64 ? 8 : 4; }

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::runtime_error("npy: " + path + " is not a readable index cache: " + what);
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  // A temporary name unique to this host, process and call, then an atomic rename over any earlier file.
  static std::atomic<uint64_t> counter{0};
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string tmp = path + ".tmp." + host + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      throw std::runtime_error("writing " + tmp + " failed (is the disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(tmp.c_str());
    throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + error);
  }
}

std::string npy_bytes(NpyType type, const std::vector<int64_t>& shape, const std::vector<int64_t>& values,
                      const std::string& path) {
  int64_t count = 1;
  for (const int64_t dim : shape) count *= dim;
  if (count != static_cast<int64_t>(values.size())) {
    throw std::invalid_argument("save_npy: shape holds " + std::to_string(count) + " values, got " +
                                std::to_string(values.size()) + " (" + path + ")");
  }
  // numpy.save's header: the sorted dict, room for the first axis to grow to 21 digits, spaces up to a multiple of
  // 64 bytes, then a newline.
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header =
      std::string("{'descr': '") + descr(type) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  if (!shape.empty()) header += std::string(21 - std::to_string(shape[0]).size(), ' ');
  const std::size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
  header += std::string(64 - unpadded % 64, ' ') + "\n";

  std::string bytes(kMagic, kMagicSize);
  bytes += '\x01';
  bytes += '\x00';
  const auto header_size = static_cast<uint16_t>(header.size());
  bytes += static_cast<char>(header_size & 0xFF);
  bytes += static_cast<char>(header_size >> 8);
  bytes += header;
  const std::size_t item = item_size(type);
  const std::size_t data_start = bytes.size();
  bytes.resize(data_start + values.size() * item);
  int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  if (type == NpyType::kInt32) {
    lowest = std::numeric_limits<int32_t>::min();
    highest = std::numeric_limits<int32_t>::max();
  } else if (type == NpyType::kUInt32) {
    lowest = 0;
    highest = std::numeric_limits<uint32_t>::max();
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    if (v < lowest || v > highest) {
      throw std::invalid_argument("save_npy: value " + std::to_string(v) + " does not fit " + descr(type) + " (" +
                                  path + ")");
    }
    char* at = bytes.data() + data_start + i * item;
    if (item == 8) {
      std::memcpy(at, &v, 8);
    } else {
      const auto narrow = static_cast<uint32_t>(v);
      std::memcpy(at, &narrow, 4);
    }
  }

  return bytes;
}

void save_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
              const std::vector<int64_t>& values) {
  write_file_atomically(path, npy_bytes(type, shape, values, path));
}

NpyArray load_npy(const std::string& path) { return parse_npy(bridge::utils::read_file(path), path); }

NpyArray parse_npy(std::string_view bytes, const std::string& path) {
  if (bytes.size() < kMagicSize + 4 || bytes.compare(0, kMagicSize, kMagic, kMagicSize) != 0) bad(path, "bad magic");
  const auto major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_start = 10;
  std::size_t header_size = 0;
  if (major == 1) {
    header_size = static_cast<unsigned char>(bytes[8]) | static_cast<std::size_t>(static_cast<unsigned char>(bytes[9]))
                                                             << 8;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(path, "truncated header");
    header_start = 12;
    for (std::size_t i = 0; i < 4; ++i)
      header_size |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  } else {
    bad(path, "format version " + std::to_string(major) + " (expected 1, 2 or 3)");
  }
  if (header_size > bytes.size() - header_start) bad(path, "truncated header");
  const std::string header(bytes.substr(header_start, header_size));

  const auto field = [&](const std::string& key) {
    const std::size_t at = header.find("'" + key + "':");
    if (at == std::string::npos) bad(path, "the header has no '" + key + "'");
    std::size_t start = at + key.size() + 3;
    while (start < header.size() && header[start] == ' ') ++start;
    return start;
  };
  NpyArray array;
  const std::size_t d = field("descr");
  const std::string type = header.substr(d, 5);
  if (type == "'<i4'") {
    array.type = NpyType::kInt32;
  } else if (type == "'<u4'") {
    array.type = NpyType::kUInt32;
  } else if (type == "'<i8'") {
    array.type = NpyType::kInt64;
  } else {
    bad(path, "element type " + type + " (expected '<i4', '<u4' or '<i8')");
  }
  if (header.compare(field("fortran_order"), 5, "False") != 0) bad(path, "Fortran order is not supported");
  const std::size_t s = field("shape");
  const std::size_t close = header.find(')', s);
  if (header[s] != '(' || close == std::string::npos) bad(path, "malformed shape");
  int64_t count = 1;
  std::istringstream dims(header.substr(s + 1, close - s - 1));
  std::string dim;
  while (std::getline(dims, dim, ',')) {
    const std::size_t first = dim.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    char* end = nullptr;
    const long long value = std::strtoll(dim.c_str() + first, &end, 10);
    if (end == dim.c_str() + first || value < 0 || (*end != '\0' && *end != ' ') ||
        value > static_cast<long long>(bytes.size())) {
      bad(path, "malformed shape entry '" + dim + "'");
    }
    array.shape.push_back(value);
    if (value > 0 && count > static_cast<int64_t>(bytes.size()) / value) {
      bad(path, "the shape holds more values than the file has bytes");
    }
    count *= value;
  }
  const std::size_t data_start = header_start + header_size;
  const std::size_t item = item_size(array.type);
  if (bytes.size() - data_start != static_cast<std::size_t>(count) * item) {
    bad(path, "the data has " + std::to_string(bytes.size() - data_start) + " bytes, but the shape needs " +
                  std::to_string(count * static_cast<int64_t>(item)) + " (truncated?)");
  }
  array.values.resize(static_cast<std::size_t>(count));
  const char* data = bytes.data() + data_start;
  for (std::size_t i = 0; i < array.values.size(); ++i) {
    if (array.type == NpyType::kInt64) {
      std::memcpy(&array.values[i], data + 8 * i, 8);
    } else if (array.type == NpyType::kInt32) {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      array.values[i] = v;
    } else {
      uint32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      array.values[i] = v;
    }
  }
  return array;
}

}  // namespace bridge::training::datasets
