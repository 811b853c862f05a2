#!/usr/bin/env python3
"""Writes Megatron indexed datasets (.bin/.idx) the way Megatron-Core's IndexedDatasetBuilder and _IndexWriter do
(megatron/core/datasets/indexed_dataset.py), independently of bridge's C++ writer, for the reader and builder tests.

Usage: megatron_indexed_writer.py OUTPUT_PREFIX DTYPE NUM_DOCUMENTS
  DTYPE: uint16 or int32. Document i holds (7 * i) % 13 + 1 tokens; token j of document i is
  (i * 1009 + j * 31) % modulus, modulus 65536 for uint16 and 2^31 - 1 for int32 (values above 2^16 then).
  Each document is one sequence (preprocess_data.py without --split-sentences).
"""
import struct
import sys

import numpy

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_CODES = {numpy.uint8: 1, numpy.int8: 2, numpy.int16: 3, numpy.int32: 4, numpy.int64: 5, numpy.float64: 6,
          numpy.float32: 7, numpy.uint16: 8}


def document(i, modulus):
    length = (7 * i) % 13 + 1
    return [(i * 1009 + j * 31 * (1 if modulus == 65536 else 70001)) % modulus for j in range(length)]


class IndexWriter:
    """Megatron's _IndexWriter."""

    def __init__(self, idx_path, dtype):
        self.idx_path = idx_path
        self.dtype = dtype

    def write(self, sequence_lengths, document_indices):
        with open(self.idx_path, "wb") as idx_writer:
            idx_writer.write(_INDEX_HEADER)
            idx_writer.write(struct.pack("<Q", 1))
            idx_writer.write(struct.pack("<B", _CODES[self.dtype]))
            sequence_count = len(sequence_lengths)
            idx_writer.write(struct.pack("<Q", sequence_count))
            document_count = len(document_indices)
            idx_writer.write(struct.pack("<Q", document_count))
            sequence_lengths = numpy.array(sequence_lengths, dtype=numpy.int32)
            idx_writer.write(sequence_lengths.tobytes(order="C"))
            sequence_pointers = self._sequence_pointers(sequence_lengths.tolist())
            sequence_pointers = numpy.array(sequence_pointers, dtype=numpy.int64)
            idx_writer.write(sequence_pointers.tobytes(order="C"))
            document_indices = numpy.array(document_indices, dtype=numpy.int64)
            idx_writer.write(document_indices.tobytes(order="C"))

    def _sequence_pointers(self, sequence_lengths):
        itemsize = numpy.int64(numpy.dtype(self.dtype).itemsize)
        curr_ptr = numpy.int64(0)
        list_ptr = []
        for length in sequence_lengths:
            list_ptr.append(curr_ptr.item())
            curr_ptr += length * itemsize
        return list_ptr


class IndexedDatasetBuilder:
    """Megatron's IndexedDatasetBuilder (add_item, end_document, finalize)."""

    def __init__(self, bin_path, dtype):
        self.data_file = open(bin_path, "wb")
        self.dtype = dtype
        self.sequence_lengths = []
        self.document_indices = [0]

    def add_item(self, tokens):
        np_array = numpy.array(tokens, dtype=self.dtype)
        self.data_file.write(np_array.tobytes(order="C"))
        self.sequence_lengths.append(np_array.size)

    def end_document(self):
        self.document_indices.append(len(self.sequence_lengths))

    def finalize(self, idx_path):
        self.data_file.close()
        IndexWriter(idx_path, self.dtype).write(self.sequence_lengths, self.document_indices)


def main():
    prefix, dtype_name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dtype = {"uint16": numpy.uint16, "int32": numpy.int32}[dtype_name]
    modulus = 65536 if dtype == numpy.uint16 else 2**31 - 1
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype)
    for i in range(count):
        builder.add_item(document(i, modulus))
        builder.end_document()
    builder.finalize(prefix + ".idx")


if __name__ == "__main__":
    main()
