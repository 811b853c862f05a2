// DCP's writing side: the per-rank data files, the records gathered to the coordinator, and the coordinator's
// checks, checksum file and .metadata pickle. The reading side is dcp_reader.cpp.
#include "utils/dcp.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/python_pickle.h"
#include "utils/zip_archive.h"

namespace bridge::utils::dcp {

namespace fs = std::filesystem;
using pickle::Global;
using pickle::Value;

namespace {

struct DtypeName {
  c10::ScalarType dtype;
  const char* name;
};
// Python's canonical names first (what str(torch.float32) gives and pickle writes), then the aliases.
constexpr DtypeName kDtypeNames[] = {
    {c10::ScalarType::Float, "float32"},
    {c10::ScalarType::Double, "float64"},
    {c10::ScalarType::BFloat16, "bfloat16"},
    {c10::ScalarType::Half, "float16"},
    {c10::ScalarType::Long, "int64"},
    {c10::ScalarType::Int, "int32"},
    {c10::ScalarType::Short, "int16"},
    {c10::ScalarType::Char, "int8"},
    {c10::ScalarType::Byte, "uint8"},
    {c10::ScalarType::Bool, "bool"},
    {c10::ScalarType::ComplexFloat, "complex64"},
    {c10::ScalarType::ComplexDouble, "complex128"},
    {c10::ScalarType::Float, "float"},
    {c10::ScalarType::Double, "double"},
    {c10::ScalarType::Half, "half"},
    {c10::ScalarType::Long, "long"},
    {c10::ScalarType::Int, "int"},
    {c10::ScalarType::Short, "short"},
    {c10::ScalarType::ComplexFloat, "cfloat"},
    {c10::ScalarType::ComplexDouble, "cdouble"},
};

std::string join(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

bool valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const std::size_t extra = lead < 0x80           ? 0
                              : (lead >> 5) == 0x6  ? 1
                              : (lead >> 4) == 0xe  ? 2
                              : (lead >> 3) == 0x1e ? 3
                                                    : 4;
    if (extra == 4) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      if (i + k >= text.size() || (static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return false;
    }
    i += extra + 1;
  }
  return true;
}

void check_fqn(const std::string& fqn) {
  if (fqn.empty()) throw std::invalid_argument("a DCP item needs a non-empty fqn");
  if (!valid_utf8(fqn)) {
    throw std::invalid_argument("the fqn '" + fqn + "' is not valid UTF-8; Python reads fqns as str");
  }
}

// Passes bytes on to the durable file through a buffer (PyTorchStreamWriter writes headers of a few dozen bytes),
// counting them and keeping the CRC32 of the current item.
class ItemSink {
 public:
  explicit ItemSink(const WriteBytes& write) : write_(write) {}
  void write(const char* data, std::size_t size) {
    crc_ = crc32(std::string_view(data, size), crc_);
    position_ += size;
    if (buffer_.size() + size > kBuffer) flush();
    if (size >= kBuffer) {
      write_(data, size);
    } else {
      buffer_.append(data, size);
    }
  }
  void flush() {
    if (!buffer_.empty()) write_(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  // Starts an item: returns its offset and resets the CRC.
  uint64_t begin() {
    crc_ = 0;
    return position_;
  }
  uint64_t position() const { return position_; }
  uint32_t crc() const { return crc_; }

 private:
  static constexpr std::size_t kBuffer = 1 << 20;
  const WriteBytes& write_;
  std::string buffer_;
  uint64_t position_ = 0;
  uint32_t crc_ = 0;
};

// `chunk` as the tensor torch.save would store: CPU, no autograd, and owning exactly its own bytes, since the
// pickler stores the tensor's whole storage.
torch::Tensor storable(const torch::Tensor& chunk) {
  torch::Tensor cpu = chunk.detach().to(torch::kCPU);
  const auto bytes = static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
  if (!cpu.is_contiguous() || cpu.storage_offset() != 0 || cpu.storage().nbytes() != bytes || cpu.is_conj() ||
      cpu.is_neg()) {
    cpu = cpu.resolve_conj().resolve_neg().contiguous().clone();
  }
  return cpu;
}

// One chunk as a standalone torch.save zip, written through `sink` (LibTorch's Pickler and zip writer, as
// utils/torch_pickle.cpp writes files; no bridge comment, since DCP's blobs are plain torch.save output).
void write_tensor_blob(const torch::Tensor& tensor, ItemSink& sink) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(tensor);
  pickler.stop();
  // A failed write must not throw through LibTorch's zip writer, whose destructor writes again (see torch_pickle.cpp).
  std::exception_ptr failure;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
      if (failure) return size;
      try {
        sink.write(static_cast<const char*>(data), size);
      } catch (...) {
        failure = std::current_exception();
      }
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  for (const DtypeName& entry : kDtypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  throw std::invalid_argument(std::string("DCP checkpoints of dtype ") + c10::toString(dtype) +
                              " are not supported (float32/64, bfloat16, float16, int8/16/32/64, uint8, bool, "
                              "complex64/128 are)");
}

c10::ScalarType dtype_from_name(std::string_view name) {
  for (const DtypeName& entry : kDtypeNames) {
    if (name == entry.name) return entry.dtype;
  }
  throw std::invalid_argument("torch." + std::string(name) +
                              " is not a dtype bridge reads from DCP checkpoints (float32/64, bfloat16, float16, "
                              "int8/16/32/64, uint8, bool, complex64/128)");
}

// ---------------------------------------------------------------------------------------------------------------
// DataFileWriter

DataFileWriter::DataFileWriter(fs::path directory, std::string file_name)
    : directory_(std::move(directory)), file_name_(std::move(file_name)) {
  if (file_name_.empty() || file_name_.find('/') != std::string::npos || file_name_ == "." || file_name_ == ".." ||
      file_name_ == kMetadataFile || file_name_ == kChecksumFile) {
    throw std::invalid_argument("DataFileWriter: '" + file_name_ +
                                "' is not a data file name; give a plain name such as __0_0.distcp");
  }
  path_ = directory_ / file_name_;
}

void DataFileWriter::add_bytes(const std::string& fqn, std::string bytes) {
  check_fqn(fqn);
  if (finished_) throw std::logic_error("DataFileWriter::add_bytes('" + fqn + "') after finish() of " + path_.string());
  for (const auto& [name, _] : bytes_items_) {
    if (name == fqn) throw std::invalid_argument("the bytes item '" + fqn + "' was added twice to " + path_.string());
  }
  bytes_items_.emplace_back(fqn, std::move(bytes));
}

void DataFileWriter::add_tensor(const std::string& fqn, const torch::Tensor& chunk, std::vector<int64_t> offsets,
                                std::vector<int64_t> global_shape) {
  check_fqn(fqn);
  if (finished_) {
    throw std::logic_error("DataFileWriter::add_tensor('" + fqn + "') after finish() of " + path_.string());
  }
  const std::string where = "tensor '" + fqn + "' for " + path_.string();
  if (!chunk.defined()) throw std::invalid_argument(where + ": the chunk is an undefined tensor");
  if (chunk.layout() != torch::kStrided) throw std::invalid_argument(where + ": only strided (dense) tensors");
  dtype_name(chunk.scalar_type());  // throws for unsupported dtypes
  if (offsets.size() != static_cast<std::size_t>(chunk.dim()) || global_shape.size() != offsets.size()) {
    throw std::invalid_argument(where + ": the chunk has " + std::to_string(chunk.dim()) + " dims, its offsets " +
                                join(offsets) + " and the global shape " + join(global_shape) +
                                "; all three must have the same rank");
  }
  for (std::size_t d = 0; d < offsets.size(); ++d) {
    if (offsets[d] < 0 || global_shape[d] < 0 || offsets[d] + chunk.size(static_cast<int64_t>(d)) > global_shape[d]) {
      throw std::invalid_argument(where + ": the chunk of sizes " + c10::str(chunk.sizes()) + " at offsets " +
                                  join(offsets) + " lies outside the global shape " + join(global_shape));
    }
  }
  for (const TensorItem& item : tensor_items_) {
    if (item.fqn == fqn && item.offsets == offsets) {
      throw std::invalid_argument(where + ": a chunk at offsets " + join(offsets) + " was added before");
    }
  }
  tensor_items_.push_back(TensorItem{fqn, chunk, std::move(offsets), std::move(global_shape)});
}

std::vector<WriteRecord> DataFileWriter::finish() {
  if (finished_) throw std::logic_error("DataFileWriter::finish() called twice for " + path_.string());
  finished_ = true;
  std::vector<WriteRecord> records;
  records.reserve(bytes_items_.size() + tensor_items_.size());
  write_file_durably(path_, [&](const WriteBytes& write) {
    ItemSink sink(write);
    // DCP's FileSystemWriter writes BYTE_IO items first, then tensors (filesystem.py's _write_files_from_queue).
    for (auto& [fqn, bytes] : bytes_items_) {
      WriteRecord record;
      record.fqn = fqn;
      record.is_bytes = true;
      record.location = StorageLocation{file_name_, sink.begin(), bytes.size()};
      sink.write(bytes.data(), bytes.size());
      record.checksum = sink.crc();
      records.push_back(std::move(record));
      std::string().swap(bytes);  // written: the caller's bytes need not stay held
    }
    for (TensorItem& item : tensor_items_) {
      WriteRecord record;
      record.fqn = item.fqn;
      record.offsets = item.offsets;
      record.sizes = item.chunk.sizes().vec();
      record.global_shape = item.global_shape;
      record.dtype = item.chunk.scalar_type();
      const uint64_t start = sink.begin();
      try {
        write_tensor_blob(storable(item.chunk), sink);
      } catch (const std::exception& error) {
        throw std::runtime_error("writing tensor '" + item.fqn + "' (chunk at offsets " + join(item.offsets) + ") to " +
                                 path_.string() + ": " + describe(error));
      }
      record.location = StorageLocation{file_name_, start, sink.position() - start};
      record.checksum = sink.crc();
      records.push_back(std::move(record));
      item.chunk = torch::Tensor();  // release the caller's tensor as soon as it is written
    }
    sink.flush();
  });
  bytes_items_.clear();
  tensor_items_.clear();
  return records;
}

// ---------------------------------------------------------------------------------------------------------------
// Records as text

std::string encode_records(const std::vector<WriteRecord>& records) {
  nlohmann::json out = nlohmann::json::array();
  for (const WriteRecord& record : records) {
    nlohmann::json item = {{"fqn", record.fqn},
                           {"is_bytes", record.is_bytes},
                           {"path", record.location.relative_path},
                           {"offset", record.location.offset},
                           {"length", record.location.length},
                           {"crc32", record.checksum}};
    if (!record.is_bytes) {
      item["offsets"] = record.offsets;
      item["sizes"] = record.sizes;
      item["global_shape"] = record.global_shape;
      item["dtype"] = dtype_name(record.dtype);
    }
    out.push_back(std::move(item));
  }
  return out.dump();
}

std::vector<WriteRecord> decode_records(std::string_view text) {
  std::vector<WriteRecord> records;
  try {
    const nlohmann::json in = nlohmann::json::parse(text);
    if (!in.is_array()) throw std::invalid_argument("not a JSON array");
    for (const nlohmann::json& item : in) {
      WriteRecord record;
      record.fqn = item.at("fqn").get<std::string>();
      record.is_bytes = item.at("is_bytes").get<bool>();
      record.location.relative_path = item.at("path").get<std::string>();
      record.location.offset = item.at("offset").get<uint64_t>();
      record.location.length = item.at("length").get<uint64_t>();
      record.checksum = item.at("crc32").get<uint32_t>();
      if (!record.is_bytes) {
        record.offsets = item.at("offsets").get<std::vector<int64_t>>();
        record.sizes = item.at("sizes").get<std::vector<int64_t>>();
        record.global_shape = item.at("global_shape").get<std::vector<int64_t>>();
        record.dtype = dtype_from_name(item.at("dtype").get<std::string>());
      }
      records.push_back(std::move(record));
    }
  } catch (const std::exception& error) {
    throw std::invalid_argument(std::string("decode_records: the text is not what encode_records writes (") +
                                error.what() + ")");
  }
  return records;
}

// ---------------------------------------------------------------------------------------------------------------
// The coordinator's checks and .metadata

namespace {

__extension__ typedef __int128 Int;  // volumes: products of int64 dims

Int volume(const std::vector<int64_t>& sizes) {
  Int out = 1;
  for (const int64_t size : sizes) out *= size;
  return out;
}

// Checks one tensor's chunks: each inside the global shape, none overlapping another, together covering it.
void check_chunks(const std::string& fqn, const std::vector<const WriteRecord*>& chunks) {
  const WriteRecord& first = *chunks.front();
  const std::string what = "write_metadata: tensor '" + fqn + "'";
  for (const WriteRecord* chunk : chunks) {
    if (chunk->dtype != first.dtype) {
      throw std::invalid_argument(what + " has chunks of dtype " + c10::toString(first.dtype) + " and " +
                                  c10::toString(chunk->dtype) + "; every chunk of a tensor has one dtype");
    }
    if (chunk->global_shape != first.global_shape) {
      throw std::invalid_argument(what + " has chunks of global shape " + join(first.global_shape) + " and " +
                                  join(chunk->global_shape) + "; every chunk must name the same global shape");
    }
    const std::size_t rank = first.global_shape.size();
    if (chunk->offsets.size() != rank || chunk->sizes.size() != rank) {
      throw std::invalid_argument(what + ": the chunk at offsets " + join(chunk->offsets) + " with sizes " +
                                  join(chunk->sizes) + " does not have the global shape's " + std::to_string(rank) +
                                  " dims");
    }
    for (std::size_t d = 0; d < rank; ++d) {
      if (chunk->offsets[d] < 0 || chunk->sizes[d] < 0 || chunk->offsets[d] + chunk->sizes[d] > first.global_shape[d]) {
        throw std::invalid_argument(what + ": the chunk at offsets " + join(chunk->offsets) + " with sizes " +
                                    join(chunk->sizes) + " lies outside the global shape " + join(first.global_shape));
      }
    }
  }
  // Overlaps: sorted by offsets, a chunk can only overlap the later ones starting before its end in dim 0.
  std::vector<const WriteRecord*> sorted = chunks;
  std::sort(sorted.begin(), sorted.end(),
            [](const WriteRecord* a, const WriteRecord* b) { return a->offsets < b->offsets; });
  Int covered = 0;
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const WriteRecord& a = *sorted[i];
    covered += volume(a.sizes);
    if (i + 1 < sorted.size() && sorted[i + 1]->offsets == a.offsets) {
      throw std::invalid_argument(what + " has two chunks at offsets " + join(a.offsets) + " (" +
                                  a.location.relative_path + " and " + sorted[i + 1]->location.relative_path +
                                  "); exactly one rank must write each chunk");
    }
    for (std::size_t j = i + 1; j < sorted.size(); ++j) {
      const WriteRecord& b = *sorted[j];
      if (!a.offsets.empty() && b.offsets[0] >= a.offsets[0] + a.sizes[0]) break;
      bool overlap = volume(a.sizes) > 0 && volume(b.sizes) > 0;
      for (std::size_t d = 0; overlap && d < a.offsets.size(); ++d) {
        overlap = a.offsets[d] < b.offsets[d] + b.sizes[d] && b.offsets[d] < a.offsets[d] + a.sizes[d];
      }
      if (overlap) {
        throw std::invalid_argument(what + ": the chunk at offsets " + join(a.offsets) + " with sizes " +
                                    join(a.sizes) + " (" + a.location.relative_path + ") overlaps the chunk at " +
                                    join(b.offsets) + " with sizes " + join(b.sizes) + " (" + b.location.relative_path +
                                    "); exactly one rank must write each element");
      }
    }
  }
  if (covered != volume(first.global_shape)) {
    throw std::invalid_argument(what + " of global shape " + join(first.global_shape) + " is not covered: its " +
                                std::to_string(chunks.size()) + " chunks hold " + std::to_string(int64_t(covered)) +
                                " of its " + std::to_string(int64_t(volume(first.global_shape))) +
                                " elements (a rank's records missing from the gather?)");
  }
}

// The fqns in first-appearance order with their records, checked.
struct Plan {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const WriteRecord*>> items;
};

Plan check_records(const std::vector<WriteRecord>& records) {
  Plan plan;
  for (const WriteRecord& record : records) {
    check_fqn(record.fqn);
    if (record.location.relative_path.empty() || record.location.relative_path.find('/') != std::string::npos) {
      throw std::invalid_argument("write_metadata: item '" + record.fqn + "' names the data file '" +
                                  record.location.relative_path + "'; a plain file name in the directory is needed");
    }
    auto [it, inserted] = plan.items.try_emplace(record.fqn);
    if (inserted) plan.order.push_back(record.fqn);
    if (!it->second.empty() && it->second.front()->is_bytes != record.is_bytes) {
      throw std::invalid_argument("write_metadata: '" + record.fqn + "' is written both as a tensor and as bytes");
    }
    if (record.is_bytes && !it->second.empty()) {
      throw std::invalid_argument("write_metadata: the bytes item '" + record.fqn + "' is written twice (" +
                                  it->second.front()->location.relative_path + " and " + record.location.relative_path +
                                  "); exactly one rank must write it");
    }
    it->second.push_back(&record);
  }
  for (const auto& [fqn, items] : plan.items) {
    if (!items.front()->is_bytes) check_chunks(fqn, items);
  }
  return plan;
}

const char kMetadataModule[] = "torch.distributed.checkpoint.metadata";

Value torch_size(const std::vector<int64_t>& values) {
  std::vector<Value> items(values.begin(), values.end());
  return pickle::reduce(Global{"torch", "Size"}, {Value::tuple(std::move(items))});
}

Value dataclass(const char* name, std::vector<std::pair<Value, Value>> fields) {
  return pickle::new_object(Global{kMetadataModule, name}, Value::dict(std::move(fields)));
}

// TensorProperties pickles its __getstate__ tuple: (dtype, layout, requires_grad, memory format, pin_memory,
// strides); the enum member as Python 3.11 reduces it, getattr(_MEM_FORMAT_ENCODING, 'TORCH_CONTIGUOUS_FORMAT').
Value tensor_properties(c10::ScalarType dtype, const std::vector<int64_t>& shape) {
  std::vector<Value> strides(shape.size());
  int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
  Value state = Value::tuple({
      Global{"torch", dtype_name(dtype)},
      pickle::reduce(Global{"torch.serialization", "_get_layout"}, {"torch.strided"}),
      false,
      pickle::reduce(Global{"builtins", "getattr"},
                     {Global{kMetadataModule, "_MEM_FORMAT_ENCODING"}, "TORCH_CONTIGUOUS_FORMAT"}),
      false,
      Value::tuple(std::move(strides)),
  });
  return pickle::new_object(Global{kMetadataModule, "TensorProperties"}, std::move(state));
}

}  // namespace

std::string metadata_pickle(const std::vector<WriteRecord>& records) {
  const Plan plan = check_records(records);
  std::vector<std::pair<Value, Value>> state_dict_metadata;
  std::vector<std::pair<Value, Value>> storage_data;
  for (const std::string& fqn : plan.order) {
    std::vector<const WriteRecord*> items = plan.items.at(fqn);
    if (items.front()->is_bytes) {
      state_dict_metadata.emplace_back(fqn, pickle::new_object(Global{kMetadataModule, "BytesStorageMetadata"}, {}));
    } else {
      std::sort(items.begin(), items.end(),
                [](const WriteRecord* a, const WriteRecord* b) { return a->offsets < b->offsets; });
      std::vector<Value> chunks;
      for (const WriteRecord* item : items) {
        chunks.push_back(dataclass("ChunkStorageMetadata",
                                   {{"offsets", torch_size(item->offsets)}, {"sizes", torch_size(item->sizes)}}));
      }
      state_dict_metadata.emplace_back(
          fqn, dataclass("TensorStorageMetadata",
                         {{"properties", tensor_properties(items.front()->dtype, items.front()->global_shape)},
                          {"size", torch_size(items.front()->global_shape)},
                          {"chunks", Value::list(std::move(chunks))}}));
    }
    // MetadataIndex's __dict__ in the order its __init__ sets it; `index` is the chunk's place in `chunks`, a hint.
    for (std::size_t i = 0; i < items.size(); ++i) {
      const WriteRecord& item = *items[i];
      std::vector<std::pair<Value, Value>> index = {{"fqn", fqn}};
      if (item.is_bytes) {
        index.emplace_back("index", Value());
      } else {
        index.emplace_back("index", static_cast<int64_t>(i));
        index.emplace_back("offset", torch_size(item.offsets));
      }
      Value location = pickle::new_object(Global{"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
                                          Value::dict({{"relative_path", item.location.relative_path},
                                                       {"offset", static_cast<int64_t>(item.location.offset)},
                                                       {"length", static_cast<int64_t>(item.location.length)}}));
      storage_data.emplace_back(dataclass("MetadataIndex", std::move(index)), std::move(location));
    }
  }
  const Value metadata = dataclass("Metadata", {{"state_dict_metadata", Value::dict(std::move(state_dict_metadata))},
                                                {"planner_data", Value()},
                                                {"storage_data", Value::dict(std::move(storage_data))},
                                                {"storage_meta", Value()},
                                                {"version", "1.0.0"}});
  return pickle::dumps(metadata);
}

void write_metadata(const fs::path& directory, const std::vector<WriteRecord>& records) {
  const std::string pickled = metadata_pickle(records);  // checks the records before anything is written
  // No commit point while the checksum file changes: a crash in between leaves no .metadata rather than an old one
  // whose items the new checksums do not describe.
  std::error_code error;
  fs::remove(directory / kMetadataFile, error);
  if (error) {
    throw std::runtime_error("write_metadata: cannot remove the old " + (directory / kMetadataFile).string() + ": " +
                             error.message());
  }
  nlohmann::json items = nlohmann::json::array();
  for (const WriteRecord& record : records) {
    items.push_back({{"fqn", record.fqn},
                     {"relative_path", record.location.relative_path},
                     {"offset", record.location.offset},
                     {"length", record.location.length},
                     {"crc32", record.checksum}});
  }
  const nlohmann::json checksums = {{"format", "bridge DCP checksums"}, {"version", 1}, {"items", std::move(items)}};
  write_file_durably(directory / kChecksumFile, checksums.dump(1) + "\n");
  write_file_durably(directory / kMetadataFile, pickled);
}

}  // namespace bridge::utils::dcp
