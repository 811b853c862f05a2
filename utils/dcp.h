// PyTorch Distributed Checkpoint (torch.distributed.checkpoint, "DCP") directories, written and read in C++ byte for
// byte as torch 2.15's FileSystemWriter/Reader lay them out, so that torch.distributed.checkpoint.load and
// Megatron-Core's torch_dist loader open what bridge saves, and bridge opens what they save. Generic: it knows
// tensors, their chunks in a global shape and opaque byte items, nothing about parallelism. The layout:
//   <dir>/__<rank>_0.distcp   one per writer: its BYTE_IO items, then one standalone torch.save zip per tensor chunk
//   <dir>/bridge_checksums.json   bridge's CRC32 of every item (DCP's readers ignore the file; DCP has no checksum)
//   <dir>/.metadata           a Python pickle of Metadata: every tensor's dtype, global shape and chunks, and where
//                             each item lies; written last, its rename is the commit point
//
//   DataFileWriter writer(dir, "__0_0.distcp");                 // each rank
//   writer.add_tensor("decoder.weight", shard, {row0, 0}, {rows, cols});
//   std::vector<WriteRecord> mine = writer.finish();
//   write_metadata(dir, all_ranks_records);                     // the coordinator, after gathering encode_records()
//   Reader reader(dir);
//   torch::Tensor rows = reader.read("decoder.weight", {4, 0}, {8, cols});   // any box, across stored chunks
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bridge::utils::dcp {

inline constexpr char kMetadataFile[] = ".metadata";
inline constexpr char kChecksumFile[] = "bridge_checksums.json";

/// Where an item's bytes lie: [offset, offset + length) of `relative_path` in the checkpoint directory.
struct StorageLocation {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// One item one rank wrote: a tensor chunk (is_bytes false) or a BYTE_IO item.
struct WriteRecord {
  std::string fqn;
  bool is_bytes = false;
  std::vector<int64_t> offsets;       // chunk offsets in the global tensor (tensors only)
  std::vector<int64_t> sizes;         // chunk sizes
  std::vector<int64_t> global_shape;  // the whole tensor's shape
  c10::ScalarType dtype = c10::ScalarType::Float;
  StorageLocation location;
  uint32_t checksum = 0;  // bridge's CRC32 of the item's bytes [offset, offset+length)
};

/// Python's name of a dtype as DCP pickles it (torch.<name>): "float32", "bfloat16", "int64", "bool", ... Throws
/// std::invalid_argument naming the dtype when DCP checkpoints of it are not supported here.
std::string dtype_name(c10::ScalarType dtype);
/// The inverse, also taking Python's aliases ("float", "half", "long", ...); throws std::invalid_argument.
c10::ScalarType dtype_from_name(std::string_view name);

/// Writes one rank's data file `<directory>/<file_name>` (e.g. "__3_0.distcp") as DCP's FileSystemWriter does with
/// one file per rank: BYTE_IO items first, then one standalone torch.save zip per tensor chunk, no header. Written to
/// a temporary name and renamed (durably) in finish(); nothing is visible before. Tensors are written from CPU
/// (contiguous copies made where needed; only the chunk's own bytes are stored, even for a view of a larger
/// storage). Memory: at most one item's serialized bytes are held at a time besides the caller's tensors.
/// The tensors are read in finish(), not in add_tensor(): they must not change in between.
class DataFileWriter {
 public:
  /// Throws std::invalid_argument when `file_name` is not a plain file name (empty, a path, or ".metadata").
  DataFileWriter(std::filesystem::path directory, std::string file_name);

  /// Throws std::invalid_argument naming `fqn` when it was added before or is not valid UTF-8.
  void add_bytes(const std::string& fqn, std::string bytes);
  /// `chunk` is the region [offsets, offsets + chunk.sizes()) of a tensor of shape `global_shape`; any device,
  /// layout strided. Throws std::invalid_argument naming `fqn` when the ranks differ, the chunk lies outside the
  /// global shape, its dtype is not supported, or the same (fqn, offsets) was added before.
  void add_tensor(const std::string& fqn, const torch::Tensor& chunk, std::vector<int64_t> offsets,
                  std::vector<int64_t> global_shape);
  /// Writes the file (bytes items first, then tensors, each in the order added), fsyncs, renames; returns what it
  /// wrote. Throws std::runtime_error naming the file when it cannot be written (the old file, if any, is kept),
  /// std::logic_error when called twice.
  std::vector<WriteRecord> finish();

  const std::filesystem::path& path() const { return path_; }

 private:
  struct TensorItem {
    std::string fqn;
    torch::Tensor chunk;
    std::vector<int64_t> offsets;
    std::vector<int64_t> global_shape;
  };
  std::filesystem::path directory_;
  std::string file_name_;
  std::filesystem::path path_;
  std::vector<std::pair<std::string, std::string>> bytes_items_;
  std::vector<TensorItem> tensor_items_;
  bool finished_ = false;
};

/// For gathering records to the coordinator as text (all_gather of strings): lossless round trip. decode_records
/// throws std::invalid_argument when the text is not what encode_records writes.
std::string encode_records(const std::vector<WriteRecord>& records);
std::vector<WriteRecord> decode_records(std::string_view text);

/// The coordinator's commit: checks the records (every tensor's chunks cover its global shape exactly, no overlap,
/// one dtype and shape per fqn, each bytes fqn once; a std::invalid_argument naming the fqn otherwise, and nothing
/// written), removes an old .metadata, writes bridge's checksum file (kChecksumFile, a file DCP readers ignore: JSON
/// of relative_path/offset/length/crc32 per item), then `.metadata` (Metadata pickled as torch 2.15 does, via
/// `.metadata.tmp` + fsync + rename: the commit point).
void write_metadata(const std::filesystem::path& directory, const std::vector<WriteRecord>& records);

/// The pickle of a Metadata for `records` (already checked by write_metadata); for tests and tools.
std::string metadata_pickle(const std::vector<WriteRecord>& records);

/// One tensor of a checkpoint: its dtype, global shape and stored chunks as (offsets, sizes).
struct TensorInfo {
  std::string fqn;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<int64_t> global_shape;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> chunks;
};

/// A DCP checkpoint directory opened for reading (written by bridge, by torch.distributed.checkpoint.save, or by
/// Megatron-Core's dist_checkpointing torch_dist): its .metadata parsed.
class Reader {
 public:
  /// Throws std::runtime_error naming the file when .metadata is missing or unreadable, or bridge_checksums.json is
  /// present but unreadable.
  explicit Reader(std::filesystem::path directory);

  const std::filesystem::path& directory() const { return directory_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  std::vector<std::string> byte_items() const;  // fqns of BYTE_IO items
  bool has_checksums() const { return !checksums_.empty() || checksum_file_present_; }
  /// Where the chunk of `fqn` stored at `offsets` lies (a bytes item: empty offsets). Throws std::runtime_error.
  const StorageLocation& location(const std::string& fqn, const std::vector<int64_t>& offsets) const;

  /// The region [offsets, offsets+sizes) of tensor `fqn` (any box, across any number of stored chunks), as a new CPU
  /// tensor of the stored dtype. Reads only the chunks that overlap (each chunk's blob read whole with pread, its
  /// bridge checksum verified when the checksum file is present -> DamagedFileError (utils/zip_archive.h) naming the
  /// .distcp file, the fqn and the chunk; a blob that is not a valid torch.save zip -> DamagedFileError too), throws
  /// std::runtime_error naming fqn when it is unknown or the box is out of bounds / not covered.
  torch::Tensor read(const std::string& fqn, const std::vector<int64_t>& offsets,
                     const std::vector<int64_t>& sizes) const;
  torch::Tensor read_whole(const std::string& fqn) const;
  std::string read_bytes(const std::string& fqn) const;  // a BYTE_IO item's raw bytes (checksum verified likewise)
  /// Verifies every item: its bridge checksum when the checksum file is present, else (torch's and Megatron's
  /// checkpoints) each tensor blob's zip entries' CRC32s; bytes items without a checksum file cannot be checked.
  /// Throws DamagedFileError naming the file and item; returns the number of items checked.
  int64_t verify_all() const;

 private:
  // An item's bytes, read whole and checked against the checksum file when there is one.
  std::string read_item(const StorageLocation& location, const std::string& what) const;

  std::filesystem::path directory_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, StorageLocation> bytes_;
  std::map<std::pair<std::string, std::vector<int64_t>>, StorageLocation> storage_;
  // bridge_checksums.json: (relative_path, offset) -> (length, crc32).
  std::map<std::pair<std::string, uint64_t>, std::pair<uint64_t, uint32_t>> checksums_;
  bool checksum_file_present_ = false;
};

}  // namespace bridge::utils::dcp
