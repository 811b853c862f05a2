// Loading tokenizer.json (and the BOS/EOS names beside it) and running tokenizers' encode and decode pipelines.
#include "training/tokenizers/huggingface_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "training/tokenizers/added_vocabulary.h"
#include "training/tokenizers/bpe_model.h"
#include "training/tokenizers/hf_components.h"
#include "training/tokenizers/utf8.h"

namespace bridge::training::tokenizers {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::invalid_argument("HuggingFaceTokenizer: cannot open " + file.string());
  std::ostringstream content;
  content << in.rdbuf();
  try {
    return nlohmann::json::parse(content.str());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("HuggingFaceTokenizer: " + file.string() + " is not valid JSON: " + e.what());
  }
}

// A token named in tokenizer_config.json / special_tokens_map.json: a string, or an AddedToken object.
std::optional<std::string> token_name(const nlohmann::json& config, const char* key) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return std::nullopt;
  if (found->is_string()) return found->get<std::string>();
  if (found->is_object() && found->contains("content") && (*found)["content"].is_string()) {
    return (*found)["content"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<std::string> optional_string(const nlohmann::json& object, const std::string& path, const char* name) {
  const auto found = object.find(name);
  if (found == object.end() || found->is_null()) return std::nullopt;
  if (!found->is_string()) throw hf::unsupported(path + "." + name, "expected a string or null");
  return found->get<std::string>();
}

std::unique_ptr<BpeModel> make_model(const nlohmann::json& model, const std::string& path) {
  // A model without "type" is read by its fields, as the library's untagged fallback does (old files).
  const std::string type = model.is_object() && !model.contains("type") && model.contains("merges")
                               ? std::string("BPE")
                               : hf::type_of(model, path);
  if (type != "BPE") {
    throw hf::unsupported(path + ".type", "the model \"" + type +
                                              "\" is not implemented (bridge runs BPE tokenizer.json files; a "
                                              "SentencePiece Unigram model loads as SentencePieceTokenizer from its "
                                              "tokenizer.model)");
  }
  hf::only_keys(model, path,
                {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback",
                 "ignore_merges", "vocab", "merges"});
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0) {
    throw hf::unsupported(path + ".dropout",
                          "BPE dropout samples different ids on each call, which pretraining "
                          "data does not want; set it to null");
  }
  const nlohmann::json& vocab_json = hf::field(model, path, "vocab");
  if (!vocab_json.is_object()) throw hf::unsupported(path + ".vocab", "expected an object of token -> id");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw hf::unsupported(path + ".vocab[\"" + token + "\"]", "the id must be a non-negative integer");
    }
    vocab.emplace(token, static_cast<int32_t>(id.get<int64_t>()));
  }
  const nlohmann::json& merges_json = hf::field(model, path, "merges");
  if (!merges_json.is_array()) throw hf::unsupported(path + ".merges", "expected a list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (std::size_t i = 0; i < merges_json.size(); ++i) {
    const nlohmann::json& merge = merges_json[i];
    if (merge.is_string()) {  // "a b", as files written before tokenizers 0.20
      const std::string text = merge.get<std::string>();
      if (text.rfind("#version", 0) == 0) continue;  // a merges.txt header kept in the list, which the library skips
      const std::size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw hf::unsupported(path + ".merges[" + std::to_string(i) + "]",
                              "expected \"first second\" (one space), got \"" + text + "\"");
      }
      merges.emplace_back(text.substr(0, space), text.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      throw hf::unsupported(path + ".merges[" + std::to_string(i) + "]",
                            "expected \"first second\" or [\"first\", \"second\"], got " + merge.dump());
    }
  }
  BpeOptions options;
  options.unk_token = optional_string(model, path, "unk_token");
  options.continuing_subword_prefix = optional_string(model, path, "continuing_subword_prefix");
  options.end_of_word_suffix = optional_string(model, path, "end_of_word_suffix");
  options.fuse_unk = hf::bool_field(model, path, "fuse_unk", false);
  options.byte_fallback = hf::bool_field(model, path, "byte_fallback", false);
  options.ignore_merges = hf::bool_field(model, path, "ignore_merges", false);
  return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options), path);
}

std::vector<AddedToken> read_added_tokens(const nlohmann::json& list, const std::string& path) {
  std::vector<AddedToken> tokens;
  if (list.is_null()) return tokens;
  if (!list.is_array()) throw hf::unsupported(path, "expected a list of added tokens");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string item = path + "[" + std::to_string(i) + "]";
    const nlohmann::json& entry = list[i];
    if (!entry.is_object()) throw hf::unsupported(item, "expected an object");
    AddedToken token;
    token.content = hf::string_field(entry, item, "content");
    const nlohmann::json& id = hf::field(entry, item, "id");
    if (!id.is_number_integer() || id.get<int64_t>() < 0) throw hf::unsupported(item + ".id", "expected an id >= 0");
    token.id = id.get<int64_t>();
    token.special = hf::bool_field(entry, item, "special", false);
    token.single_word = hf::bool_field(entry, item, "single_word", false);
    token.lstrip = hf::bool_field(entry, item, "lstrip", false);
    token.rstrip = hf::bool_field(entry, item, "rstrip", false);
    token.normalized = hf::bool_field(entry, item, "normalized", !token.special);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

}  // namespace

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& path) : path_(path) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::exists(file)) {
    throw std::invalid_argument(
        "HuggingFaceTokenizer: no " + file.string() +
        "; give the directory of a Hugging Face model (with tokenizer.json) or the file itself");
  }
  const std::string where = file.string();
  const nlohmann::json root = read_json(file);
  if (!root.is_object()) throw std::invalid_argument("HuggingFaceTokenizer: " + where + " is not a JSON object");
  if (!root.contains("model")) {  // another of a model's JSON files: config.json, tokenizer_config.json, ...
    const fs::path beside = file.parent_path() / "tokenizer.json";
    const bool model_config = root.contains("architectures") || root.contains("model_type");
    throw std::invalid_argument("HuggingFaceTokenizer: " + where + " is not a tokenizer.json (it has no \"model\"" +
                                (model_config ? "; it is a model's config.json" : "") +
                                "); give the model's directory" +
                                (fs::exists(beside) && beside != file ? " or its tokenizer file " + beside.string()
                                                                      : ", or the tokenizer.json file itself") +
                                " (--tokenizer-model, tokenizer.tokenizer_model)");
  }
  try {
    hf::only_keys(root, "tokenizer.json",
                  {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
                   "decoder", "model"});
    for (const char* key : {"truncation", "padding"}) {
      if (root.contains(key) && !root[key].is_null()) {
        throw hf::unsupported(key, "bridge tokenizes whole documents; set it to null");
      }
    }
    if (root.contains("normalizer") && !root["normalizer"].is_null()) {
      normalizer_ = hf::make_normalizer(root["normalizer"], "normalizer");
    }
    if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
      pre_tokenizer_ = hf::make_pre_tokenizer(root["pre_tokenizer"], "pre_tokenizer");
    }
    model_ = make_model(hf::field(root, "tokenizer.json", "model"), "model");
    if (root.contains("post_processor") && !root["post_processor"].is_null()) {
      post_processor_ = hf::make_post_processor(root["post_processor"], "post_processor");
    }
    if (root.contains("decoder") && !root["decoder"].is_null()) decoder_ = hf::make_decoder(root["decoder"], "decoder");
    added_ = std::make_unique<AddedVocabulary>(
        settle_added_tokens(read_added_tokens(root.value("added_tokens", nlohmann::json()), "added_tokens")));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("HuggingFaceTokenizer: " + where + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong JSON type somewhere
    throw std::invalid_argument("HuggingFaceTokenizer: " + where + ": a field has the wrong type: " + e.what());
  }

  // len(tokenizer): the model's entries and the distinct added tokens that are not among them.
  vocab_size_ = model_->entries();
  int64_t largest = model_->size() - 1;
  std::unordered_set<std::string> counted;
  for (const AddedToken& token : added_->tokens()) {
    if (!model_->token_to_id(token.content) && counted.insert(token.content).second) ++vocab_size_;
    largest = std::max(largest, token.id);
  }
  if (largest >= vocab_size_) {
    throw std::invalid_argument("HuggingFaceTokenizer: " + where + ": the ids are not contiguous (id " +
                                std::to_string(largest) + " in a vocabulary of " + std::to_string(vocab_size_) +
                                "); bridge sizes embeddings and token files by the vocabulary size");
  }
  if (post_processor_) {
    for (const int64_t id : post_processor_->process({})) {
      if (id < 0 || id >= vocab_size_) {
        throw std::invalid_argument("HuggingFaceTokenizer: " + where + ": post_processor adds the id " +
                                    std::to_string(id) + ", which is not in the vocabulary (" +
                                    std::to_string(vocab_size_) + " ids)");
      }
    }
  }

  // BOS and EOS as transformers names them: tokenizer_config.json, else special_tokens_map.json.
  const fs::path directory = file.parent_path();
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path config_file = directory / name;
    if (!fs::exists(config_file)) continue;
    const nlohmann::json config = read_json(config_file);
    const auto resolve = [&](const char* key) -> std::optional<int64_t> {
      const auto token = token_name(config, key);
      if (!token) return std::nullopt;
      if (const AddedToken* added = added_->find(*token)) return added->id;
      if (const auto id = model_->token_to_id(*token)) return *id;
      throw std::invalid_argument("HuggingFaceTokenizer: " + config_file.string() + ": the " + key + " \"" + *token +
                                  "\" is not in " + where);
    };
    if (!bos_) bos_ = resolve("bos_token");
    if (!eos_) eos_ = resolve("eos_token");
  }
}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

std::vector<AddedToken> HuggingFaceTokenizer::settle_added_tokens(std::vector<AddedToken> tokens) const {
  // tokenizers ignores the ids in the file: a token the model has keeps the model's id, another takes the next id
  // past both the model's entries and the added tokens so far (the same ids for any file the library wrote).
  std::unordered_map<std::string, int64_t> assigned;
  int64_t largest_added = -1;
  tokens.erase(std::remove_if(tokens.begin(), tokens.end(), [](const AddedToken& t) { return t.content.empty(); }),
               tokens.end());  // the library ignores a token without content
  for (AddedToken& token : tokens) {
    if (const auto earlier = assigned.find(token.content); earlier != assigned.end()) {
      token.id = earlier->second;
    } else if (const auto id = model_->token_to_id(token.content)) {
      token.id = *id;
    } else {
      token.id = std::max(model_->entries(), largest_added + 1);
    }
    assigned.emplace(token.content, token.id);
    largest_added = std::max(largest_added, token.id);
    token.form = token.content;
    if (token.normalized && normalizer_) normalizer_->normalize(token.form);
  }
  return tokens;
}

int64_t HuggingFaceTokenizer::eod() const {
  if (!eos_) {
    // A tokenizer trained with the tokenizers library (its quicktour's, for one) has no EOS until transformers'
    // files name one: say how to name one of its special tokens, or add a new one.
    // Absolute paths, so that the command to copy names a real folder also for a bare file name ("tok.json").
    const fs::path file = fs::absolute(fs::is_directory(path_) ? fs::path(path_) / "tokenizer.json" : fs::path(path_));
    const fs::path directory = file.parent_path();
    std::string specials, example = "</s>";
    for (const AddedToken& token : added_->tokens()) {
      if (!token.special) continue;
      specials += (specials.empty() ? "" : ", ") + token.content;
      std::string lower = token.content;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      for (const char* ending : {"end", "eos", "</s>", "sep"}) {
        if (lower.find(ending) != std::string::npos && example == "</s>") example = token.content;
      }
    }
    throw std::logic_error(
        "HuggingFaceTokenizer " + path_ +
        ": no eos_token in tokenizer_config.json or special_tokens_map.json, so there is no end-of-document id. Name "
        "one of its tokens in " +
        (directory / "tokenizer_config.json").string() + ", e.g. {\"eos_token\": \"" + example + "\"}" +
        (specials.empty() ? "" : " (its special tokens: " + specials + ")") +
        ", or add a new one with transformers: PreTrainedTokenizerFast(tokenizer_file=\"" + file.string() +
        "\", eos_token=\"</s>\").save_pretrained(\"" + directory.string() +
        "\") (docs/tokenizers.md, \"Your own tokenizer\")");
  }
  return *eos_;
}

std::vector<int64_t> HuggingFaceTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  utf8::require_valid(text, "HuggingFaceTokenizer");
  std::vector<int64_t> ids;
  std::vector<AddedVocabulary::Segment> raw, normalized;
  std::vector<hf::Piece> pieces;
  std::string piece;
  added_->split(text, false, raw);
  for (const AddedVocabulary::Segment& segment : raw) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    if (segment.end == segment.begin) continue;
    piece.assign(text.substr(segment.begin, segment.end - segment.begin));
    if (normalizer_) normalizer_->normalize(piece);
    added_->split(piece, true, normalized);
    for (const AddedVocabulary::Segment& part : normalized) {
      if (part.id >= 0) {
        ids.push_back(part.id);
        continue;
      }
      if (part.end == part.begin) continue;
      pieces.clear();
      pieces.push_back({piece.substr(part.begin, part.end - part.begin), segment.begin == 0 && part.begin == 0});
      if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(pieces);
      for (const hf::Piece& word : pieces) model_->tokenize(word.text, ids);
    }
  }
  if (add_special_tokens && post_processor_) ids = post_processor_->process(std::move(ids));
  return ids;
}

std::string HuggingFaceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int64_t id : ids) {
    if (const AddedToken* added = added_->find(id)) {
      tokens.push_back(added->form);
    } else if (const std::string* token = model_->id_to_token(id)) {
      tokens.push_back(*token);
    } else {
      throw std::out_of_range("HuggingFaceTokenizer::decode: id " + std::to_string(id) + " is not in the vocabulary (" +
                              std::to_string(vocab_size_) + " ids)");
    }
  }
  if (!decoder_) {  // the library joins the tokens with spaces
    std::string joined;
    for (std::size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  decoder_->decode_chain(tokens);
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace bridge::training::tokenizers
