// The corpus bridge-pretrain trains on by default: short generated fables with learnable structure at every level
// (spelling, grammar, each character's fixed home, food and manner, and small sums), written once as a Megatron
// indexed dataset in a cache folder. The text is produced by this code from a fixed seed, so it is the same on every
// machine and has no licence of its own (it is part of bridge).
//
//   std::string prefix = prepare_tiny_corpus(default_data_dir());  // ".../tiny_fables_v1_text_document"
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace bridge::tools {

/// The name recipes use for the embedded corpus: `dataset.data_path: [builtin:tiny_fables]`.
inline constexpr const char* kTinyCorpusName = "tiny_fables";
/// The prefix of data_path entries naming a corpus shipped with bridge.
inline constexpr const char* kBuiltinPrefix = "builtin:";

/// The corpus's documents, one fable each (about 1500 documents, 0.6 MB of ASCII).
std::vector<std::string> tiny_corpus_documents();

/// Where prepared corpora are kept: $XDG_CACHE_HOME/bridge, else $HOME/.cache/bridge, else ./bridge-data.
std::filesystem::path default_data_dir();

/// Writes the corpus, byte-level tokenized with an end-of-document token after each fable, as
/// `<dir>/tiny_fables_v1_text_document.{bin,idx}` unless it is already there, and returns that prefix. Files already
/// there are compared with the corpus token by token and written again (with a warning) when they differ. Safe when
/// several ranks call it at once: each writes private temporaries and renames them into place.
std::string prepare_tiny_corpus(const std::filesystem::path& dir);

}  // namespace bridge::tools
