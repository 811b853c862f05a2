#!/usr/bin/env python3
"""The reference side of docs/tokenizers.md's "Your own tokenizer", for tokenizers_test (nothing downloaded).

Usage: own_tokenizer.py DIR

Trains the tokenizers quicktour's tokenizer (a BPE with [UNK] and BERT's special tokens, the Whitespace
pre-tokenizer) on DIR/corpus.txt and saves DIR/tokenizer.json, as the quicktour does; gives it an end-of-document
token as the page shows, with transformers' PreTrainedTokenizerFast(..., eos_token="</s>").save_pretrained(DIR/mine);
then writes DIR/expected.json: what Megatron's preprocess_data.py writes with --append-eod for each "text" of
DIR/corpus.jsonl through transformers' AutoTokenizer (tokenizer(text).input_ids, then eos_token_id after a non-empty
document), the vocabulary size (len(tokenizer)) and the EOS id.
"""
import json
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = sys.argv[1]
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.trainers import BpeTrainer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # The quicktour, step by step (its show_progress bar aside).
    tokenizer = Tokenizer(BPE(unk_token="[UNK]"))
    trainer = BpeTrainer(special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], show_progress=False)
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.train([os.path.join(directory, "corpus.txt")], trainer)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))

    # docs/tokenizers.md: the EOS that --append-eod writes, named in transformers' files.
    mine = os.path.join(directory, "mine")
    PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"),
                            eos_token="</s>").save_pretrained(mine)

    loaded = AutoTokenizer.from_pretrained(mine)
    documents = []
    with open(os.path.join(directory, "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                ids = loaded(json.loads(line)["text"]).input_ids
                documents.append(ids + [loaded.eos_token_id] if ids else ids)
    with open(os.path.join(directory, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"documents": documents, "vocab_size": len(loaded), "eos": loaded.eos_token_id}, f)


if __name__ == "__main__":
    main()
