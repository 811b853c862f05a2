// DCP's reading side: .metadata parsed from its pickle (bridge's, torch's and Megatron-Core's, whose extra
// attributes are ignored), and tensor regions assembled from the stored chunks that overlap them. Each chunk's blob
// is a torch.save zip: its data.pkl names the storage record and the view (_rebuild_tensor_v2), which is read here
// with the generic unpickler instead of LibTorch's, so that the record's bytes are copied straight from the blob.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "utils/closest_match.h"
#include "utils/dcp.h"
#include "utils/durable_file.h"
#include "utils/exception_message.h"
#include "utils/python_pickle.h"
#include "utils/zip_archive.h"

namespace bridge::utils::dcp {

namespace fs = std::filesystem;
using pickle::Object;
using pickle::Value;

namespace {

std::string join(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// A torch.Size (REDUCE(torch.Size, ((ints...),))), or a plain tuple or list of ints.
std::vector<int64_t> int_sequence(const Value& value, const char* what) {
  const Value* items = &value;
  if (value.is_object() && value.object().is("torch", "Size") && value.object().args.size() == 1) {
    items = &value.object().args[0];
  }
  if (!items->is_tuple() && !items->is_list()) {
    throw std::runtime_error(std::string(what) + " is " + value.type_name() + ", not a torch.Size");
  }
  std::vector<int64_t> out;
  for (const Value& item : items->is_tuple() ? items->tuple_items() : items->list_items()) out.push_back(item.as_int());
  return out;
}

const Value& field(const Object& object, const char* name) {
  const Value* value = object.attribute(name);
  if (value == nullptr) {
    throw std::runtime_error(object.type.module + "." + object.type.name + " has no field '" + name +
                             "' (its state: " + (object.state ? object.state->repr().substr(0, 200) : "none") + ")");
  }
  return *value;
}

c10::ScalarType dtype_of_global(const Value& value) {
  const pickle::Global& dtype = value.global();
  if (dtype.module != "torch") throw std::runtime_error("the dtype is " + dtype.module + "." + dtype.name);
  return dtype_from_name(dtype.name);
}

// TensorProperties' state: its __getstate__ tuple (dtype, layout, requires_grad, memory format, pin_memory[,
// strides]), or, from a pickler that kept the __dict__, a dict with "dtype".
c10::ScalarType properties_dtype(const Value& properties) {
  const Object& object = properties.object();
  if (!object.state) throw std::runtime_error("TensorProperties without state");
  if (object.state->is_tuple()) {
    const auto& items = object.state->tuple_items();
    if (items.size() != 5 && items.size() != 6) {
      throw std::runtime_error("TensorProperties' state has " + std::to_string(items.size()) + " items, not 5 or 6");
    }
    return dtype_of_global(items[0]);
  }
  return dtype_of_global(field(object, "dtype"));
}

// Reads [offset, offset + length) of a file with pread, or fewer bytes when the file is shorter.
std::string pread_range(const fs::path& path, uint64_t offset, uint64_t length, uint64_t* file_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error("cannot open " + path.string() + ": " + std::strerror(errno) +
                             " (a data file of the checkpoint is missing or unreadable)");
  }
  std::string out;
  try {
    struct stat info {};
    if (::fstat(fd, &info) != 0) throw std::runtime_error("cannot stat " + path.string() + ": " + std::strerror(errno));
    *file_size = static_cast<uint64_t>(info.st_size);
    if (offset >= *file_size) {
      ::close(fd);
      return out;
    }
    out.resize(static_cast<std::size_t>(std::min(length, *file_size - offset)));
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t got = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw std::runtime_error("cannot read " + path.string() + ": " + std::strerror(errno));
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    out.resize(done);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

struct StorageName {
  const char* name;
  c10::ScalarType dtype;
};
constexpr StorageName kStorageNames[] = {
    {"FloatStorage", c10::ScalarType::Float},
    {"DoubleStorage", c10::ScalarType::Double},
    {"BFloat16Storage", c10::ScalarType::BFloat16},
    {"HalfStorage", c10::ScalarType::Half},
    {"LongStorage", c10::ScalarType::Long},
    {"IntStorage", c10::ScalarType::Int},
    {"ShortStorage", c10::ScalarType::Short},
    {"CharStorage", c10::ScalarType::Char},
    {"ByteStorage", c10::ScalarType::Byte},
    {"BoolStorage", c10::ScalarType::Bool},
    {"ComplexFloatStorage", c10::ScalarType::ComplexFloat},
    {"ComplexDoubleStorage", c10::ScalarType::ComplexDouble},
};

// The tensor a torch.save blob holds, as a view of the blob's bytes (the blob must outlive it). Throws
// DamagedFileError when the blob is not a torch.save zip of one dense CPU tensor.
torch::Tensor tensor_in_blob(std::string& blob) {
  const std::vector<ZipEntry> entries = read_zip_directory(blob);
  const ZipEntry* pickle_entry = nullptr;
  for (const ZipEntry& entry : entries) {
    const std::size_t slash = entry.name.find('/');
    if (slash != std::string::npos && entry.name.compare(slash + 1, std::string::npos, "data.pkl") == 0) {
      pickle_entry = &entry;
      break;
    }
  }
  if (pickle_entry == nullptr) throw DamagedFileError("the archive has no <name>/data.pkl record");
  const std::string prefix = pickle_entry->name.substr(0, pickle_entry->name.size() - 8);  // "archive/"
  const auto record = [&](const std::string& name) -> const ZipEntry* {
    for (const ZipEntry& entry : entries) {
      if (entry.name == prefix + name) return &entry;
    }
    return nullptr;
  };
  if (const ZipEntry* order = record("byteorder");
      order != nullptr && blob.compare(order->data_offset, order->size, "little") != 0) {
    throw DamagedFileError("the tensor is stored big-endian; bridge reads little-endian checkpoints");
  }
  try {
    const Value rebuilt = pickle::loads(std::string_view(blob).substr(pickle_entry->data_offset, pickle_entry->size));
    const Object& call = rebuilt.object();
    if (!call.is("torch._utils", "_rebuild_tensor_v2") || call.args.size() < 4) {
      throw std::runtime_error("data.pkl holds " + rebuilt.repr().substr(0, 200) + ", not one tensor");
    }
    const Object& persistent = call.args[0].object();
    if (persistent.made != Object::Made::kPersistentId) throw std::runtime_error("the storage is not a persistent id");
    const auto& pid = persistent.args.at(0).tuple_items();
    if (pid.size() != 5 || pid[0].as_str() != "storage") throw std::runtime_error("unexpected storage persistent id");
    const pickle::Global& storage_type = pid[1].global();
    const c10::ScalarType* dtype = nullptr;
    for (const StorageName& entry : kStorageNames) {
      if (storage_type.module == "torch" && storage_type.name == entry.name) dtype = &entry.dtype;
    }
    if (dtype == nullptr) throw std::runtime_error("storage type " + storage_type.name + " is not supported");
    const std::string& key = pid[2].as_str();
    const ZipEntry* data = record("data/" + key);
    if (data == nullptr) throw std::runtime_error("the storage record data/" + key + " is missing");
    const int64_t storage_offset = call.args[1].as_int();
    const std::vector<int64_t> sizes = int_sequence(call.args[2], "the tensor's size");
    const std::vector<int64_t> strides = int_sequence(call.args[3], "the tensor's stride");
    if (sizes.size() != strides.size()) throw std::runtime_error("size and stride have different ranks");
    // The element after the last one the view reaches must lie inside the record.
    // Each step checked: a damaged pickle may name sizes whose products overflow.
    int64_t end = storage_offset;
    bool fits = end >= 0;
    bool empty = false;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      fits = fits && sizes[d] >= 0 && strides[d] >= 0;
      empty = empty || sizes[d] == 0;
      int64_t step = 0;
      if (fits && sizes[d] > 0) {
        fits = !__builtin_mul_overflow(sizes[d] - 1, strides[d], &step) && !__builtin_add_overflow(end, step, &end);
      }
    }
    const auto item = static_cast<int64_t>(c10::elementSize(*dtype));
    int64_t bytes = 0;
    fits = fits && !__builtin_add_overflow(end, int64_t{1}, &end) && !__builtin_mul_overflow(end, item, &bytes);
    if (!fits || (!empty && static_cast<uint64_t>(bytes) > data->size)) {
      throw std::runtime_error("the tensor (sizes " + join(sizes) + ", strides " + join(strides) + ", offset " +
                               std::to_string(storage_offset) + ") reaches past its " + std::to_string(data->size) +
                               "-byte storage record");
    }
    if (empty) return torch::empty(sizes, torch::TensorOptions().dtype(*dtype));
    const auto elements = static_cast<int64_t>(data->size) / item;
    return torch::from_blob(blob.data() + data->data_offset, {elements}, torch::TensorOptions().dtype(*dtype))
        .as_strided(sizes, strides, storage_offset);
  } catch (const DamagedFileError&) {
    throw;
  } catch (const std::exception& error) {
    throw DamagedFileError("its torch.save archive is not one tensor as DCP stores it: " + describe(error));
  }
}

}  // namespace

Reader::Reader(fs::path directory) : directory_(std::move(directory)) {
  const fs::path metadata_path = directory_ / kMetadataFile;
  std::error_code exists_error;
  if (!fs::exists(metadata_path, exists_error)) {
    throw std::runtime_error("no " + metadata_path.string() +
                             ": not a PyTorch Distributed Checkpoint directory, or its save did not finish (.metadata "
                             "is written last, by the coordinator)");
  }
  const std::string bytes = read_file(metadata_path);
  try {
    const Value metadata = pickle::loads(bytes);
    const Object& root = metadata.object();
    if (root.type.name != "Metadata") throw std::runtime_error("the pickle holds " + root.type.name + ", not Metadata");
    for (const auto& [key, value] : field(root, "state_dict_metadata").dict().items) {
      const std::string& fqn = key.as_str();
      const Object& item = value.object();
      if (item.type.name == "BytesStorageMetadata") {
        bytes_.emplace(fqn, StorageLocation{});
        continue;
      }
      if (item.type.name != "TensorStorageMetadata") {
        throw std::runtime_error("'" + fqn + "' is a " + item.type.name + ", not a tensor or bytes item");
      }
      TensorInfo info;
      info.fqn = fqn;
      info.dtype = properties_dtype(field(item, "properties"));
      info.global_shape = int_sequence(field(item, "size"), "a tensor's size");
      for (const Value& chunk_value : field(item, "chunks").list_items()) {
        const Object& chunk = chunk_value.object();
        std::vector<int64_t> offsets = int_sequence(field(chunk, "offsets"), "a chunk's offsets");
        std::vector<int64_t> sizes = int_sequence(field(chunk, "sizes"), "a chunk's sizes");
        bool inside = offsets.size() == info.global_shape.size() && sizes.size() == offsets.size();
        for (std::size_t d = 0; inside && d < offsets.size(); ++d) {
          inside = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] + sizes[d] <= info.global_shape[d];
        }
        if (!inside) {
          throw std::runtime_error("tensor '" + fqn + "' has a chunk at " + join(offsets) + " of sizes " + join(sizes) +
                                   " outside its shape " + join(info.global_shape));
        }
        info.chunks.emplace_back(std::move(offsets), std::move(sizes));
      }
      tensors_.emplace(fqn, std::move(info));
    }
    for (const auto& [key, value] : field(root, "storage_data").dict().items) {
      const Object& index = key.object();
      const std::string& fqn = field(index, "fqn").as_str();
      const Value* offset = index.attribute("offset");
      const Object& info = value.object();
      StorageLocation location{field(info, "relative_path").as_str(),
                               static_cast<uint64_t>(field(info, "offset").as_int()),
                               static_cast<uint64_t>(field(info, "length").as_int())};
      const fs::path relative(location.relative_path);
      if (relative.empty() || relative.is_absolute() ||
          std::any_of(relative.begin(), relative.end(), [](const fs::path& part) { return part == ".."; })) {
        throw std::runtime_error("item '" + fqn + "' lies in '" + location.relative_path +
                                 "', outside the checkpoint directory");
      }
      if (offset == nullptr || offset->is_none()) {
        const auto found = bytes_.find(fqn);
        if (found == bytes_.end()) {
          throw std::runtime_error("storage_data names '" + fqn + "' without an offset, but it is not a bytes item");
        }
        found->second = std::move(location);
      } else {
        storage_.emplace(std::make_pair(fqn, int_sequence(*offset, "a MetadataIndex offset")), std::move(location));
      }
    }
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot read " + metadata_path.string() +
                             " as a PyTorch Distributed Checkpoint's metadata (" + describe(error) +
                             "); the file is damaged or was not written by torch, Megatron-Core "
                             "or bridge");
  }
  const fs::path checksum_path = directory_ / kChecksumFile;
  if (fs::exists(checksum_path, exists_error)) {
    checksum_file_present_ = true;
    try {
      const nlohmann::json checksums = nlohmann::json::parse(read_file(checksum_path));
      for (const nlohmann::json& item : checksums.at("items")) {
        checksums_[{item.at("relative_path").get<std::string>(), item.at("offset").get<uint64_t>()}] = {
            item.at("length").get<uint64_t>(), item.at("crc32").get<uint32_t>()};
      }
    } catch (const std::exception& failure) {
      throw std::runtime_error("cannot read " + checksum_path.string() + " (" + describe(failure) +
                               "); it is damaged: restore the checkpoint from a copy, or delete the file to read "
                               "the checkpoint without bridge's checksums");
    }
  }
}

std::vector<std::string> Reader::byte_items() const {
  std::vector<std::string> out;
  for (const auto& [fqn, _] : bytes_) out.push_back(fqn);
  return out;
}

const StorageLocation& Reader::location(const std::string& fqn, const std::vector<int64_t>& offsets) const {
  if (offsets.empty()) {
    if (const auto found = bytes_.find(fqn); found != bytes_.end()) return found->second;
  }
  const auto found = storage_.find({fqn, offsets});
  if (found == storage_.end()) {
    throw std::runtime_error((directory_ / kMetadataFile).string() + " lists no stored item '" + fqn + "' at offsets " +
                             join(offsets));
  }
  return found->second;
}

std::string Reader::read_item(const StorageLocation& location, const std::string& what) const {
  const fs::path path = directory_ / location.relative_path;
  const auto damaged = [&](const std::string& why) {
    return DamagedFileError(path.string() + " is damaged: " + what + ", bytes [" + std::to_string(location.offset) +
                            ", " + std::to_string(location.offset + location.length) + "): " + why +
                            ". Its bytes are not the ones that were written (a disk or copy error); restore the "
                            "checkpoint from a copy");
  };
  uint64_t file_size = 0;
  std::string bytes = pread_range(path, location.offset, location.length, &file_size);
  if (bytes.size() != location.length) {
    throw damaged("the file is " + std::to_string(file_size) + " bytes, too short for the item (truncated?)");
  }
  if (checksum_file_present_) {
    const auto found = checksums_.find({location.relative_path, location.offset});
    if (found == checksums_.end() || found->second.first != location.length) {
      throw damaged(std::string(kChecksumFile) +
                    " has no checksum for this item (it does not belong to this "
                    ".metadata)");
    }
    const uint32_t actual = crc32(bytes);
    if (actual != found->second.second) {
      char text[64];
      std::snprintf(text, sizeof text, "CRC32 %08x, but %s says %08x", actual, kChecksumFile, found->second.second);
      throw damaged(text);
    }
  }
  return bytes;
}

torch::Tensor Reader::read(const std::string& fqn, const std::vector<int64_t>& offsets,
                           const std::vector<int64_t>& sizes) const {
  const auto found = tensors_.find(fqn);
  if (found == tensors_.end()) {
    std::vector<std::string_view> names;
    for (const auto& [name, _] : tensors_) names.push_back(name);
    const std::optional<std::string> close = closest_match(fqn, names);
    throw std::runtime_error("no tensor '" + fqn + "' in the checkpoint " + directory_.string() +
                             (close ? " (did you mean '" + *close + "'?)" : "") + "; it holds " +
                             std::to_string(tensors_.size()) + " tensors");
  }
  const TensorInfo& info = found->second;
  bool inside = offsets.size() == info.global_shape.size() && sizes.size() == offsets.size();
  for (std::size_t d = 0; inside && d < offsets.size(); ++d) {
    inside = offsets[d] >= 0 && sizes[d] >= 0 && offsets[d] + sizes[d] <= info.global_shape[d];
  }
  if (!inside) {
    throw std::runtime_error("reading tensor '" + fqn + "' of " + directory_.string() + ": the box at offsets " +
                             join(offsets) + " with sizes " + join(sizes) + " lies outside its shape " +
                             join(info.global_shape));
  }
  torch::Tensor out = torch::empty(sizes, torch::TensorOptions().dtype(info.dtype));
  int64_t wanted = out.numel();
  int64_t covered = 0;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> used;  // the overlaps copied so far
  for (const auto& [chunk_offsets, chunk_sizes] : info.chunks) {
    std::vector<int64_t> begin(offsets.size());
    std::vector<int64_t> length(offsets.size());
    int64_t count = 1;
    for (std::size_t d = 0; d < offsets.size(); ++d) {
      begin[d] = std::max(offsets[d], chunk_offsets[d]);
      length[d] = std::min(offsets[d] + sizes[d], chunk_offsets[d] + chunk_sizes[d]) - begin[d];
      count *= std::max<int64_t>(length[d], 0);
    }
    if (count == 0) continue;
    for (const auto& [other_begin, other_length] : used) {
      bool overlap = true;
      for (std::size_t d = 0; overlap && d < begin.size(); ++d) {
        overlap = begin[d] < other_begin[d] + other_length[d] && other_begin[d] < begin[d] + length[d];
      }
      if (overlap) {
        throw std::runtime_error("reading tensor '" + fqn + "' of " + directory_.string() +
                                 ": its stored chunks overlap (at offsets " + join(chunk_offsets) +
                                 "); the checkpoint's metadata is inconsistent");
      }
    }
    const std::string what = "tensor '" + fqn + "' chunk at offsets " + join(chunk_offsets);
    const StorageLocation& location = this->location(fqn, chunk_offsets);
    std::string blob = read_item(location, what);
    torch::Tensor stored;
    try {
      if (!checksum_file_present_) verify_zip_archive(blob);  // torch's blobs: their zip CRC32s
      stored = tensor_in_blob(blob);
    } catch (const DamagedFileError& error) {
      throw DamagedFileError((directory_ / location.relative_path).string() + " is damaged: " + what + ", bytes [" +
                             std::to_string(location.offset) + ", " +
                             std::to_string(location.offset + location.length) + "): " + error.what());
    }
    if (stored.scalar_type() != info.dtype || stored.sizes().vec() != chunk_sizes) {
      throw DamagedFileError((directory_ / location.relative_path).string() + ": " + what + " holds a " +
                             c10::toString(stored.scalar_type()) + " tensor of sizes " + c10::str(stored.sizes()) +
                             ", but .metadata says " + c10::toString(info.dtype) + " of sizes " + join(chunk_sizes));
    }
    torch::Tensor source = stored;
    torch::Tensor target = out;
    for (std::size_t d = 0; d < offsets.size(); ++d) {
      const auto dim = static_cast<int64_t>(d);
      source = source.narrow(dim, begin[d] - chunk_offsets[d], length[d]);
      target = target.narrow(dim, begin[d] - offsets[d], length[d]);
    }
    target.copy_(source);
    covered += count;
    used.emplace_back(std::move(begin), std::move(length));
  }
  if (covered != wanted) {
    throw std::runtime_error("reading tensor '" + fqn + "' of " + directory_.string() + ": the box at offsets " +
                             join(offsets) + " with sizes " + join(sizes) + " is not covered by the stored chunks (" +
                             std::to_string(covered) + " of " + std::to_string(wanted) + " elements)");
  }
  return out;
}

torch::Tensor Reader::read_whole(const std::string& fqn) const {
  const auto found = tensors_.find(fqn);
  if (found == tensors_.end()) return read(fqn, {}, {});  // throws naming it
  return read(fqn, std::vector<int64_t>(found->second.global_shape.size(), 0), found->second.global_shape);
}

std::string Reader::read_bytes(const std::string& fqn) const {
  const auto found = bytes_.find(fqn);
  if (found == bytes_.end()) {
    throw std::runtime_error("no bytes item '" + fqn + "' in the checkpoint " + directory_.string() +
                             (tensors_.count(fqn) ? " (it is a tensor: use read)" : ""));
  }
  if (found->second.relative_path.empty()) {
    throw std::runtime_error((directory_ / kMetadataFile).string() + " lists the bytes item '" + fqn +
                             "' but not where it is stored");
  }
  return read_item(found->second, "bytes item '" + fqn + "'");
}

int64_t Reader::verify_all() const {
  int64_t checked = 0;
  for (const auto& [key, location] : storage_) {
    const std::string what = "tensor '" + key.first + "' chunk at offsets " + join(key.second);
    std::string blob = read_item(location, what);
    try {
      if (!checksum_file_present_) verify_zip_archive(blob);
      tensor_in_blob(blob);
    } catch (const DamagedFileError& error) {
      throw DamagedFileError((directory_ / location.relative_path).string() + " is damaged: " + what + ": " +
                             error.what());
    }
    ++checked;
  }
  if (checksum_file_present_) {
    for (const auto& [fqn, location] : bytes_) {
      read_bytes(fqn);
      ++checked;
    }
  }
  return checked;
}

}  // namespace bridge::utils::dcp
