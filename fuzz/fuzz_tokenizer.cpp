// libFuzzer target: the byte-level and GPT-2 BPE tokenizers. Any bytes: the byte-level tokenizer gives them back
// exactly; GPT-2 refuses text that is not UTF-8 with std::invalid_argument and otherwise gives ids inside its
// vocabulary that decode to the text. The same bytes read as ids must decode or be refused, never crash. The BPE
// vocabulary is GPT-2's 256 byte characters plus a few merges (as tests/unit/tokenizer_test.cpp builds it).
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "training/datasets/tokenizer.h"

namespace {

using bridge::training::datasets::ByteLevelTokenizer;
using bridge::training::datasets::GPT2BPETokenizer;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the others for U+0100 onwards; as a
// JSON string (UTF-8, with '"' and '\' escaped).
std::string byte_character(int b) {
  static const std::vector<int> codes = [] {
    std::vector<int> result(256);
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      result[static_cast<std::size_t>(c)] = printable ? c : next++;
    }
    return result;
  }();
  const int code = codes[static_cast<std::size_t>(b)];
  std::string out;
  if (code < 0x80) {
    if (code == '"' || code == '\\') out += '\\';
    out += static_cast<char>(code);
  } else {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

const GPT2BPETokenizer& gpt2() {
  static const std::unique_ptr<GPT2BPETokenizer> tokenizer = [] {
    std::string vocab = "{";
    for (int b = 0; b < 256; ++b) vocab += "\"" + byte_character(b) + "\": " + std::to_string(b) + ", ";
    vocab +=
        "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"Ġw\": 260, \"or\": 261, \"Ġwor\": 262, "
        "\"Ġworl\": 263, \"Ġworld\": 264, \"'s\": 265, \"12\": 266, \"<|endoftext|>\": 267}";
    const auto dir = bridge::fuzz::scratch_dir();
    bridge::fuzz::write_file(dir / "vocab.json", vocab);
    bridge::fuzz::write_file(dir / "merges.txt",
                             "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ w\no r\nĠw or\nĠwor l\nĠworl d\n' s\n1 2\n");
    return std::make_unique<GPT2BPETokenizer>((dir / "vocab.json").string(), (dir / "merges.txt").string());
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const ByteLevelTokenizer bytes;
  FUZZ_CHECK(bytes.decode(bytes.encode(text)) == text);

  const GPT2BPETokenizer& tokenizer = gpt2();
  try {
    const std::vector<int64_t> ids = tokenizer.encode(text);
    for (const int64_t id : ids) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size() && id != tokenizer.eod());
    FUZZ_CHECK(tokenizer.decode(ids) == text);
  } catch (const std::invalid_argument&) {  // not UTF-8
  }

  std::vector<int64_t> ids;
  for (std::size_t i = 0; i + 1 < size; i += 2) ids.push_back(static_cast<int16_t>(data[i] | data[i + 1] << 8));
  for (const auto* t : {static_cast<const bridge::training::datasets::Tokenizer*>(&bytes),
                        static_cast<const bridge::training::datasets::Tokenizer*>(&tokenizer)}) {
    try {
      t->decode(ids);
    } catch (const std::out_of_range&) {
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
