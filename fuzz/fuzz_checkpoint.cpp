// libFuzzer target: the checkpoint file reader (utils/torch_pickle.h, which every model_optim_rng.pt and common.pt
// goes through). Any file must load or be refused with std::runtime_error naming it (DamagedFileError is one); no
// other exception, crash or leak. What loads must write back and load again to the same file bytes (save, load and
// save again agree).
//
// The checksums refuse nearly every mutated input before LibTorch's reader sees it, which would leave the zip and
// pickle readers behind them unfuzzed. So each input is tried twice: as it is (the checksum and directory checks
// themselves), then with its checksums recomputed (the readers behind them).
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "utils/durable_file.h"
#include "utils/torch_pickle.h"
#include "utils/zip_archive.h"

namespace {

void write_u32(std::string& bytes, uint64_t at, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>(value >> (8 * i));
}

// `bytes` with every entry's CRC32 (central directory, local header, data descriptor) and bridge's whole-file CRC
// recomputed; as it is when its directory does not parse.
std::string with_checksums_recomputed(std::string bytes) {
  try {
    for (const bridge::utils::ZipEntry& entry : bridge::utils::read_zip_directory(bytes)) {
      const uint32_t crc = bridge::utils::crc32(std::string_view(bytes).substr(entry.data_offset, entry.size));
      write_u32(bytes, entry.crc32_offset, crc);
      if (bytes.compare(entry.local_header_offset + 14, 4, std::string(4, '\0')) != 0) {
        write_u32(bytes, entry.local_header_offset + 14, crc);
      }
      const uint64_t descriptor = entry.data_offset + entry.size;
      if (entry.end_offset > descriptor) {
        write_u32(bytes, descriptor + (bytes.compare(descriptor, 4, "PK\x07\x08") == 0 ? 4 : 0), crc);
      }
    }
  } catch (const std::exception&) {
    return bytes;
  }
  const std::size_t comment = bytes.rfind("bridge-crc32=");
  if (comment != std::string::npos && comment + 21 == bytes.size()) {
    const uint32_t crc = bridge::utils::crc32(std::string_view(bytes).substr(0, comment));
    char digits[9];
    std::snprintf(digits, sizeof(digits), "%08x", crc);
    bytes.replace(comment + 13, 8, digits);
  }
  return bytes;
}

void load_and_round_trip(std::string_view input) {
  const auto dir = bridge::fuzz::scratch_dir();
  bridge::fuzz::write_file(dir / "in.pt", input);
  c10::IValue value;
  try {
    value = bridge::utils::load_torch_pickle(dir / "in.pt");
  } catch (const std::runtime_error&) {
    return;
  }
  try {
    bridge::utils::save_torch_pickle(dir / "once.pt", value);
  } catch (const std::runtime_error&) {
    return;  // a value of a kind bridge does not write (an object, a tensor of a storage it cannot save)
  }
  bridge::utils::save_torch_pickle(dir / "twice.pt", bridge::utils::load_torch_pickle(dir / "once.pt"));
  FUZZ_CHECK(bridge::utils::read_file(dir / "once.pt") == bridge::utils::read_file(dir / "twice.pt"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  load_and_round_trip(input);
  const std::string repaired = with_checksums_recomputed(input);
  if (repaired != input) load_and_round_trip(repaired);
  return 0;
}
