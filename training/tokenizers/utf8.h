// UTF-8 helpers for the tokenizers: decoding one code point, appending one, validating, and the lossy conversion
// that Rust's String::from_utf8_lossy and Python's bytes.decode(errors="replace") make (one U+FFFD per maximal
// ill-formed subsequence), so that decoded text matches the reference libraries byte for byte.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace bridge::training::tokenizers::utf8 {

/// Appends the UTF-8 encoding of code point `c` (at most U+10FFFF) to `out`.
void append(char32_t c, std::string& out);

/// Decodes the code point that starts at text[i] into `c` and moves i past it. Returns false, leaving i and c
/// alone, when the bytes there are not well-formed UTF-8 (overlong forms, surrogates and values past U+10FFFF
/// included).
bool next(std::string_view text, std::size_t& i, char32_t& c);

/// The byte offset of the first ill-formed sequence in `text`, or std::string_view::npos when it is all UTF-8.
std::size_t first_invalid(std::string_view text);

/// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD (the Unicode Standard's recommended practice,
/// as Rust's from_utf8_lossy and Python's "replace" error handler).
std::string lossy(std::string_view bytes);

/// Throws std::invalid_argument "<who>: the text is not valid UTF-8 at byte N; ..." unless `text` is UTF-8.
void require_valid(std::string_view text, std::string_view who);

}  // namespace bridge::training::tokenizers::utf8
