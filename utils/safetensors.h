// Hugging Face's safetensors files, read and written: an 8-byte little-endian header length, a JSON header giving
// each tensor's dtype, shape and byte range ({"wte.weight": {"dtype": "F32", "shape": [50257, 768],
// "data_offsets": [0, 154389504]}, "__metadata__": {"format": "pt"}}), then the tensors' raw row-major little-endian
// bytes back to back. The format is simple enough that no library is needed (none is packaged in Debian).
//
//   utils::Safetensors file = utils::read_safetensors("gpt2/model.safetensors");
//   torch::Tensor wte = file.tensors.at("transformer.wte.weight");
//   utils::write_safetensors("out/model.safetensors", file.tensors);  // {"format": "pt"} metadata, as transformers
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

namespace bridge::utils {

struct Safetensors {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"
};

/// Reads every tensor of `path` (BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64) into CPU tensors. Throws
/// std::runtime_error naming the file and what is wrong with it: a header past the file, not JSON, a dtype bridge
/// does not read, byte ranges that overlap, leave holes or do not match the shape.
Safetensors read_safetensors(const std::filesystem::path& path);

/// Writes `tensors` (contiguous or not, any device) to `path` atomically, names in order, the header padded to 8
/// bytes as the reference writer does. `metadata` goes into "__metadata__"; transformers wants {"format": "pt"}.
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace bridge::utils
