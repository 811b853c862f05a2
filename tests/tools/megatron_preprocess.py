#!/usr/bin/env python3
"""Megatron-LM's tools/preprocess_data.py for one JSON-lines file, as independent reference for
bridge-preprocess-data: the Encoder's loop (each document's "text" one sequence, EOD appended to non-empty
documents) with Megatron-Core's tokenizers as they tokenize, written by the NumPy port of Megatron's
IndexedDatasetBuilder (megatron_indexed_writer.py).

Usage: megatron_preprocess.py INPUT OUTPUT_PREFIX TOKENIZER_TYPE TOKENIZER_MODEL [--append-eod]
  HuggingFaceTokenizer: AutoTokenizer.from_pretrained(MODEL, use_fast=True); ids = tokenizer(text).input_ids (the
    post-processor's BOS included), EOD = eos_token_id, vocabulary = len(tokenizer)
  SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer: encode_as_ids(text), EOD = eos_id(),
    vocabulary = get_piece_size() (Megatron-Core's one SentencePiece class)
Writes OUTPUT_PREFIX_text_document.bin/.idx.
"""
import json
import os
import sys

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_indexed_writer import IndexWriter  # noqa: E402


class HuggingFace:
    def __init__(self, model):
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(model, use_fast=True)
        self.eod = self.tokenizer.eos_token_id
        self.vocab_size = len(self.tokenizer)

    def tokenize(self, text):
        return self.tokenizer(text).input_ids


class SentencePiece:
    def __init__(self, model):
        import sentencepiece
        self.processor = sentencepiece.SentencePieceProcessor(model_file=model)
        self.eod = self.processor.eos_id()
        self.vocab_size = self.processor.get_piece_size()

    def tokenize(self, text):
        return self.processor.encode_as_ids(text)


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    source, prefix, kind, model = sys.argv[1:5]
    append_eod = sys.argv[5:] == ["--append-eod"]
    tokenizer = HuggingFace(model) if kind == "HuggingFaceTokenizer" else SentencePiece(model)
    dtype = numpy.uint16 if tokenizer.vocab_size < 65500 else numpy.int32  # DType.optimal_dtype
    sequence_lengths, document_indices = [], [0]
    with open(source, encoding="utf-8") as lines, open(prefix + "_text_document.bin", "wb") as data:
        for line in lines:
            text = json.loads(line)["text"]
            doc_ids, lengths = [], []
            for sentence in (text if isinstance(text, list) else [text]):
                ids = tokenizer.tokenize(sentence)
                if len(ids) > 0:
                    doc_ids.extend(ids)
                    lengths.append(len(ids))
            if len(doc_ids) > 0 and append_eod:
                doc_ids.append(tokenizer.eod)
                lengths[-1] += 1
            data.write(numpy.array(doc_ids, dtype=dtype).tobytes(order="C"))  # add_document
            sequence_lengths.extend(lengths)
            document_indices.append(len(sequence_lengths))
    IndexWriter(prefix + "_text_document.idx", dtype).write(sequence_lengths, document_indices)


if __name__ == "__main__":
    main()
