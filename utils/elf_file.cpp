// The ELF checks behind check_shared_object: the header, then every range the loader will read (program headers,
// PT_LOAD segments, the section header table) against the file's size.
#include "utils/elf_file.h"

#include <elf.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace bridge::utils {
namespace {

#if defined(__x86_64__)
constexpr std::uint16_t kThisMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr std::uint16_t kThisMachine = EM_AARCH64;
#else
constexpr std::uint16_t kThisMachine = EM_NONE;  // any: dlopen's own check decides
#endif

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw std::invalid_argument("'" + path + "' is not a loadable shared library: " + why);
}

// Whether [offset, offset + count * size) lies inside a file of `file_size` bytes, without overflow.
bool inside(std::uint64_t offset, std::uint64_t count, std::uint64_t size, std::uint64_t file_size) {
  if (offset > file_size) return false;
  if (size != 0 && count > (file_size - offset) / size) return false;
  return true;
}

std::string truncated(const std::string& what, std::uint64_t end, std::uint64_t file_size) {
  return "it is truncated: " + what + " ends at byte " + std::to_string(end) + " but the file has " +
         std::to_string(file_size) + " bytes (copy or build it again)";
}

}  // namespace

void check_shared_object(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, "it cannot be opened for reading");
  const auto file_size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr header{};
  const auto head = static_cast<std::streamsize>(std::min<std::uint64_t>(file_size, sizeof(header)));
  in.read(reinterpret_cast<char*>(&header), head);
  if (!in) fail(path, "it cannot be read");
  if (file_size >= SELFMAG && std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) fail(path, "it is not an ELF file");
  if (file_size < sizeof(header)) fail(path, truncated("the ELF header", sizeof(header), file_size));
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB) {
    fail(path, "it is not a 64-bit little-endian ELF file (built for another machine?)");
  }
  if (header.e_type != ET_DYN) fail(path, "it is an ELF file but not a shared library (ET_DYN); build it with -shared");
  if (kThisMachine != EM_NONE && header.e_machine != kThisMachine) {
    fail(path, "it was built for another processor (ELF machine " + std::to_string(header.e_machine) + ")");
  }
  if (header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phnum == 0) fail(path, "it has no valid program headers");
  if (!inside(header.e_phoff, header.e_phnum, header.e_phentsize, file_size)) {
    fail(path, truncated("the program header table",
                         header.e_phoff + std::uint64_t{header.e_phnum} * header.e_phentsize, file_size));
  }
  std::vector<Elf64_Phdr> segments(header.e_phnum);
  in.seekg(static_cast<std::streamoff>(header.e_phoff));
  in.read(reinterpret_cast<char*>(segments.data()), static_cast<std::streamsize>(segments.size() * sizeof(Elf64_Phdr)));
  if (!in) fail(path, "its program headers cannot be read");
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Elf64_Phdr& segment = segments[i];
    if (segment.p_type != PT_LOAD) continue;
    if (!inside(segment.p_offset, 1, segment.p_filesz, file_size)) {
      fail(path,
           truncated("its loadable segment " + std::to_string(i), segment.p_offset + segment.p_filesz, file_size));
    }
  }
  // The loader needs no section headers, but a table cut off at the end is the usual sign of a partial copy.
  if (header.e_shoff != 0 && !inside(header.e_shoff, header.e_shnum, header.e_shentsize, file_size)) {
    fail(path, truncated("the section header table",
                         header.e_shoff + std::uint64_t{header.e_shnum} * header.e_shentsize, file_size));
  }
}

}  // namespace bridge::utils
