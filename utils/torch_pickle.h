// PyTorch's own file format for checkpoints: a zip archive holding a pickle and the tensors' storages, which Python's
// torch.load opens, also with weights_only=True (torch >= 2.6's default, and how Megatron-LM loads). LibTorch's
// torch::pickle_save writes the same archive but tags every dict and list with its TorchScript type, a global the
// weights-only unpickler refuses; these functions write them untagged, and read either. torch 1.13's weights-only
// unpickler cannot read a Python float at all, so floats are stored as 0-dim float64 tensors (Python sees
// tensor(0.001, dtype=torch.float64)) and read back as floats: a 0-dim float64 tensor therefore comes back as a float.
//
//   c10::impl::GenericDict state(c10::AnyType::get(), c10::AnyType::get());
//   state.insert("model", weights);
//   save_torch_pickle("ckpt/model_optim_rng.pt", state);   // durably: temporary file, fsync, rename
//   c10::IValue back = load_torch_pickle("ckpt/model_optim_rng.pt");
#pragma once

#include <ATen/core/ivalue.h>

#include <filesystem>
#include <string>

#include "utils/zip_archive.h"

namespace bridge::utils {

/// Writes `value` (dicts, lists, tuples, strings, numbers, None and CPU tensors) to `path` atomically and durably
/// (see durable_file.h). Throws std::runtime_error naming the path.
void save_torch_pickle(const std::filesystem::path& path, const c10::IValue& value);

/// Reads a file that save_torch_pickle, torch::pickle_save or Python's torch.save (of plain containers and tensors)
/// wrote, after verifying its checksums (zip_archive.h): DamagedFileError naming the path when they do not match,
/// std::runtime_error naming it when it cannot be read otherwise. `check`, when given, says which checksums it had.
c10::IValue load_torch_pickle(const std::filesystem::path& path, ZipCheck* check = nullptr);

/// torch.save's bytes of `value` (as save_torch_pickle, without bridge's whole-file checksum): a payload stored inside
/// another file, such as a distributed checkpoint's object items.
std::string torch_pickle_bytes(const c10::IValue& value);

/// load_torch_pickle of bytes held in memory; `what` names them in errors.
c10::IValue load_torch_pickle_bytes(std::string bytes, const std::string& what, ZipCheck* check = nullptr);

}  // namespace bridge::utils
