// The untagged pickle (LibTorch's Pickler with tag_aggregates off) in the zip container torch.save writes, streamed
// to a durable file; LibTorch 1.13 and 2.x have the same Pickler, writeArchiveAndTensors and PyTorchStreamWriter.
#include "utils/torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/storage_context.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/zip_archive.h"

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

// The bytes of a file for LibTorch's zip reader, which trusts the offsets in the archive: LibTorch 1.13's own
// VectorReader (behind torch::jit::pickle_load) copies past the end of its buffer when a damaged file names an
// offset beyond it. Here a read past the end comes back short, and the reader refuses the archive.
class BoundedReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BoundedReader(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - static_cast<size_t>(pos));
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::string bytes_;
};

std::string hex(char byte) {
  constexpr char kDigits[] = "0123456789abcdef";
  const auto b = static_cast<unsigned char>(byte);
  return {kDigits[b >> 4], kDigits[b & 15]};
}

// LibTorch's unpickler allocates what a length or a memo index in the pickle asks for before using it (a memo table
// of 2 x index entries), so one flipped bit in a damaged file can ask for gigabytes. This walks the opcodes LibTorch
// reads, checking every length against the bytes that follow and every memo index against the entries stored so far
// (picklers number them from 0). Throws std::runtime_error.
void check_pickle_lengths(std::string_view pickle) {
  std::size_t at = 0;
  const auto need = [&](uint64_t bytes, char opcode) {
    if (bytes > pickle.size() - at) {
      throw std::runtime_error("opcode 0x" + hex(opcode) + " at byte " + std::to_string(at - 1) +
                               " of data.pkl needs " + std::to_string(bytes) + " bytes, but " +
                               std::to_string(pickle.size() - at) + " remain");
    }
  };
  const auto length = [&](int width, char opcode) {
    need(static_cast<uint64_t>(width), opcode);
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(pickle[at + i]);
    at += static_cast<std::size_t>(width);
    return value;
  };
  const auto skip = [&](uint64_t bytes, char opcode) {
    need(bytes, opcode);
    at += static_cast<std::size_t>(bytes);
  };
  uint64_t memo_size = 0;
  const auto memo = [&](int width, char opcode, bool put) {
    const uint64_t index = length(width, opcode);
    if (put ? index > memo_size : index >= memo_size) {
      throw std::runtime_error("opcode 0x" + hex(opcode) + " at byte " + std::to_string(at - 1 - width) +
                               " of data.pkl names memo entry " + std::to_string(index) + ", but " +
                               std::to_string(memo_size) + " are stored");
    }
    memo_size = std::max(memo_size, index + 1);
  };
  const auto skip_line = [&](char opcode) {
    const std::size_t end = pickle.find('\n', at);
    if (end == std::string_view::npos) need(pickle.size() - at + 1, opcode);
    at = end + 1;
  };
  while (at < pickle.size()) {
    const char opcode = pickle[at++];
    switch (opcode) {
      case '.':  // STOP
        return;
      case 'K':
      case '\x80':  // BININT1, PROTO
        skip(1, opcode);
        break;
      case 'h':  // BINGET
      case 'q':  // BINPUT
        memo(1, opcode, opcode == 'q');
        break;
      case 'j':  // LONG_BINGET
      case 'r':  // LONG_BINPUT
        memo(4, opcode, opcode == 'r');
        break;
      case '\x94':  // MEMOIZE
        ++memo_size;
        break;
      case 'M':  // BININT2
        skip(2, opcode);
        break;
      case 'J':  // BININT
        skip(4, opcode);
        break;
      case 'G':
      case '\x95':  // BINFLOAT, FRAME
        skip(8, opcode);
        break;
      case 'U':
      case 'C':
      case '\x8c':
      case '\x8a':  // SHORT_BINSTRING, SHORT_BINBYTES, SHORT_BINUNICODE, LONG1
        skip(length(1, opcode), opcode);
        break;
      case 'T':
      case 'B':
      case 'X':
      case '\x8b':  // BINSTRING, BINBYTES, BINUNICODE, LONG4
        skip(length(4, opcode), opcode);
        break;
      case '\x8d':
      case '\x8e':
      case '\x96':  // BINUNICODE8, BINBYTES8, BYTEARRAY8
        skip(length(8, opcode), opcode);
        break;
      case 'c':  // GLOBAL: module and name, one line each
        skip_line(opcode);
        skip_line(opcode);
        break;
      case 'I':
      case 'L':
      case 'F':
      case 'S':
      case 'V':
      case 'P':
      case 'g':
      case 'p':  // text-argument opcodes
        skip_line(opcode);
        break;
      case '}':
      case ']':
      case ')':
      case '(':
      case 'e':
      case 'a':
      case 's':
      case 'u':
      case 't':
      case 'R':
      case 'b':
      case 'N':
      case 'Q':
      case '0':
      case '1':
      case '2':
      case '\x81':
      case '\x85':
      case '\x86':
      case '\x87':
      case '\x88':
      case '\x89':
      case 'd':
      case 'l':
      case 'o':
      case '\x8f':
      case '\x90':
      case '\x91':
      case '\x92':
      case '\x93':  // no argument
        break;
      case 'i':  // INST: module and name, one line each
        skip_line(opcode);
        skip_line(opcode);
        break;
      case '\x82':  // EXT1
        skip(1, opcode);
        break;
      case '\x83':  // EXT2
        skip(2, opcode);
        break;
      case '\x84':  // EXT4
        skip(4, opcode);
        break;
      default:
        throw std::runtime_error("byte " + std::to_string(at - 1) + " of data.pkl is 0x" + hex(opcode) +
                                 ", not a pickle opcode");
    }
  }
}

// Every tensor of a loaded value, checked for what LibTorch's unpickler lets through: a quantized dtype without a
// quantizer, and (1.13's, which sets sizes, strides and offset as the pickle gives them; 2.x compares them with the
// storage) a tensor reaching past its storage. `where` is its path in the value ("nested/u").
void check_loaded_tensors(const c10::IValue& value, const std::string& where) {
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "?";
      check_loaded_tensors(item.value(), where.empty() ? key : where + "/" + key);
    }
  } else if (value.isList()) {
    std::size_t i = 0;
    for (const c10::IValue& item : value.toListRef())
      check_loaded_tensors(item, where + "[" + std::to_string(i++) + "]");
  } else if (value.isTuple()) {
    std::size_t i = 0;
    for (const c10::IValue& item : value.toTupleRef().elements()) {
      check_loaded_tensors(item, where + "[" + std::to_string(i++) + "]");
    }
  } else if (value.isTensor() && value.toTensor().defined() && c10::isQIntType(value.toTensor().scalar_type())) {
    // A QInt storage under _rebuild_tensor_v2 makes a quantized-dtype tensor with no quantizer, which LibTorch's own
    // pickler then fails an internal assert on; torch.save writes quantized tensors another way (_rebuild_qtensor),
    // and no checkpoint holds them.
    throw std::runtime_error("the tensor " + (where.empty() ? std::string("at the top") : "'" + where + "'") +
                             " has the quantized dtype " + c10::toString(value.toTensor().scalar_type()) +
                             " without a quantizer; bridge reads float, integer and bool tensors only");
  } else if (value.isTensor() && value.toTensor().defined() && value.toTensor().numel() > 0) {
    const at::Tensor& tensor = value.toTensor();
    // The byte after the last element: (offset + sum((size - 1) * stride) + 1) * element size, each step checked.
    int64_t end = tensor.storage_offset();
    bool fits = end >= 0;
    for (int64_t d = 0; fits && d < tensor.dim(); ++d) {
      int64_t step = 0;
      fits = tensor.stride(d) >= 0 && !__builtin_mul_overflow(tensor.size(d) - 1, tensor.stride(d), &step) &&
             !__builtin_add_overflow(end, step, &end);
    }
    const auto item = static_cast<int64_t>(tensor.element_size());
    fits = fits && !__builtin_add_overflow(end, int64_t{1}, &end) && !__builtin_mul_overflow(end, item, &end) &&
           static_cast<uint64_t>(end) <= tensor.storage().nbytes();
    if (!fits) {
      throw std::runtime_error("the tensor " + (where.empty() ? std::string("at the top") : "'" + where + "'") +
                               " (sizes " + c10::str(tensor.sizes()) + ", strides " + c10::str(tensor.strides()) +
                               ", offset " + std::to_string(tensor.storage_offset()) + ", " + std::to_string(item) +
                               "-byte elements) reaches past the end of its " +
                               std::to_string(tensor.storage().nbytes()) + "-byte storage");
    }
  }
}

}  // namespace

std::string torch_pickle_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(floats_as_tensors(value));
  pickler.stop();
  std::string out;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      out.append(static_cast<const char*>(data), size);
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  return out;
}

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
      // The archive ends with bridge's whole-file checksum, which load_torch_pickle verifies (zip_archive.h).
      ChecksummedZipSink checksummed(write);
      caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
        if (failure) return size;
        try {
          checksummed.write(static_cast<const char*>(data), size);
        } catch (...) {
          failure = std::current_exception();
        }
        return size;
      });
      torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
      writer.writeEndOfFile();
      if (!failure) checksummed.finish();
    }
    if (failure) std::rethrow_exception(failure);
  });
}

c10::IValue load_torch_pickle(const std::filesystem::path& path, ZipCheck* check) {
  return load_torch_pickle_bytes(read_file(path), path.string(), check);
}

c10::IValue load_torch_pickle_bytes(std::string bytes, const std::string& what, ZipCheck* check) {
  try {
    const ZipCheck done = verify_zip_archive(bytes);
    if (check != nullptr) *check = done;
  } catch (const DamagedFileError& error) {
    throw DamagedFileError(what + " is damaged: " + error.what() +
                           ". Its bytes are not the ones that were written (a disk or copy error); restore it from "
                           "a copy, or use another file");
  }
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BoundedReader>(std::move(bytes)));
    const auto [pickle, pickle_size] = reader.getRecord("data.pkl");
    check_pickle_lengths(std::string_view(static_cast<const char*>(pickle.get()), pickle_size));
    // What torch::jit::pickle_load does, over the bounded reader: the pickle "data.pkl" and its tensors' records.
    // Each storage is the record's bytes, as many as the file holds and not resizable. Left to itself, the
    // unpickler sizes a storage by the element count its pickle declares, whatever the record holds, so a damaged
    // file (or one naming a float storage's key again as int64s) made a tensor reaching past its buffer. Now a
    // storage too small for its tensor is refused (by 2.x's unpickler, and by check_loaded_tensors on 1.13). Tensors
    // sharing a key also share one storage again, as in Python, instead of each reading its own copy.
    auto storages = std::make_shared<torch::jit::DeserializationStorageContext>();
    for (const std::string& name : reader.getAllRecords()) {
      if (name.rfind("data/", 0) != 0) continue;
      auto [data, size] = reader.getRecord(name);
      storages->addStorage(name.substr(5), c10::Storage(c10::Storage::use_byte_size_t(), size, std::move(data),
                                                        /*allocator=*/nullptr, /*resizable=*/false));
    }
    const c10::IValue value = torch::jit::readArchiveAndTensors("data", "", "", {}, {}, {}, reader,
                                                                torch::jit::Unpickler::defaultTypeParser, storages);
    check_loaded_tensors(value, "");
    return tensors_as_floats(value);
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot read " + what + " as a PyTorch file (" + describe(error) +
                             "); it is damaged or was not written by torch.save / bridge");
  }
}

}  // namespace bridge::utils
