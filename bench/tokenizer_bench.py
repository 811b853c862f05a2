#!/usr/bin/env python3
"""The Python side of the tokenizer benchmark (bench/run_tokenizer_bench.sh): the corpus, the tokenizers, and the
libraries' own speed on them.

  tokenizer_bench.py corpus OUT.jsonl MEGABYTES
      English text from the machine's documentation (/usr/share/doc: READMEs, changelogs, copyright files), in
      sorted file order, cut into documents of a few paragraphs, until MEGABYTES of text: one {"text": ...} a line.
  tokenizer_bench.py train CORPUS.jsonl DIR
      Trains on the corpus, with the real libraries: a 16k byte-level BPE with GPT-2's split (tokenizers), saved as
      DIR/bpe/tokenizer.json and as GPT-2's DIR/bpe/vocab.json + merges.txt (the same tokenizer both ways); a 16k
      SentencePiece BPE with spm_train's defaults, DIR/sp/tokenizer.model; one with Llama-2's settings (the identity
      rule, whitespace runs kept and whitespace-only pieces, digits split), DIR/sp_llama2/tokenizer.model. What
      exists already is kept.
  tokenizer_bench.py time CORPUS.jsonl DIR LIBRARY THREADS
      LIBRARY tokenizers (Tokenizer.encode_batch), tiktoken (encode_ordinary_batch, the BPE's ranks and GPT-2's
      pattern), sentencepiece or sentencepiece-llama2 (encode with num_threads) on the corpus's texts, already in memory, with THREADS
      threads. Prints "LIBRARY threads=N mb_per_s=X tokens=T sha256=H": H digests every document's ids followed by the
      end-of-document id as little-endian uint16, which is what bridge-preprocess-data --append-eod writes to .bin.
"""
import gzip
import hashlib
import json
import os
import sys
import time

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOD = "<|endoftext|>"


def documentation_files():
    for root, dirs, files in os.walk("/usr/share/doc"):
        dirs.sort()
        for name in sorted(files):
            lower = name.lower()
            if lower.startswith(("readme", "changelog", "news", "copyright")) or lower.endswith((".txt", ".md")):
                yield os.path.join(root, name)


def read_text(path):
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def corpus(out, megabytes):
    target = int(float(megabytes) * 1e6)
    written = documents = 0
    with open(out, "w", encoding="utf-8") as f:
        for path in documentation_files():
            text = read_text(path)
            if not text:
                continue
            paragraphs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
            document = []
            for paragraph in paragraphs:
                document.append(paragraph)
                if sum(len(p) for p in document) >= 600:
                    body = "\n\n".join(document)
                    f.write(json.dumps({"text": body}) + "\n")
                    written += len(body.encode("utf-8"))
                    documents += 1
                    document = []
                if written >= target:
                    print(f"corpus: {documents} documents, {written / 1e6:.1f} MB of text")
                    return
    print(f"corpus: {documents} documents, {written / 1e6:.1f} MB of text (all the machine had)")


def texts(corpus_path):
    with open(corpus_path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train(corpus_path, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    lines = texts(corpus_path)
    bpe_dir = os.path.join(out, "bpe")
    if not os.path.exists(os.path.join(bpe_dir, "tokenizer_config.json")):
        os.makedirs(bpe_dir, exist_ok=True)
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=16000, special_tokens=[EOD], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(lines, trainer)
        tokenizer.save(os.path.join(bpe_dir, "tokenizer.json"))
        tokenizer.model.save(bpe_dir)  # vocab.json + merges.txt, GPT-2's files
        with open(os.path.join(bpe_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOD}, f)

    import sentencepiece as spm
    llama2 = {"normalization_rule_name": "identity", "remove_extra_whitespaces": False,
              "allow_whitespace_only_pieces": True, "split_digits": True}
    for name, options in [("sp", {}), ("sp_llama2", llama2)]:
        sp_dir = os.path.join(out, name)
        if os.path.exists(os.path.join(sp_dir, "tokenizer.model")):
            continue
        os.makedirs(sp_dir, exist_ok=True)
        sample = os.path.join(sp_dir, "sample.txt")
        with open(sample, "w", encoding="utf-8") as f:
            for text in lines[::4]:
                f.write(text.replace("\n", " ") + "\n")
        spm.SentencePieceTrainer.train(input=sample, model_prefix=os.path.join(sp_dir, "tokenizer"), vocab_size=16000,
                                       model_type="bpe", byte_fallback=True, num_threads=2, minloglevel=2,
                                       input_sentence_size=200000, shuffle_input_sentence=True, **options)
        os.remove(sample)


def tiktoken_encoding(bpe_dir):
    import tiktoken
    with open(os.path.join(bpe_dir, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    # GPT-2's byte-to-character table, inverted: a token's characters back to its bytes.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    ranks = {bytes(chars[c] for c in token): rank for token, rank in vocab.items() if token != EOD}
    return tiktoken.Encoding("bench", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOD: vocab[EOD]}), vocab[EOD]


def time_library(corpus_path, directory, library, threads):
    threads = int(threads)
    lines = texts(corpus_path)
    size = sum(len(t.encode("utf-8")) for t in lines)
    if library == "tokenizers":
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(os.path.join(directory, "bpe", "tokenizer.json"))
        eod = tokenizer.token_to_id(EOD)
        start = time.perf_counter()
        ids = [e.ids for e in tokenizer.encode_batch(lines, add_special_tokens=False)]
    elif library == "tiktoken":
        encoding, eod = tiktoken_encoding(os.path.join(directory, "bpe"))
        start = time.perf_counter()
        ids = encoding.encode_ordinary_batch(lines, num_threads=threads)
    elif library in ("sentencepiece", "sentencepiece-llama2"):
        import sentencepiece as spm
        model = "sp" if library == "sentencepiece" else "sp_llama2"
        processor = spm.SentencePieceProcessor(model_file=os.path.join(directory, model, "tokenizer.model"))
        eod = processor.eos_id()
        start = time.perf_counter()
        ids = processor.encode(lines, num_threads=threads)
    else:
        sys.exit(f"unknown library {library}")
    seconds = time.perf_counter() - start
    digest = hashlib.sha256()
    tokens = 0
    for document in ids:
        if document:
            digest.update(b"".join(i.to_bytes(2, "little") for i in document + [eod]))
            tokens += len(document) + 1
    print(f"{library} threads={threads} mb_per_s={size / seconds / 1e6:.2f} tokens={tokens} "
          f"sha256={digest.hexdigest()}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "corpus" and len(sys.argv) == 4:
        corpus(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 2 and sys.argv[1] == "train" and len(sys.argv) == 4:
        train(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 2 and sys.argv[1] == "time" and len(sys.argv) == 6:
        time_library(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
