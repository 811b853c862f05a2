#!/usr/bin/env python3
"""Reference tokenizers for bridge's tokenizer tests, made on the fly by the real libraries (nothing downloaded).

Usage: tokenizer_references.py make DIR

Trains small tokenizers with Hugging Face `tokenizers` and `sentencepiece` on a generated corpus and saves them as
those libraries do, each in DIR/<name>/, shaped like the files of the models people pretrain:
  llama3      byte-level BPE, Llama-3's split pattern, <|begin_of_text|> BOS by TemplateProcessing, ignore_merges
  qwen2       byte-level BPE, NFC, Qwen2's split pattern (one digit a piece), <|endoftext|> and chat specials
  llama2      BPE with byte_fallback and <unk> (Llama-2/Mistral's converted files): Prepend + Replace normalizers
  mistral     the same model with a Metaspace pre-tokenizer (prepend_scheme "first"), as newer conversions write it
  exotic      a pipeline of the rarer stages: NFKD, StripAccents, Lowercase, Replace and Strip normalizers,
              WhitespaceSplit, Digits and Split behaviours, Metaspace with split, <unk>, and added tokens with lstrip,
              rstrip, single_word and normalized
  roberta     byte-level BPE with add_prefix_space and GPT-2's own split, RobertaProcessing, an lstrip <mask>, an
              rstrip <m> beside a " \n" token
  quicktour   the tokenizers quicktour's: a BPE with [UNK] and BERT's specials, the Whitespace pre-tokenizer,
              trained from a file and saved with tokenizer.save (no tokenizer_config.json: it names no EOS)
  words       Split patterns with \\w and \\W in and out of classes (Oniguruma's word characters, not PCRE2's)
  sp_unigram  a SentencePiece unigram model (tokenizer.model)
  sp_bpe      a SentencePiece BPE model with byte fallback
Then DIR/hard_text.json: a few thousand lines of hard text (mixed scripts, emoji, digit and whitespace runs,
contractions in any case, special tokens inside text, combining marks), and DIR/<name>/expected.json: for each line
the library's ids (without and with the tokenizer's own special tokens) and its decode of them. DIR is written aside
and renamed into place, so a reader never sees half of it; an existing DIR is left as it is.
"""
import json
import os
import random
import shutil
import sys

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for that with as on by at from his her it an were are which this be or has had "
         "not but also first one their its new after who they have two been other all would more during there "
         "time world state year city school national people university part known over most may history music "
         "between where united such about series only later years since team including area when used then").split()
SCRIPTS = [
    "中华人民共和国 北京 上海 机器学习 语言模型 训练数据",
    "日本語のテキスト、ひらがなとカタカナ。東京都",
    "한국어 문장입니다 서울특별시",
    "Русский текст: Москва, Санкт-Петербург. ЁЛКА",
    "Ελληνικά: ΟΔΥΣΣΕΥΣ οδυσσευς σοφός",
    "العربية: مرحبا بالعالم ١٢٣٤٥",
    "עברית: שלום עולם",
    "हिन्दी: नमस्ते दुनिया क्षत्रिय",
    "ไทย: สวัสดีชาวโลก",
    "Tiếng Việt: Xin chào thế giới",
    "Deutsch: Straße, Größe, Ärger, Übermaß",
    "français: déjà vu, garçon, œuvre, naïve",
    "español: ¿Qué tal? ¡Olé! año",
]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇩🇪", "❤️", "🧑🏿‍🚀", "🤖", "☕", "✔️", "🏳️‍🌈", "🐍"]
WHITESPACE = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u0085",
              "\x0b", "\x0c", "\u2003", "   \n\n   "]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>",
            "<unk>", "<|endoftext|", "<|begin_of_text|><|begin_of_text|>", "< s>", "<0x41>", " <mask> ",
            "  <mask>", "<mask>x"]
NUMBERS = ["12345678901234567890", "3.14159", "1,000,000", "2024-11-26", "0x7FFF", "١٢٣", "１２３４", "²³", "Ⅻ",
           "½", "42", "007", "9999999999999"]
HARD = ["I'M", "we'LL", "don't", "It's", "they'VE", "she'D", "'s", "O'Neil", "rock'n'roll", "e\u0301te\u0301",
        "\u212bngstr\u00f6m", "ﬁne ﬂow", "Ｆｕｌｌｗｉｄｔｈ", "①②③", "x\u0000y", "\x01\x7f", "naïve café",
        "def f(x):\n    return x ** 2", "if (a && b) { c++; }", "https://example.com/a?b=c&d=e#f",
        "user@example.org", "!!!???...", "---", "((()))", "$100.00", "#hashtag", "@mention", "C++", "a.b.c",
        "\u200b", "Ǆ", "ΣΑΣ", "İstanbul"]


def hard_line(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.35:
            parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))))
        elif kind < 0.5:
            parts.append(rng.choice(SCRIPTS)[rng.randint(0, 5):])
        elif kind < 0.58:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.7:
            parts.append(rng.choice(WHITESPACE))
        elif kind < 0.78:
            parts.append(rng.choice(SPECIALS))
        elif kind < 0.86:
            parts.append(rng.choice(NUMBERS))
        else:
            parts.append(rng.choice(HARD))
        if rng.random() < 0.6:
            parts.append(rng.choice([" ", "", ", ", ". ", "\n"]))
    return "".join(parts)


def hard_text():
    rng = random.Random(31)
    lines = [hard_line(rng) for _ in range(2500)]
    # Edge cases by hand: empty, only whitespace, only specials, a long run of each kind.
    lines += ["", " ", "\n", "   ", "<|endoftext|>", " <|endoftext|> ", "a" * 300, "1" * 100, " " * 50 + "x",
              "\n" * 20, "😀" * 40, "ab" * 200, "<s>" * 5, "▁", "▁▁ ▁", "<0x0A>",
              # U+180E is not White_Space (Oniguruma, Rust) though PCRE2's \s takes it; joiners, marks and
              # superscripts around a single_word token; an rstrip token before a whitespace token.
              "a \u180e\u180eb", "\u180e\u180e\u180ea", "a\u180eb c", "\u200dthe", "the\u200c", "\u0301the x",
              "x²the", "<m> \nx", "a<m>\n\nb", "<m>  \n",
              # Where SentencePiece's words start and end when whitespace is kept (Llama-2's models) or folded.
              "a ", "a  ", " a", "  a b  ", "x  y   z ", "a\t b", " \t ", "1 2  3 ", "é  ü ", "a \n b"]
    return lines


def corpus():
    rng = random.Random(7)
    text = [hard_line(rng) for _ in range(3000)]
    for path in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text += f.read().splitlines()
    return text


def byte_level_bpe(pattern, normalizer, specials, bos, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE(ignore_merges=bos is not None))
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def byte_fallback_bpe(metaspace):
    """Llama-2/Mistral's shape: SentencePiece-style pieces with '▁', byte fallback tokens <0x00>..<0xFF> in the model's
    vocabulary (ids 3..258, after <unk> <s> </s>), and <s> as BOS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    bytes_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"] + bytes_tokens,
                                  show_progress=False, limit_alphabet=400)
    tokenizer.train_from_iterator(corpus(), trainer)
    state = json.loads(tokenizer.to_str())
    # The byte tokens belong to the model's vocabulary, not to the added tokens (which would match "<0x41>" in text).
    state["added_tokens"] = [t for t in state["added_tokens"] if t["content"] not in bytes_tokens]
    if metaspace:
        state["normalizer"] = None
        state["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False).__getstate__())
        state["decoder"] = json.loads(decoders.Sequence([
            decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)]).__getstate__())
    else:
        state["normalizer"] = json.loads(normalizers.Sequence([
            normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]).__getstate__())
        state["pre_tokenizer"] = None
        state["decoder"] = json.loads(decoders.Sequence([
            decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(" ", 1, 0)]).__getstate__())
    tokenizer = Tokenizer.from_str(json.dumps(state))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    return tokenizer


def exotic():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[\t\x{3000}]+"), " "), normalizers.Strip(left=True, right=True)])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[-/]"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[()\[\]{}]+"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[\p{L}\p{N}]+"), behavior="merged_with_next", invert=True),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)])
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<mask>"], show_progress=False,
                                  limit_alphabet=300)
    tokenizer.train_from_iterator(corpus(), trainer)
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
    tokenizer.add_tokens([AddedToken("the", single_word=True, normalized=True),
                          AddedToken("ÉTÉ", normalized=True),
                          AddedToken("<s>", lstrip=True, normalized=False)])
    return tokenizer


def roberta():
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    # An rstrip token and a whitespace token that starts inside what it strips: the library emits both.
    tokenizer.add_tokens([AddedToken("<m>", rstrip=True, normalized=False), AddedToken(" \n", normalized=False)])
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tokenizer


def quicktour(directory):
    """The tokenizers library's quicktour, step by step: trained from files and saved as tokenizer.json alone."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.trainers import BpeTrainer
    os.makedirs(directory)
    text = os.path.join(directory, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus()))
    tokenizer = Tokenizer(BPE(unk_token="[UNK]"))
    trainer = BpeTrainer(special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], show_progress=False)
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.train([text], trainer)
    os.remove(text)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return tokenizer


def words():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"\W"), behavior="merged_with_next")])
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "</s>"], show_progress=False,
                                  limit_alphabet=400)
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


def save_hf(tokenizer, directory, bos, eos):
    os.makedirs(directory)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


def sentencepiece_model(directory, model_type, **options):
    import sentencepiece as spm
    os.makedirs(directory)
    text = os.path.join(directory, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(line.replace("\n", " ") for line in corpus()))
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=os.path.join(directory, "tokenizer"), vocab_size=1200, model_type=model_type,
        byte_fallback=model_type == "bpe", character_coverage=0.9995, num_threads=1, minloglevel=2,
        user_defined_symbols=["<|endoftext|>"] if model_type == "unigram" else [], **options)
    os.remove(text)
    return spm.SentencePieceProcessor(model_file=os.path.join(directory, "tokenizer.model"))


def make(out):
    from tokenizers import normalizers
    staging = f"{out}.partial.{os.getpid()}"  # tests that start together each make their own, then one wins
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    lines = hard_text()
    with open(os.path.join(staging, "hard_text.json"), "w", encoding="utf-8") as f:
        json.dump(lines, f, ensure_ascii=True)

    hf = {
        "llama3": (byte_level_bpe(LLAMA3_PATTERN, None, ["<|begin_of_text|>", "<|end_of_text|>"],
                                  "<|begin_of_text|>", 2000), "<|begin_of_text|>", "<|end_of_text|>"),
        "qwen2": (byte_level_bpe(QWEN2_PATTERN, normalizers.NFC(), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                 None, 2000), None, "<|endoftext|>"),
        "llama2": (byte_fallback_bpe(metaspace=False), "<s>", "</s>"),
        "mistral": (byte_fallback_bpe(metaspace=True), "<s>", "</s>"),
        "exotic": (exotic(), None, "<unk>"),
        "roberta": (roberta(), "<s>", "</s>"),
        "words": (words(), None, "</s>"),
    }
    hf["quicktour"] = (quicktour(os.path.join(staging, "quicktour")), None, None)
    for name, (tokenizer, bos, eos) in hf.items():
        directory = os.path.join(staging, name)
        if name != "quicktour":  # saved as the quicktour saves it
            save_hf(tokenizer, directory, bos, eos)
        plain = [tokenizer.encode(line, add_special_tokens=False).ids for line in lines]
        special = [tokenizer.encode(line, add_special_tokens=True).ids for line in lines]
        decoded = [tokenizer.decode(ids, skip_special_tokens=False) for ids in plain]
        with open(os.path.join(directory, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"ids": plain, "ids_with_special_tokens": special, "decoded": decoded,
                       "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True)}, f, ensure_ascii=True)

    # spm_train's defaults (words kept apart), then Llama-2's settings: whitespace runs kept, and as pieces.
    llama2 = {"normalization_rule_name": "identity", "remove_extra_whitespaces": False,
              "allow_whitespace_only_pieces": True, "split_digits": True}
    # And the identity rule with words apart: a "▁" typed in the text must not end a word early.
    for name, model_type, options in [("sp_unigram", "unigram", {}), ("sp_bpe", "bpe", {}),
                                      ("sp_llama2", "bpe", llama2),
                                      ("sp_identity", "unigram", {"normalization_rule_name": "identity"})]:
        directory = os.path.join(staging, name)
        processor = sentencepiece_model(directory, model_type, **options)
        plain = [processor.encode(line) for line in lines]
        decoded = [processor.decode(ids) for ids in plain]
        with open(os.path.join(directory, "expected.json"), "w", encoding="utf-8") as f:
            json.dump({"ids": plain, "decoded": decoded, "vocab_size": processor.vocab_size(),
                       "bos": processor.bos_id(), "eos": processor.eos_id()}, f, ensure_ascii=True)

    try:
        os.rename(staging, out)
    except OSError:  # another process got there first with the same files
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.isdir(out):
            raise


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "make":
        sys.exit(__doc__)
    make(sys.argv[2])


if __name__ == "__main__":
    main()
