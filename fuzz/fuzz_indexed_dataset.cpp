// libFuzzer target: the Megatron .idx/.bin reader. An input is a little-endian uint32 (the .idx's size), the .idx
// bytes, then the .bin bytes. The reader must reject it with std::runtime_error or accept it; what it accepts must
// read back inside the .bin and, for integer tokens, be exactly the files IndexedDatasetBuilder writes from the
// tokens read: the reader accepts only what Megatron's writer can produce. The vocabulary check must find the
// first token outside the vocabulary.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "training/datasets/indexed_dataset.h"
#include "utils/durable_file.h"

using bridge::training::datasets::DType;
using bridge::training::datasets::IndexedDataset;
using bridge::training::datasets::IndexedDatasetBuilder;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t idx_size = 0;
  std::memcpy(&idx_size, data, 4);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  if (idx_size > rest.size()) return 0;
  const auto dir = bridge::fuzz::scratch_dir();
  const std::string in = (dir / "in").string(), out = (dir / "out").string();
  bridge::fuzz::write_file(in + ".idx", rest.substr(0, idx_size));
  bridge::fuzz::write_file(in + ".bin", rest.substr(idx_size));

  std::vector<std::vector<int64_t>> sequences;
  std::vector<int64_t> document_indices;
  DType dtype{};
  try {
    const IndexedDataset dataset(in);
    dtype = dataset.dtype();
    document_indices = dataset.document_indices();
    int64_t bytes = 0;
    for (int64_t i = 0; i < dataset.size(); ++i) {
      sequences.push_back(dataset.get(i));
      bytes += static_cast<int64_t>(sequences.back().size() * bridge::training::datasets::dtype_size(dtype));
    }
    FUZZ_CHECK(bytes == static_cast<int64_t>(rest.size() - idx_size));
    // The vocabulary check (dataset.validate_tokens) finds the first token outside [0, 1000) in file order.
    constexpr int64_t kLimit = 1000;
    const auto found = dataset.find_token_outside(kLimit);
    bool any = false;
    for (std::size_t s = 0; s < sequences.size() && !any; ++s) {
      for (std::size_t t = 0; t < sequences[s].size() && !any; ++t) {
        if (sequences[s][t] >= 0 && sequences[s][t] < kLimit) continue;
        any = true;
        FUZZ_CHECK(found && found->sequence == static_cast<int64_t>(s) && found->position == static_cast<int64_t>(t) &&
                   found->value == sequences[s][t]);
      }
    }
    FUZZ_CHECK(any == found.has_value());
  } catch (const std::runtime_error&) {
    return 0;
  }
  const bool integer = dtype != DType::kFloat32 && dtype != DType::kFloat64;
  const std::size_t n = sequences.size(), plain_idx = 34 + 12 * n + 8 * document_indices.size();
  if (!integer || idx_size != plain_idx) return 0;  // float tokens and multimodal files have no builder form

  IndexedDatasetBuilder builder(out, dtype);
  std::size_t next = 1;
  while (next < document_indices.size() && document_indices[next] == 0) builder.end_document(), ++next;
  for (std::size_t s = 0; s < n; ++s) {
    builder.add_item(sequences[s]);
    while (next < document_indices.size() && document_indices[next] == static_cast<int64_t>(s + 1)) {
      builder.end_document();
      ++next;
    }
  }
  FUZZ_CHECK(next == document_indices.size());
  builder.finalize();
  FUZZ_CHECK(bridge::utils::read_file(out + ".idx") == rest.substr(0, idx_size));
  FUZZ_CHECK(bridge::utils::read_file(out + ".bin") == rest.substr(idx_size));
  return 0;
}
