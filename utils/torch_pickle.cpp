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
namespace {

// torch 1.13's weights-only unpickler has no opcode for a Python float (BINFLOAT: it refuses even its own
// torch.save({"lr": 0.1})), so floats are written as 0-dim float64 tensors, which every torch.load(weights_only=True)
// reads, and become floats again on reading. Containers are rebuilt around the converted values.
template <class Convert>
c10::IValue map_leaves(const c10::IValue& value, const Convert& convert) {
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), c10::AnyType::get());
    out.reserve(dict.size());
    for (const auto& item : dict) out.insert(item.key(), map_leaves(item.value(), convert));
    return out;
  }
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    const c10::ArrayRef<c10::IValue> items = value.toListRef();
    out.reserve(items.size());
    for (const c10::IValue& item : items) out.push_back(map_leaves(item, convert));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(map_leaves(item, convert));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return convert(value);
}

c10::IValue floats_as_tensors(const c10::IValue& value) {
  return map_leaves(value, [](const c10::IValue& leaf) -> c10::IValue {
    return leaf.isDouble() ? c10::IValue(at::scalar_tensor(leaf.toDouble(), at::kDouble)) : leaf;
  });
}

c10::IValue tensors_as_floats(const c10::IValue& value) {
  return map_leaves(value, [](const c10::IValue& leaf) -> c10::IValue {
    if (!leaf.isTensor()) return leaf;
    const at::Tensor& tensor = leaf.toTensor();
    return tensor.dim() == 0 && tensor.scalar_type() == at::kDouble ? c10::IValue(tensor.item<double>()) : leaf;
  });
}

}  // namespace

void save_torch_pickle(const std::filesystem::path& path, const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(floats_as_tensors(value));
  pickler.stop();
  write_file_durably(path, [&](const WriteBytes& write) {
    // A failed write (a full disk) must not throw through LibTorch's zip writer: its destructor writes the end of
    // the file again and a second throw there aborts the process. The first error is kept, later writes are
    // skipped, and it is rethrown once the writer is gone.
    std::exception_ptr failure;
    {
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
        if (failure) return size;
        try {
          write(static_cast<const char*>(data), size);
        } catch (...) {
          failure = std::current_exception();
        }
        return size;
      });
      torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
      writer.writeEndOfFile();
    }
    if (failure) std::rethrow_exception(failure);
  });
}

c10::IValue load_torch_pickle(const std::filesystem::path& path) {
  const std::string bytes = read_file(path);
  try {
    return tensors_as_floats(torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())));
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot read " + path.string() + " as a PyTorch file (" + error.what() +
                             "); it is damaged or was not written by torch.save / bridge");
  }
}

}  // namespace bridge::utils
