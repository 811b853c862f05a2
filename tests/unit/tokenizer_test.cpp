// Tokenizers: the byte-level one, and GPT-2 BPE on a small hand-made vocabulary whose expected ids are derived by
// hand below (pre-tokenization pieces, then merges lowest rank first), plus the Unicode classes and file errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/unit/datasets_test_support.h"
#include "training/tokenizers/build_tokenizer.h"
#include "training/tokenizers/byte_level_tokenizer.h"
#include "training/tokenizers/gpt2_bpe_tokenizer.h"
#include "training/tokenizers/unicode_classes.h"
#include "training/tokenizers/word_cache.h"

namespace bridge::training::tokenizers {
namespace {

using datasets::testing::read_bytes;
using datasets::testing::ScratchDir;
using datasets::testing::write_bytes;
using ::testing::HasSubstr;

TEST(ByteLevelTokenizerTest, BytesAreIdsAndEodIs256) {
  ByteLevelTokenizer tokenizer;
  EXPECT_EQ(tokenizer.vocab_size(), 257);
  EXPECT_EQ(tokenizer.eod(), 256);
  EXPECT_EQ(tokenizer.encode("hé!"), (std::vector<int64_t>{104, 0xC3, 0xA9, 33}));
  EXPECT_TRUE(tokenizer.encode("").empty());
  EXPECT_EQ(tokenizer.decode({104, 0xC3, 0xA9, 33}), "hé!");
  EXPECT_EQ(tokenizer.decode({104, 256}), "h<|endoftext|>");
  EXPECT_THROW(tokenizer.decode({257}), std::out_of_range);
  EXPECT_THROW(tokenizer.decode({-1}), std::out_of_range);
}

TEST(UnicodeClassesTest, LettersNumbersAndWhitespaceOfEveryScript) {
  for (const char32_t c : {U'a', U'Z', U'é', U'ß', U'Ж', U'中', U'ا', U'ℵ'})
    EXPECT_TRUE(is_unicode_letter(c)) << static_cast<int>(c);
  for (const char32_t c : {U'0', U'9', U'½', U'²', U'٣', U'Ⅻ'})
    EXPECT_TRUE(is_unicode_number(c)) << static_cast<int>(c);
  for (const char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u00A0', U'\u2003', U'\u3000'}) {
    EXPECT_TRUE(is_unicode_whitespace(c)) << static_cast<int>(c);
  }
  for (const char32_t c : {U'!', U'\'', U'-', U'€', U'😀', U'_'}) {
    EXPECT_FALSE(is_unicode_letter(c) || is_unicode_number(c) || is_unicode_whitespace(c)) << static_cast<int>(c);
  }
  EXPECT_FALSE(is_unicode_letter(U'5'));
  EXPECT_FALSE(is_unicode_number(U'x'));
}

// GPT-2's id of a single byte: the vocabulary lists the 256 byte characters in bytes_to_unicode order (printable
// 33..126, 161..172, 174..255, then the other bytes from 0 upwards), so the space byte is 220 as in GPT-2.
int64_t byte_id(int b) {
  if (b >= 33 && b <= 126) return b - 33;
  if (b >= 161 && b <= 172) return 94 + (b - 161);
  if (b >= 174) return 106 + (b - 174);
  if (b <= 32) return 188 + b;
  if (b >= 127 && b <= 160) return 221 + (b - 127);
  return 255;  // 173, the soft hyphen
}

// The byte character of byte b, as GPT-2's bytes_to_unicode maps it (UTF-8).
std::string byte_char(int b) {
  int code = b;
  if (byte_id(b) >= 188) code = 256 + static_cast<int>(byte_id(b) - 188);
  std::string out;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

class GPT2BPETokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 256 byte characters, then the merge results and EOD.
    std::string vocab = "{";
    for (int b = 0; b < 256; ++b) {
      std::string c = byte_char(b);
      if (c == "\"" || c == "\\") c = "\\" + c;
      vocab += "\"" + c + "\": " + std::to_string(byte_id(b)) + ", ";
    }
    vocab +=
        "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"Ġw\": 260, \"or\": 261, \"Ġwor\": 262, "
        "\"Ġworl\": 263, \"Ġworld\": 264, \"'s\": 265, \"12\": 266, \"<|endoftext|>\": 267}";
    write_bytes(dir_ / "vocab.json", vocab);
    write_bytes(dir_ / "merges.txt",
                "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ w\no r\nĠw or\nĠwor l\nĠworl d\n' s\n1 2\n");
    tokenizer_ = std::make_unique<GPT2BPETokenizer>(dir_ / "vocab.json", dir_ / "merges.txt");
  }

  std::vector<int64_t> encode(const std::string& text) {
    std::vector<int64_t> ids = tokenizer_->encode(text);
    EXPECT_EQ(tokenizer_->decode(ids), text) << "round trip";
    return ids;
  }

  ScratchDir dir_;
  std::unique_ptr<GPT2BPETokenizer> tokenizer_;
};

TEST_F(GPT2BPETokenizerTest, VocabularyAndEod) {
  EXPECT_EQ(tokenizer_->vocab_size(), 268);
  EXPECT_EQ(tokenizer_->eod(), 267);
  EXPECT_EQ(tokenizer_->decode({267}), "<|endoftext|>");
  EXPECT_EQ(byte_id(' '), 220);
  EXPECT_EQ(byte_char(' '), "Ġ");
  EXPECT_THROW(tokenizer_->decode({268}), std::out_of_range);
}

TEST_F(GPT2BPETokenizerTest, AVocabularyOfARepeatedTokenKeepsItsLastId) {
  // The same vocabulary with one more "he" entry at the front, which the file's later "he": 256 replaces, and merges
  // with Windows line ends, a blank line and tabs: the same ids as the clean files.
  std::string vocab = read_bytes(dir_ / "vocab.json");
  vocab.replace(0, 1, "{\"he\": 999, ");
  write_bytes(dir_ / "repeated.json", vocab);
  write_bytes(dir_ / "crlf.txt",
              "#version: 0.2\r\nh e\r\nl\tl\r\n\r\nhe ll\r\nhell o\r\nĠ w\r\no r\r\nĠw or\r\nĠwor l\r\nĠworl d\r\n"
              "' s\r\n1 2");
  GPT2BPETokenizer tokenizer(dir_ / "repeated.json", dir_ / "crlf.txt");
  EXPECT_EQ(tokenizer.vocab_size(), 268);
  EXPECT_EQ(tokenizer.encode("hello world's 12"), tokenizer_->encode("hello world's 12"));
  EXPECT_EQ(tokenizer.encode("hello world"), (std::vector<int64_t>{259, 264}));
}

TEST_F(GPT2BPETokenizerTest, MergesApplyLowestRankFirst) {
  // "hello": h e l l o -> (h,e) rank 0 -> he l l o -> (l,l) 1 -> he ll o -> (he,ll) 2 -> hell o -> 3 -> hello.
  // " world": Ġ w o r l d -> (Ġ,w) 4 -> (o,r) 5 -> (Ġw,or) 6 -> (Ġwor,l) 7 -> (Ġworl,d) 8 -> Ġworld.
  EXPECT_EQ(encode("hello world"), (std::vector<int64_t>{259, 264}));
  // " 12" -> Ġ 1 2: (1,2) rank 10 only; Ġ stays alone.
  EXPECT_EQ(encode(" 12"), (std::vector<int64_t>{220, 266}));
  // No merge applies: the byte ids.
  EXPECT_EQ(encode("dog"), (std::vector<int64_t>{byte_id('d'), byte_id('o'), byte_id('g')}));
}

TEST_F(GPT2BPETokenizerTest, PreTokenizationFollowsGpt2Pattern) {
  // Two spaces before a word: the first stands alone, the second leads the word.
  EXPECT_EQ(encode("hello  world!"), (std::vector<int64_t>{259, 220, 264, byte_id('!')}));
  EXPECT_EQ(encode("  hello"), (std::vector<int64_t>{220, 220, 259}));
  // Contractions are pieces of their own ('s merges); uppercase is not a contraction.
  EXPECT_EQ(encode("he's 12"), (std::vector<int64_t>{256, 265, 220, 266}));
  EXPECT_EQ(encode("'S"), (std::vector<int64_t>{byte_id('\''), byte_id('S')}));
  EXPECT_EQ(encode("x'll"), (std::vector<int64_t>{byte_id('x'), byte_id('\''), 257}));
  // Trailing whitespace is one piece; a single newline before a letter stands alone.
  EXPECT_EQ(encode("hi  "), (std::vector<int64_t>{byte_id('h'), byte_id('i'), 220, 220}));
  EXPECT_EQ(encode("a\n\nb"), (std::vector<int64_t>{byte_id('a'), byte_id('\n'), byte_id('\n'), byte_id('b')}));
  // Non-ASCII: é (C3 A9) is a letter, ½ (C2 BD) a number that takes the space before it.
  EXPECT_EQ(encode("é ½"), (std::vector<int64_t>{byte_id(0xC3), byte_id(0xA9), 220, byte_id(0xC2), byte_id(0xBD)}));
  // Symbols run together and take a leading space: " !!" is one piece (no merges, so three ids).
  EXPECT_EQ(encode("a !!"), (std::vector<int64_t>{byte_id('a'), 220, byte_id('!'), byte_id('!')}));
  EXPECT_TRUE(encode("").empty());
}

TEST_F(GPT2BPETokenizerTest, InvalidUtf8IsAnError) {
  EXPECT_THROW(tokenizer_->encode(std::string("ab\xFF")), std::invalid_argument);
  EXPECT_THROW(tokenizer_->encode(std::string("\xC3")), std::invalid_argument);
  EXPECT_THROW(tokenizer_->encode(std::string("\xED\xA0\x80")), std::invalid_argument);  // a surrogate
}

// Bad files are bad input as for every tokenizer (std::invalid_argument: exit 2 in bridge-preprocess-data, as
// docs/failures.md says), naming the file and line.
TEST_F(GPT2BPETokenizerTest, BadFilesNameTheFileAndLine) {
  const auto expect_error = [&](const std::string& vocab, const std::string& merges, const std::string& part) {
    try {
      GPT2BPETokenizer tokenizer(vocab, merges);
      ADD_FAILURE() << "accepted " << vocab << " / " << merges;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(part));
    }
  };
  expect_error(dir_ / "absent.json", dir_ / "merges.txt", "cannot open the vocab file " + dir_ / "absent.json");
  write_bytes(dir_ / "broken.json", "{\"a\": 0,");
  expect_error(dir_ / "broken.json", dir_ / "merges.txt", dir_ / "broken.json: not valid JSON");
  write_bytes(dir_ / "huge.json", "{\"a\": 18446744073709551615}");
  expect_error(dir_ / "huge.json", dir_ / "merges.txt", "token \"a\" has id 18446744073709551615, past any");
  write_bytes(dir_ / "no_eod.json", "{\"a\": 0}");
  expect_error(dir_ / "no_eod.json", dir_ / "merges.txt", "<|endoftext|>");
  write_bytes(dir_ / "gap.json", "{\"a\": 0, \"<|endoftext|>\": 5}");
  expect_error(dir_ / "gap.json", dir_ / "merges.txt", "ids must be distinct");
  write_bytes(dir_ / "text_id.json", "{\"a\": 0, \"b\": \"1\"}");
  expect_error(dir_ / "text_id.json", dir_ / "merges.txt",
               dir_ / "text_id.json: the id of token \"b\" is not an integer");
  write_bytes(dir_ / "nested.json", "{\"a\": {\"b\": 1}}");
  expect_error(dir_ / "nested.json", dir_ / "merges.txt", "the id of token \"a\" is not an integer");
  for (const std::string not_an_object : {"[\"a\", 0]", "7", "{}"}) {
    write_bytes(dir_ / "list.json", not_an_object);
    expect_error(dir_ / "list.json", dir_ / "merges.txt",
                 dir_ / "list.json: must be a non-empty JSON object of token -> id (GPT-2's encoder.json");
  }
  write_bytes(dir_ / "bad_merges.txt", "#version: 0.2\nh e\nonlyone\n");
  expect_error(dir_ / "vocab.json", dir_ / "bad_merges.txt", dir_ / "bad_merges.txt" + ":3");
  write_bytes(dir_ / "bad_merges.txt", "h e\r\n\r\nl\tl\n  \n");
  expect_error(dir_ / "vocab.json", dir_ / "bad_merges.txt", dir_ / "bad_merges.txt" + ":4: expected two");
  write_bytes(dir_ / "bad_merges.txt", "h e\nl l x\n");
  expect_error(dir_ / "vocab.json", dir_ / "bad_merges.txt", ":2: expected two space-separated symbols");
}

TEST(BuildTokenizerTest, NamesAndSuggestions) {
  const auto build = [](const std::string& type) {
    TokenizerConfig config;
    config.tokenizer_type = type;
    return build_tokenizer(config);
  };
  EXPECT_EQ(build("ByteLevel")->vocab_size(), 257);
  try {
    build("ByteLevl");
    FAIL() << "accepted a misspelt tokenizer type";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("did you mean ByteLevel?"));
  }
  // Names users type for a type suggest it, though spelling distance points elsewhere ("HFTokenizer" is two edits
  // from NullTokenizer); other cases and separators too.
  for (const auto& [typed_name, meant] :
       std::vector<std::pair<std::string, std::string>>{{"HFTokenizer", "HuggingFaceTokenizer"},
                                                        {"HuggingFace", "HuggingFaceTokenizer"},
                                                        {"hf", "HuggingFaceTokenizer"},
                                                        {"AutoTokenizer", "HuggingFaceTokenizer"},
                                                        {"huggingface_tokenizer", "HuggingFaceTokenizer"},
                                                        {"gpt2", "GPT2BPETokenizer"},
                                                        {"sentencepiece", "SentencePieceTokenizer"},
                                                        {"LlamaTokenizer", "Llama2Tokenizer"},
                                                        {"bytes", "ByteLevel"}}) {
    const std::string typed = typed_name;  // a lambda cannot capture a structured binding in C++17 (clang)
    EXPECT_THAT([&] { build(typed); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("did you mean " + meant + "?")))
        << typed;
  }
  // Each type names what it lacks, spelt as the caller spells fields.
  TokenizerConfig config;
  config.tokenizer_type = "HuggingFaceTokenizer";
  EXPECT_THAT([&] { validate_tokenizer_config(config, "--"); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("needs --tokenizer-model")));
  config.tokenizer_type = "NullTokenizer";
  EXPECT_THAT([&] { validate_tokenizer_config(config, "tokenizer."); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("needs tokenizer.vocab_size")));
  EXPECT_THROW(build("GPT2BPETokenizer"), std::invalid_argument);  // no vocab or merges
}

// Distinct words with distinct ids: word i is "w<i>" with ids {i, i + 1, ..., i % 5 more}.
std::string cache_word(int i) { return "w" + std::to_string(i); }
std::vector<int32_t> cache_ids(int i) {
  std::vector<int32_t> ids;
  for (int k = 0; k <= i % 5; ++k) ids.push_back(i + k);
  return ids;
}
std::vector<int64_t> found(const WordCache& cache, std::string_view word) {
  std::vector<int64_t> ids{-1};  // find appends
  if (!cache.find(word, ids)) return {};
  return std::vector<int64_t>(ids.begin() + 1, ids.end());
}
std::vector<int64_t> widened(const std::vector<int32_t>& ids) { return std::vector<int64_t>(ids.begin(), ids.end()); }

TEST(WordCacheTest, FindsEachWordsOwnIdsAndNothingElse) {
  WordCache cache;
  cache.insert("ab", {1, 2});
  cache.insert("abc", {3});
  cache.insert("abd", {4, 5, 6});
  cache.insert("ab", {9});  // already there: the first ids stay
  EXPECT_EQ(found(cache, "ab"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(found(cache, "abc"), (std::vector<int64_t>{3}));
  EXPECT_EQ(found(cache, "abd"), (std::vector<int64_t>{4, 5, 6}));
  std::vector<int64_t> ids;
  for (const std::string_view missing : {"a", "abcd", "ba", "Ab", ""})
    EXPECT_FALSE(cache.find(missing, ids)) << missing;
  const std::string long_word(WordCache::kMaxWordBytes, 'x');  // too long to cache: computed every time
  cache.insert(long_word, {7});
  EXPECT_FALSE(cache.find(long_word, ids));
  EXPECT_TRUE(ids.empty());
  int computed = 0;
  const auto compute = [&](std::string_view, std::vector<int32_t>& out) { out = {++computed}; };
  cache.append("new", ids, compute);
  cache.append("new", ids, compute);
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 1}));

  WordCache spaces;  // a word without ids (spaces alone, to SentencePiece) is cached too, as the first word as later
  spaces.insert("  ", {});
  spaces.insert("x", {5});
  spaces.insert("   ", {});
  for (const std::string_view word : {"  ", "   "}) {
    EXPECT_TRUE(spaces.find(word, ids)) << "'" << word << "'";
    std::thread([&] { EXPECT_TRUE(spaces.find(word, ids)) << "'" << word << "' from another thread"; }).join();
  }
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 1}));
}

// More words than a thread keeps, looked up from this thread, from another one and after this thread's table served
// a second cache: every word is found with its own ids (the shared shards hold what the thread tables do not).
TEST(WordCacheTest, EveryThreadFindsEveryWordPastItsOwnTable) {
  const int words = static_cast<int>(WordCache::kThreadWords) + 5000;
  WordCache cache;
  for (int i = 0; i < words; ++i) cache.insert(cache_word(i), cache_ids(i));
  const auto check_all = [&](const char* where) {
    int wrong = 0;
    for (int i = 0; i < words; ++i) wrong += found(cache, cache_word(i)) != widened(cache_ids(i));
    EXPECT_EQ(wrong, 0) << where;
  };
  check_all("this thread");
  std::thread([&] {
    check_all("another thread, twice");
    check_all("another thread, twice");
  }).join();
  WordCache other;
  other.insert("w1", {42});
  EXPECT_EQ(found(other, "w1"), (std::vector<int64_t>{42}));
  check_all("this thread, after a second cache");
  EXPECT_EQ(found(other, "w1"), (std::vector<int64_t>{42}));
}

// Four threads at once, each inserting and looking up the same words in its own order, past its own table's size:
// every lookup that finds a word finds that word's ids, and at the end every thread finds every word.
TEST(WordCacheTest, ThreadsFillAndReadOneCacheAtOnce) {
  const int words = static_cast<int>(WordCache::kThreadWords) + 20000;
  WordCache cache;
  std::atomic<int> wrong{0}, missing{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < words; ++k) {
        const int i = (k * 7919 + t * 104729) % words;  // a different order in each thread
        std::vector<int64_t> ids;
        if (cache.find(cache_word(i), ids)) {
          wrong += ids != widened(cache_ids(i));
        } else {
          cache.insert(cache_word(i), cache_ids(i));
        }
      }
      for (int i = 0; i < words; ++i) {
        const std::vector<int64_t> ids = found(cache, cache_word(i));
        missing += ids.empty();
        wrong += !ids.empty() && ids != widened(cache_ids(i));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(missing, 0);
}

}  // namespace
}  // namespace bridge::training::tokenizers
