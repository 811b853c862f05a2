// Sentence splitting for bridge-preprocess-data --split-sentences. Megatron-LM uses NLTK's Punkt model, whose trained
// parameters no Debian package ships, so bridge splits by a fixed rule instead, close to Punkt's on ordinary prose:
//
//   A sentence ends after a run of '.', '!' or '?' (and any closing quotes or brackets right after it) that is
//   followed by whitespace and then by a character that is not a lowercase ASCII letter, except after an
//   abbreviation: a single letter ("J. R. R. Tolkien") or one of Mr Mrs Ms Dr Prof Sr Jr St Mt vs etc e.g i.e cf
//   al Inc Ltd Co No Fig (any case).
//
// The whitespace between two sentences is dropped, or kept at the end of the earlier sentence with `keep_newlines`
// (Megatron's --keep-newlines, which keeps newlines that way); text before the first sentence end is the first
// sentence, leading whitespace included, and whatever follows the last end is the last.
//
//   split_sentences("Hi there. Dr. Who is here!\n\nBye.", false);  // {"Hi there.", "Dr. Who is here!", "Bye."}
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace bridge::training::datasets {

std::vector<std::string> split_sentences(std::string_view text, bool keep_newlines);

}  // namespace bridge::training::datasets
