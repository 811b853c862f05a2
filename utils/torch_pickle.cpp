// The untagged pickle (LibTorch's Pickler with tag_aggregates off) in the zip container torch.save writes, streamed
// to a durable file; LibTorch 1.13 and 2.x have the same Pickler, writeArchiveAndTensors and PyTorchStreamWriter.
#include "utils/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <stdexcept>
#include <vector>

#include "utils/durable_file.h"

namespace bridge::utils {

void save_torch_pickle(const std::filesystem::path& path, const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  write_file_durably(path, [&](const WriteBytes& write) {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      write(static_cast<const char*>(data), size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  });
}

c10::IValue load_torch_pickle(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  try {
    return torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot read " + path.string() + " as a PyTorch file (" + error.what() +
                             "); it is damaged or was not written by torch.save / bridge");
  }
}

}  // namespace bridge::utils
