// The generated fables of the default corpus and their one-time conversion to a Megatron indexed dataset.
//
// Each fable picks two characters of a fixed cast and one of five plots. What a model can learn, from easy to hard:
// English spelling and punctuation; the plots' sentence patterns; each character's fixed kind, home, food and
// manner (the same in every fable); which moral goes with which plot; and sums of two small numbers.
#include "tools/tiny_corpus.h"

#include <cstdint>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include "training/datasets/indexed_dataset.h"
#include "training/tokenizers/byte_level_tokenizer.h"
#include "utils/logging.h"

namespace bridge::tools {
namespace {

namespace fs = std::filesystem;

// Bump when the text changes, so caches from an older generator are not reused.
constexpr std::string_view kVersion = "v1";
constexpr int kNumDocuments = 1500;
constexpr uint32_t kSeed = 20240601;

struct Character {
  std::string_view name, kind, home, food, manner;
};

constexpr Character kCast[] = {
    {"Pip", "mouse", "in a hole under the old mill", "cheese", "small but brave"},
    {"Bella", "cow", "in the green meadow by the river", "sweet grass", "slow and kind"},
    {"Rufus", "fox", "in a den at the edge of the forest", "berries", "clever and sly"},
    {"Tess", "tortoise", "under the big oak tree", "lettuce", "patient"},
    {"Hugo", "hare", "in the tall grass on the hill", "carrots", "quick and proud"},
    {"Olive", "owl", "in the hollow of an elm", "beetles", "wise"},
    {"Max", "dog", "in a red kennel behind the farm", "bones", "loyal"},
    {"Luna", "cat", "on the warm roof of the bakery", "fish", "curious"},
    {"Bruno", "bear", "in a cave in the mountains", "honey", "strong and gentle"},
    {"Daisy", "duck", "by the pond near the village", "bread crumbs", "cheerful"},
    {"Sam", "squirrel", "in a nest at the top of the pine", "acorns", "busy"},
    {"Gus", "goat", "on the rocky cliffs", "thistles", "stubborn"},
};

constexpr std::string_view kPlaces[] = {"the market",  "the river",  "the village", "the old bridge",
                                        "the orchard", "the forest", "the hill",    "the farm"};
constexpr std::string_view kDays[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
constexpr std::string_view kWeather[] = {"the sun was shining", "it was raining", "a cold wind was blowing",
                                         "the sky was grey", "the snow was falling"};
constexpr std::string_view kNumbers[] = {"zero",     "one",     "two",     "three",     "four",    "five",   "six",
                                         "seven",    "eight",   "nine",    "ten",       "eleven",  "twelve", "thirteen",
                                         "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"};
constexpr std::string_view kThings[] = {"a blue hat", "a silver key", "a little bell", "a red scarf", "a wooden spoon"};
constexpr std::string_view kHidingPlaces[] = {"under a stone", "behind the barn", "in the reeds",
                                              "under a pile of leaves", "next to the well"};

// Draws from std::mt19937 directly (its sequence is fixed by the standard; the distributions are not).
class Picker {
 public:
  explicit Picker(uint32_t seed) : generator_(seed) {}
  std::size_t index(std::size_t size) { return generator_() % size; }
  template <class T, std::size_t N>
  const T& pick(const T (&items)[N]) {
    return items[index(N)];
  }

 private:
  std::mt19937 generator_;
};

std::string capitalized(std::string_view text) {
  std::string result(text);
  if (!result.empty() && result[0] >= 'a' && result[0] <= 'z') result[0] = static_cast<char>(result[0] - 'a' + 'A');
  return result;
}

std::string intro(const Character& a, Picker& picker) {
  std::string text = "Once upon a time, " + std::string(a.name) + " the " + std::string(a.kind) + " lived " +
                     std::string(a.home) + ". " + std::string(a.name) + " was " + std::string(a.manner) +
                     ", and liked " + std::string(a.food) + " more than anything. ";
  text += "One " + std::string(picker.pick(kDays)) + " morning, " + std::string(picker.pick(kWeather)) + ". ";
  return text;
}

std::string fable(Picker& picker) {
  const Character& a = picker.pick(kCast);
  const Character* other = &picker.pick(kCast);
  while (other == &a) other = &picker.pick(kCast);
  const Character& b = *other;
  const std::string an(a.name), bn(b.name), place(picker.pick(kPlaces));

  std::string title, body, moral;
  switch (picker.index(5)) {
    case 0:  // sharing
      title = "The " + capitalized(a.kind) + " Who Shared";
      body = an + " went to " + place + " to look for " + std::string(a.food) + ". On the way, " + an + " met " + bn +
             " the " + std::string(b.kind) + ", who looked sad. \"What is wrong, " + bn + "?\" asked " + an +
             ". \"I cannot find any " + std::string(b.food) + ", and I am hungry,\" said " + bn + ". So " + an +
             " shared the " + std::string(a.food) + " with " + bn + ", and they ate together at " + place + ".";
      moral = "A friend in need is a friend indeed.";
      break;
    case 1: {  // a race
      title = "The Race to " + capitalized(place.substr(4));
      body = an + " said to " + bn + ", \"I can run to " + place + " faster than you.\" \"We shall see,\" said " + bn +
             ". They started at the same time. " + an + " ran ahead, then stopped to eat some " + std::string(a.food) +
             " and fell asleep. " + bn + " kept going, step by step, and reached " + place + " first.";
      moral = "Slow and steady wins the race.";
      break;
    }
    case 2: {  // counting
      const std::size_t x = 1 + picker.index(9), y = 1 + picker.index(9);
      title = capitalized(a.name) + " Counts";
      body = an + " went to " + place + " and found " + std::string(kNumbers[x]) + " pieces of " + std::string(a.food) +
             ". Then " + bn + " the " + std::string(b.kind) + " brought " + std::string(kNumbers[y]) +
             " more. \"How many do we have now?\" asked " + bn + ". " + an + " counted them and said, \"" +
             capitalized(kNumbers[x]) + " and " + std::string(kNumbers[y]) + " make " + std::string(kNumbers[x + y]) +
             ".\" " + std::to_string(x) + " + " + std::to_string(y) + " = " + std::to_string(x + y) + ".";
      moral = "Many small things make a big one.";
      break;
    }
    case 3:  // the storm
      title = "The Storm";
      body = "That night a great storm came, and the home of " + bn + " the " + std::string(b.kind) + " " +
             std::string(b.home) + " was broken. In the morning " + an + " came to help. Together they worked all " +
             "day, and by evening the home of " + bn + " was whole again. " + bn + " thanked " + an + " with some " +
             std::string(b.food) + ".";
      moral = "Many hands make light work.";
      break;
    default: {  // the lost thing
      const std::string thing(picker.pick(kThings)), spot(picker.pick(kHidingPlaces));
      title = "The Lost " + capitalized(thing.substr(thing.find(' ') + 1));
      body = bn + " the " + std::string(b.kind) + " had lost " + thing + " near " + place + ". " + an +
             " said, \"I will help you look.\" They looked everywhere, and at last " + an + " found " + thing + " " +
             spot + ". " + bn + " was very happy.";
      moral = "Two pairs of eyes see more than one.";
      break;
    }
  }
  return title + "\n\n" + intro(a, picker) + body + "\nThe moral: " + moral + "\n";
}

}  // namespace

std::vector<std::string> tiny_corpus_documents() {
  Picker picker(kSeed);
  std::vector<std::string> documents;
  documents.reserve(kNumDocuments);
  for (int i = 0; i < kNumDocuments; ++i) documents.push_back(fable(picker));
  return documents;
}

fs::path default_data_dir() {
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache) return fs::path(cache) / "bridge";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "bridge";
  return fs::current_path() / "bridge-data";
}

namespace {

// The corpus as the builder stores it: each fable byte-tokenized, with Megatron's --append-eod.
std::vector<std::vector<int64_t>> tiny_corpus_tokens(const training::tokenizers::ByteLevelTokenizer& tokenizer) {
  std::vector<std::vector<int64_t>> documents;
  for (const std::string& document : tiny_corpus_documents()) {
    documents.push_back(tokenizer.encode(document));
    documents.back().push_back(tokenizer.eod());
  }
  return documents;
}

// Why the prepared files at `prefix` are not the corpus, or empty when they are (every token compared: 0.6 M).
std::string damage_of(const std::string& prefix, const std::vector<std::vector<int64_t>>& expected) {
  try {
    const training::datasets::IndexedDataset dataset(prefix);
    if (dataset.size() != static_cast<int64_t>(expected.size())) {
      return "it has " + std::to_string(dataset.size()) + " documents instead of " + std::to_string(expected.size());
    }
    for (std::size_t i = 0; i < expected.size(); ++i) {
      if (dataset.get(static_cast<int64_t>(i)) != expected[i]) return "document " + std::to_string(i) + " differs";
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

std::string prepare_tiny_corpus(const fs::path& dir) {
  const std::string prefix =
      (dir / (std::string(kTinyCorpusName) + "_" + std::string(kVersion) + "_text_document")).string();
  const training::tokenizers::ByteLevelTokenizer tokenizer;
  const std::vector<std::vector<int64_t>> documents = tiny_corpus_tokens(tokenizer);
  // finalize() renames the .bin before the .idx, so a present .idx means a complete dataset, unless something
  // changed it since: the files are checked against the corpus and written again when they differ.
  std::error_code error;
  if (fs::exists(prefix + ".idx", error)) {
    const std::string damage = damage_of(prefix, documents);
    if (damage.empty()) return prefix;
    bridge::utils::logger().warn("the prepared embedded corpus {}.bin/.idx is damaged ({}); writing it again", prefix,
                                 damage);
  }
  fs::create_directories(dir, error);
  if (error) {
    throw std::runtime_error("cannot create the data folder " + dir.string() + ": " + error.message() +
                             " (set XDG_CACHE_HOME to a writable folder)");
  }
  try {
    training::datasets::IndexedDatasetBuilder builder(prefix,
                                                      training::datasets::optimal_dtype(tokenizer.vocab_size()));
    for (const std::vector<int64_t>& tokens : documents) builder.add_document(tokens);
    builder.finalize();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + "; the embedded corpus is prepared in " + dir.string() +
                             " (set XDG_CACHE_HOME to another folder)");
  }
  return prefix;
}

}  // namespace bridge::tools
