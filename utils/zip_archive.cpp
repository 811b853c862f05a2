// The zip format's records (APPNOTE.TXT 4.3), read as PyTorch's writer (miniz, zip64, data descriptors, a padding
// extra field) produces them, and zlib's CRC32.
#include "utils/zip_archive.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>

namespace bridge::utils {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kDataDescriptor = 0x08074b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfCentralDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr std::size_t kEndSize = 22, kZip64EndSize = 56, kLocatorSize = 20, kCentralSize = 46, kLocalSize = 30;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr uint16_t kPaddingExtra = 0x4246;  // "FB": PyTorch's alignment padding, filled with 'Z'
constexpr uint16_t kDataDescriptorFlag = 1U << 3;
constexpr char kCommentPrefix[] = "bridge-crc32=";
constexpr std::size_t kCommentSize = sizeof(kCommentPrefix) - 1 + 8;

[[noreturn]] void damaged(const std::string& what) { throw DamagedFileError(what); }

// Little-endian reads, bounds-checked against the archive.
class Bytes {
 public:
  explicit Bytes(std::string_view data) : data_(data) {}
  std::size_t size() const { return data_.size(); }
  bool fits(uint64_t offset, uint64_t length) const { return offset <= size() && length <= size() - offset; }
  void require(uint64_t offset, uint64_t length, const std::string& what) const {
    if (!fits(offset, length)) {
      damaged(what + " (bytes " + std::to_string(offset) + ".." + std::to_string(offset + length) +
              ") lies past the end of the file (" + std::to_string(size()) + " bytes): truncated or damaged");
    }
  }
  template <class T>
  T read(uint64_t offset) const {
    T value = 0;
    for (std::size_t i = sizeof(T); i-- > 0;)
      value = static_cast<T>(value << 8 | static_cast<unsigned char>(data_[offset + i]));
    return value;
  }
  std::string_view view(uint64_t offset, uint64_t length) const { return data_.substr(offset, length); }

 private:
  std::string_view data_;
};

std::string hex32(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

// The end of central directory record: at the very end of the file, followed only by its comment.
struct End {
  uint64_t offset = 0;
  std::string_view comment;
};

std::optional<End> find_end(const Bytes& bytes) {
  if (bytes.size() < kEndSize) return std::nullopt;
  const uint64_t lowest = bytes.size() >= kEndSize + 0xFFFF ? bytes.size() - kEndSize - 0xFFFF : 0;
  for (uint64_t at = bytes.size() - kEndSize + 1; at-- > lowest;) {
    if (bytes.read<uint32_t>(at) == kEndOfCentralDirectory &&
        at + kEndSize + bytes.read<uint16_t>(at + 20) == bytes.size()) {
      return End{at, bytes.view(at + kEndSize, bytes.size() - at - kEndSize)};
    }
  }
  return std::nullopt;
}

// bridge's checksum comment: its CRC when `comment` is one, nullopt when empty; anything else is damage (PyTorch
// writes no comment).
std::optional<uint32_t> bridge_checksum(std::string_view comment) {
  if (comment.empty()) return std::nullopt;
  const std::string_view prefix(kCommentPrefix);
  if (comment.size() == kCommentSize && comment.substr(0, prefix.size()) == prefix) {
    uint32_t crc = 0;
    bool digits = true;
    for (const char c : comment.substr(prefix.size())) {
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      digits = digits && digit >= 0;
      crc = crc << 4 | static_cast<uint32_t>(std::max(digit, 0));
    }
    if (digits) return crc;
  }
  damaged("its archive comment is not bridge's checksum (\"" + std::string(comment.substr(0, 40)) + "\")");
}

// The central directory's place and entry count, from the end record or, when it defers to them, the zip64 records.
struct Directory {
  uint64_t offset = 0, size = 0, entries = 0;
  uint64_t end = 0;  // where the records after it (zip64 end, or the end record) start
};

Directory find_directory(const Bytes& bytes, const End& end) {
  const uint64_t at = end.offset;
  if (bytes.read<uint16_t>(at + 4) != 0 || bytes.read<uint16_t>(at + 6) != 0) {
    damaged("its end of central directory names another disk of a split archive");
  }
  if (bytes.read<uint16_t>(at + 8) != bytes.read<uint16_t>(at + 10)) {
    damaged("its end of central directory counts the entries twice, differently");
  }
  Directory directory{bytes.read<uint32_t>(at + 16), bytes.read<uint32_t>(at + 12), bytes.read<uint16_t>(at + 10), at};
  const bool has_locator = at >= kLocatorSize && bytes.read<uint32_t>(at - kLocatorSize) == kZip64Locator;
  if (has_locator) {
    const uint64_t locator = at - kLocatorSize;
    const uint64_t record = bytes.read<uint64_t>(locator + 8);
    if (bytes.read<uint32_t>(locator + 4) != 0 || bytes.read<uint32_t>(locator + 16) != 1) {
      damaged("its zip64 end of central directory locator names another disk");
    }
    if (record + kZip64EndSize != locator || bytes.read<uint32_t>(record) != kZip64EndOfCentralDirectory) {
      damaged("its zip64 end of central directory locator does not point at the zip64 record before it");
    }
    if (bytes.read<uint64_t>(record + 4) != kZip64EndSize - 12 || bytes.read<uint32_t>(record + 16) != 0 ||
        bytes.read<uint32_t>(record + 20) != 0 ||
        bytes.read<uint64_t>(record + 24) != bytes.read<uint64_t>(record + 32)) {
      damaged("its zip64 end of central directory record is malformed");
    }
    const Directory zip64{bytes.read<uint64_t>(record + 48), bytes.read<uint64_t>(record + 40),
                          bytes.read<uint64_t>(record + 32), record};
    // The 16- and 32-bit fields either agree with the zip64 ones or say "see zip64" (all ones).
    if ((directory.offset != 0xFFFFFFFF && directory.offset != zip64.offset) ||
        (directory.size != 0xFFFFFFFF && directory.size != zip64.size) ||
        (directory.entries != 0xFFFF && directory.entries != zip64.entries)) {
      damaged("its end of central directory and zip64 record disagree");
    }
    directory = zip64;
  } else if (directory.offset == 0xFFFFFFFF || directory.size == 0xFFFFFFFF || directory.entries == 0xFFFF) {
    damaged("its end of central directory defers to a zip64 record that is not there");
  }
  if (directory.offset > directory.end || directory.size != directory.end - directory.offset) {
    damaged("its central directory (" + std::to_string(directory.size) + " bytes at " +
            std::to_string(directory.offset) + ") does not end where the records after it start (" +
            std::to_string(directory.end) + ")");
  }
  return directory;
}

// The zip64 extended information of an extra field: each value the fixed-size field left at all ones, in order.
void read_zip64_extra(const Bytes& bytes, uint64_t at, uint16_t length, const std::string& where,
                      std::initializer_list<uint64_t*> values) {
  uint64_t used = 0;
  for (uint64_t* value : values) {
    if (*value != 0xFFFFFFFF) continue;
    if (used + 8 > length) damaged(where + ": its zip64 extra field is too short");
    *value = bytes.read<uint64_t>(at + used);
    used += 8;
  }
}

// Walks the (id, length) records of an extra field that must fill it exactly; calls `each(id, offset, length)`.
template <class Each>
void for_each_extra(const Bytes& bytes, uint64_t at, uint64_t length, const std::string& where, Each&& each) {
  const uint64_t end = at + length;
  while (at < end) {
    if (end - at < 4) damaged(where + ": its extra field ends inside a record header");
    const uint16_t id = bytes.read<uint16_t>(at);
    const uint16_t size = bytes.read<uint16_t>(at + 2);
    if (size > end - at - 4) damaged(where + ": an extra field record runs past the field");
    each(id, at + 4, size);
    at += 4 + size;
  }
}

}  // namespace

uint32_t crc32(std::string_view data, uint32_t crc) {
  // zlib takes lengths as uInt: feed it in pieces of at most 1 GiB.
  while (!data.empty()) {
    const std::size_t piece = std::min<std::size_t>(data.size(), std::size_t{1} << 30);
    crc = static_cast<uint32_t>(::crc32(crc, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(piece)));
    data.remove_prefix(piece);
  }
  return crc;
}

std::vector<ZipEntry> read_zip_directory(std::string_view archive) {
  const Bytes bytes(archive);
  const std::optional<End> end = find_end(bytes);
  if (!end) damaged("it has no end of central directory record at its end: truncated, or bytes were appended");
  const Directory directory = find_directory(bytes, *end);
  std::vector<ZipEntry> entries;
  uint64_t at = directory.offset;
  uint64_t next_local = 0;  // entries lie back to back from byte 0
  for (uint64_t index = 0; index < directory.entries; ++index) {
    const std::string where = "central directory entry " + std::to_string(index);
    bytes.require(at, kCentralSize, where);
    if (bytes.read<uint32_t>(at) != kCentralHeader) damaged(where + " has no central header signature");
    const uint16_t flags = bytes.read<uint16_t>(at + 8);
    const uint16_t method = bytes.read<uint16_t>(at + 10);
    uint64_t compressed = bytes.read<uint32_t>(at + 20), size = bytes.read<uint32_t>(at + 24);
    const uint16_t name_length = bytes.read<uint16_t>(at + 28), extra_length = bytes.read<uint16_t>(at + 30);
    const uint16_t comment_length = bytes.read<uint16_t>(at + 32);
    uint64_t disk = bytes.read<uint16_t>(at + 34), local = bytes.read<uint32_t>(at + 42);
    bytes.require(at + kCentralSize, uint64_t{name_length} + extra_length + comment_length, where);
    ZipEntry entry;
    entry.name = std::string(bytes.view(at + kCentralSize, name_length));
    entry.crc32 = bytes.read<uint32_t>(at + 16);
    entry.crc32_offset = at + 16;
    const std::string named = "entry '" + entry.name + "'";
    for_each_extra(bytes, at + kCentralSize + name_length, extra_length, named,
                   [&](uint16_t id, uint64_t offset, uint16_t length) {
                     if (id == kZip64Extra)
                       read_zip64_extra(bytes, offset, length, named, {&size, &compressed, &local});
                   });
    if (disk != 0) damaged(named + " names another disk of a split archive");
    if (method != 0) {
      throw std::runtime_error(named + " is compressed (method " + std::to_string(method) +
                               "); PyTorch's files store their entries uncompressed");
    }
    if (compressed != size) damaged(named + " is stored, but its compressed and uncompressed sizes differ");
    entry.size = size;
    entry.local_header_offset = local;
    if (local != next_local) {
      damaged(named + "'s local header is at byte " + std::to_string(local) + ", but the previous entry ends at byte " +
              std::to_string(next_local));
    }

    // The local header repeats the central entry (its CRC and sizes may be zero when a data descriptor follows).
    bytes.require(local, kLocalSize, named + "'s local header");
    if (bytes.read<uint32_t>(local) != kLocalHeader) damaged(named + "'s local header has no signature");
    const bool descriptor = (flags & kDataDescriptorFlag) != 0;
    const uint32_t local_crc = bytes.read<uint32_t>(local + 14);
    uint64_t local_compressed = bytes.read<uint32_t>(local + 18), local_size = bytes.read<uint32_t>(local + 22);
    const uint16_t local_name_length = bytes.read<uint16_t>(local + 26);
    const uint16_t local_extra_length = bytes.read<uint16_t>(local + 28);
    bytes.require(local + kLocalSize, uint64_t{local_name_length} + local_extra_length, named + "'s local header");
    bool zip64_local = false;
    for_each_extra(
        bytes, local + kLocalSize + local_name_length, local_extra_length, named + "'s local header",
        [&](uint16_t id, uint64_t offset, uint16_t length) {
          if (id == kZip64Extra) {
            zip64_local = true;
            read_zip64_extra(bytes, offset, length, named + "'s local header", {&local_size, &local_compressed});
          } else if (id == kPaddingExtra) {
            const std::string_view padding = bytes.view(offset, length);
            if (padding.find_first_not_of('Z') != std::string_view::npos) {
              damaged(named + "'s alignment padding is not all 'Z'");
            }
          }
        });
    const auto same_or_deferred = [&](uint64_t local_value, uint64_t central_value) {
      return local_value == central_value || (descriptor && local_value == 0);
    };
    if (bytes.read<uint16_t>(local + 4) != bytes.read<uint16_t>(at + 6) || bytes.read<uint16_t>(local + 6) != flags ||
        bytes.read<uint16_t>(local + 8) != method ||
        bytes.read<uint32_t>(local + 10) != bytes.read<uint32_t>(at + 12) ||
        !same_or_deferred(local_crc, entry.crc32) || !same_or_deferred(local_compressed, compressed) ||
        !same_or_deferred(local_size, size) || bytes.view(local + kLocalSize, local_name_length) != entry.name) {
      damaged(named + "'s local header disagrees with its central directory entry");
    }
    entry.data_offset = local + kLocalSize + local_name_length + local_extra_length;
    bytes.require(entry.data_offset, size, named + "'s data");
    entry.end_offset = entry.data_offset + size;
    if (descriptor) {
      // CRC and sizes after the data, behind an optional signature; 8-byte sizes with zip64.
      uint64_t d = entry.end_offset;
      if (bytes.fits(d, 4) && bytes.read<uint32_t>(d) == kDataDescriptor) d += 4;
      const bool wide = zip64_local || size >= 0xFFFFFFFF;
      const uint64_t width = wide ? 8 : 4;
      bytes.require(d, 4 + 2 * width, named + "'s data descriptor");
      const uint64_t d_compressed = wide ? bytes.read<uint64_t>(d + 4) : bytes.read<uint32_t>(d + 4);
      const uint64_t d_size = wide ? bytes.read<uint64_t>(d + 4 + width) : bytes.read<uint32_t>(d + 4 + width);
      if (bytes.read<uint32_t>(d) != entry.crc32 || d_compressed != compressed || d_size != size) {
        damaged(named + "'s data descriptor disagrees with its central directory entry");
      }
      entry.end_offset = d + 4 + 2 * width;
    }
    next_local = entry.end_offset;
    at += kCentralSize + name_length + extra_length + comment_length;
    entries.push_back(std::move(entry));
  }
  if (at != directory.end) damaged("its central directory holds more bytes than its entries");
  if (next_local != directory.offset) {
    damaged("its last entry ends at byte " + std::to_string(next_local) + ", but the central directory starts at " +
            std::to_string(directory.offset));
  }
  return entries;
}

ZipCheck verify_zip_archive(std::string_view archive) {
  const Bytes bytes(archive);
  const std::optional<End> end = find_end(bytes);
  if (!end) damaged("it has no end of central directory record at its end: truncated, or bytes were appended");
  if (const std::optional<uint32_t> expected = bridge_checksum(end->comment)) {
    const uint32_t actual = crc32(archive.substr(0, archive.size() - end->comment.size()));
    if (actual != *expected) {
      damaged("its CRC32 is " + hex32(actual) + " but was " + hex32(*expected) + " when it was written");
    }
    return ZipCheck::kWholeFile;
  }
  for (const ZipEntry& entry : read_zip_directory(archive)) {
    const uint32_t actual = crc32(archive.substr(entry.data_offset, entry.size));
    if (actual != entry.crc32) {
      damaged("entry '" + entry.name + "' (" + std::to_string(entry.size) + " bytes at " +
              std::to_string(entry.data_offset) + ") has CRC32 " + hex32(actual) + " but was " + hex32(entry.crc32) +
              " when it was written");
    }
  }
  return ZipCheck::kEntries;
}

void ChecksummedZipSink::pass_on(const char* data, std::size_t size) {
  crc_ = crc32(std::string_view(data, size), crc_);
  sink_(data, size);
}

void ChecksummedZipSink::write(const char* data, std::size_t size) {
  // Hold back the last kEndSize bytes seen: the end record, once the archive is complete, gets a comment length.
  if (size >= kEndSize) {
    if (!tail_.empty()) pass_on(tail_.data(), tail_.size());
    pass_on(data, size - kEndSize);
    tail_.assign(data + size - kEndSize, kEndSize);
    return;
  }
  tail_.append(data, size);
  if (tail_.size() > kEndSize) {
    pass_on(tail_.data(), tail_.size() - kEndSize);
    tail_.erase(0, tail_.size() - kEndSize);
  }
}

void ChecksummedZipSink::finish() {
  const Bytes end(tail_);
  if (tail_.size() != kEndSize || end.read<uint32_t>(0) != kEndOfCentralDirectory || end.read<uint16_t>(20) != 0) {
    throw std::logic_error("ChecksummedZipSink: the archive did not end with an end of central directory record");
  }
  tail_[20] = static_cast<char>(kCommentSize & 0xFF);
  tail_[21] = static_cast<char>(kCommentSize >> 8);
  pass_on(tail_.data(), tail_.size());
  const std::string comment = kCommentPrefix + hex32(crc_);
  sink_(comment.data(), comment.size());
  tail_.clear();
}

}  // namespace bridge::utils
