// safetensors: the header's JSON with nlohmann-json, the bytes through a memory mapping (reading) and the durable
// writer (writing).
#include "utils/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

#include "utils/durable_file.h"
#include "utils/mapped_file.h"

namespace bridge::utils {
namespace {

struct DTypeName {
  const char* name;
  torch::ScalarType type;
};

constexpr DTypeName kDTypes[] = {{"BOOL", torch::kBool},   {"U8", torch::kUInt8},      {"I8", torch::kInt8},
                                 {"I16", torch::kInt16},   {"I32", torch::kInt32},     {"I64", torch::kInt64},
                                 {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16}, {"F32", torch::kFloat32},
                                 {"F64", torch::kFloat64}};

// Headers past this are refused, as the reference reader does: a damaged length would otherwise allocate it.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

uint64_t read_le64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

}  // namespace

Safetensors read_safetensors(const std::filesystem::path& path) {
  const MappedFile file(path.string());
  const auto fail = [&](const std::string& what) {
    return std::runtime_error("safetensors file " + path.string() + ": " + what);
  };
  if (file.size() < 8) throw fail("shorter than its 8-byte header length");
  const uint64_t header_size = read_le64(file.data());
  if (header_size > kMaxHeaderBytes || header_size > file.size() - 8) {
    throw fail("its header length " + std::to_string(header_size) + " runs past the file (" +
               std::to_string(file.size()) + " bytes): not a safetensors file, or a truncated one");
  }
  const char* header_text = reinterpret_cast<const char*>(file.data() + 8);
  if (header_size == 0 || header_text[0] != '{') throw fail("its header is not a JSON object");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text, header_text + header_size);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("its header is not JSON: ") + e.what());
  }
  const unsigned char* buffer = file.data() + 8 + header_size;
  const uint64_t buffer_size = file.size() - 8 - header_size;

  Safetensors result;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == "__metadata__") {
      for (const auto& field : entry.items()) {
        if (field.value().is_string()) result.metadata[field.key()] = field.value().get<std::string>();
      }
      continue;
    }
    try {
      const std::string dtype = entry.at("dtype").get<std::string>();
      const auto known =
          std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DTypeName& d) { return dtype == d.name; });
      if (known == std::end(kDTypes))
        throw fail("tensor '" + name + "' has dtype " + dtype + ", which bridge does not read");
      const std::vector<int64_t> shape = entry.at("shape").get<std::vector<int64_t>>();
      const std::vector<uint64_t> offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > buffer_size) {
        throw fail("tensor '" + name + "' has byte range outside the data");
      }
      torch::Tensor tensor = torch::empty(shape, torch::TensorOptions().dtype(known->type));
      const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
      if (offsets[1] - offsets[0] != bytes) {
        throw fail("tensor '" + name + "' holds " + std::to_string(offsets[1] - offsets[0]) +
                   " bytes, but its shape and " + dtype + " need " + std::to_string(bytes));
      }
      if (bytes > 0) std::memcpy(tensor.data_ptr(), buffer + offsets[0], bytes);
      ranges.emplace_back(offsets[0], offsets[1]);
      result.tensors.emplace(name, std::move(tensor));
    } catch (const nlohmann::json::exception& e) {
      throw fail("tensor '" + name + "' is not {dtype, shape, data_offsets}: " + e.what());
    }
  }
  // The tensors tile the data exactly: no overlap, no hole, nothing after the last.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != covered)
      throw fail("its tensors' byte ranges overlap or leave a hole at byte " + std::to_string(covered));
    covered = end;
  }
  if (covered != buffer_size) {
    throw fail(std::to_string(buffer_size - covered) + " bytes after the last tensor: a damaged file");
  }
  return result;
}

void write_safetensors(const std::filesystem::path& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contents;
  uint64_t offset = 0;
  for (const auto& item : tensors) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang refuses).
    const std::string& name = item.first;
    const torch::Tensor& tensor = item.second;
    if (name == "__metadata__") throw std::invalid_argument("write_safetensors: '__metadata__' is not a tensor name");
    const auto known = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                    [&](const DTypeName& d) { return tensor.scalar_type() == d.type; });
    if (known == std::end(kDTypes)) {
      throw std::invalid_argument("write_safetensors: tensor '" + name + "' has a dtype safetensors has no name for");
    }
    torch::Tensor bytes = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t size = static_cast<uint64_t>(bytes.numel()) * bytes.element_size();
    header[name] = {{"dtype", known->name}, {"shape", bytes.sizes().vec()}, {"data_offsets", {offset, offset + size}}};
    offset += size;
    contents.push_back(std::move(bytes));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  write_file_durably(path, [&](const WriteBytes& write) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    write(reinterpret_cast<const char*>(length), 8);
    write(text.data(), text.size());
    for (const torch::Tensor& bytes : contents) {
      write(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel()) * bytes.element_size());
    }
  });
}

}  // namespace bridge::utils
