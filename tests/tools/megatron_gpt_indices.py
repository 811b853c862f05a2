#!/usr/bin/env python3
"""Megatron-Core's GPTDataset indices and samples, reimplemented in NumPy as the reference for bridge's C++ port:
_build_document_index, helpers.cpp's build_sample_idx, _build_shuffle_index and
_query_document_sample_shuffle_indices (megatron/core/datasets/gpt_dataset.py, helpers.cpp), with the dataset read
through Megatron's _IndexReader layout.

Usage: megatron_gpt_indices.py PREFIX BEGIN END NUM_SAMPLES SEQ_LENGTH SEED OUT_DIR NUM_CHECKED
Writes OUT_DIR/{document_index,sample_index,shuffle_index}.npy exactly as Megatron saves them, OUT_DIR/samples.npy
([NUM_CHECKED, SEQ_LENGTH + 1] int64: the first samples' tokens) and OUT_DIR/info.txt ("num_epochs separate").
"""
import os
import struct
import sys

import numpy

_DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64, 6: numpy.float64,
           7: numpy.float32, 8: numpy.uint16}


def read_index(prefix):
    """Megatron's _IndexReader."""
    with open(prefix + ".idx", "rb") as stream:
        assert stream.read(9) == b"MMIDIDX\x00\x00"
        assert struct.unpack("<Q", stream.read(8))[0] == 1
        dtype = _DTYPES[struct.unpack("<B", stream.read(1))[0]]
        sequence_count = struct.unpack("<Q", stream.read(8))[0]
        struct.unpack("<Q", stream.read(8))
        offset = stream.tell()
    buffer = memoryview(numpy.memmap(prefix + ".idx", mode="r", order="C"))
    sequence_lengths = numpy.frombuffer(buffer, dtype=numpy.int32, count=sequence_count, offset=offset)
    sequence_pointers = numpy.frombuffer(buffer, dtype=numpy.int64, count=sequence_count,
                                         offset=offset + sequence_lengths.nbytes)
    return dtype, sequence_lengths, sequence_pointers


class IndexedDataset:
    def __init__(self, prefix):
        self.dtype, self.sequence_lengths, self.sequence_pointers = read_index(prefix)
        self.bin = numpy.memmap(prefix + ".bin", mode="r", order="C")

    def get(self, idx, offset=0, length=None):
        if length is None:
            length = self.sequence_lengths[idx] - offset
        pointer = self.sequence_pointers[idx] + offset * numpy.dtype(self.dtype).itemsize
        return numpy.frombuffer(self.bin, dtype=self.dtype, count=length, offset=pointer)


def build_document_index(documents, num_epochs, numpy_random_state, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        document_index = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        document_index[:] = documents
        document_index = document_index.reshape(-1)
        document_index = document_index.astype(numpy.int32)
        numpy_random_state.shuffle(document_index)
        return document_index
    doc_idx_first = build_document_index(documents, num_epochs - 1, numpy_random_state, False)
    doc_idx_last = build_document_index(documents, 1, numpy_random_state, False)
    return numpy.concatenate((doc_idx_first, doc_idx_last))


def build_sample_idx(sizes, document_idx, seq_length, num_epochs, tokens_per_epoch, add_extra_token=1):
    """helpers.cpp build_sample_idx with drop_last_partial_sequence=True, line for line."""
    num_samples = (num_epochs * tokens_per_epoch - add_extra_token) // seq_length
    sample_idx_max = max(document_idx.shape[0], sizes.max())
    dtype = numpy.int32 if sample_idx_max <= numpy.iinfo(numpy.int32).max else numpy.int64
    sample_idx = numpy.zeros((num_samples + 1, 2), dtype=dtype)
    sample_idx_index = 0
    document_idx_index = 0
    doc_offset = 0
    sample_idx[sample_idx_index] = (document_idx_index, doc_offset)
    sample_idx_index += 1
    while sample_idx_index <= num_samples:
        remaining_seq_length = seq_length + add_extra_token
        while remaining_seq_length != 0:
            document_index = document_idx[document_idx_index]
            document_length = int(sizes[document_index]) - doc_offset
            remaining_seq_length -= document_length
            if remaining_seq_length <= 0:
                doc_offset += remaining_seq_length + document_length - add_extra_token
                remaining_seq_length = 0
            else:
                if document_idx_index == document_idx.shape[0] - 1:
                    assert sample_idx_index == num_samples
                    doc_offset = int(sizes[document_idx[document_idx_index]]) - add_extra_token
                    break
                document_idx_index += 1
                doc_offset = 0
        sample_idx[sample_idx_index] = (document_idx_index, doc_offset)
        sample_idx_index += 1
    return sample_idx


def build_shuffle_index(num_samples, total_size, numpy_random_state):
    dtype_ = numpy.uint32
    if total_size >= (numpy.iinfo(numpy.uint32).max - 1):
        dtype_ = numpy.int64
    shuffle_idx_first = numpy.arange(start=0, stop=num_samples, step=1, dtype=dtype_)
    numpy_random_state.shuffle(shuffle_idx_first)
    if num_samples == total_size:
        return shuffle_idx_first
    shuffle_idx_last = numpy.arange(start=num_samples, stop=total_size, step=1, dtype=dtype_)
    numpy_random_state.shuffle(shuffle_idx_last)
    return numpy.concatenate((shuffle_idx_first, shuffle_idx_last))


def main():
    prefix, begin, end, num_samples, sequence_length, seed, out_dir, num_checked = sys.argv[1:9]
    begin, end, num_samples, sequence_length, seed, num_checked = map(
        int, (begin, end, num_samples, sequence_length, seed, num_checked))
    dataset = IndexedDataset(prefix)
    indices = numpy.arange(start=begin, stop=end, step=1, dtype=numpy.int32)

    # GPTDataset._build_document_sample_shuffle_indices
    num_tokens_per_epoch = int(numpy.sum(dataset.sequence_lengths[indices]))
    num_epochs, num_tokens = 1, num_tokens_per_epoch
    while num_tokens < num_samples * sequence_length + 1:
        num_tokens += num_tokens_per_epoch
        num_epochs += 1
    if num_epochs == 1:
        separate_final_epoch = False
    else:
        num_samples_sans_final_epoch = ((num_epochs - 1) * num_tokens_per_epoch - 1) // sequence_length
        num_samples_from_final_epoch = num_samples - num_samples_sans_final_epoch
        num_samples_per_epoch = (num_tokens_per_epoch - 1) // sequence_length
        assert 0 <= num_samples_from_final_epoch <= num_samples_per_epoch + 1
        separate_final_epoch = num_samples_from_final_epoch < int(0.80 * num_samples_per_epoch)
    numpy_random_state = numpy.random.RandomState(seed)
    document_index = build_document_index(indices, num_epochs, numpy_random_state, separate_final_epoch)
    sample_index = build_sample_idx(dataset.sequence_lengths, document_index, sequence_length, num_epochs,
                                    num_tokens_per_epoch)
    if separate_final_epoch:
        shuffle_index = build_shuffle_index(num_samples_sans_final_epoch, sample_index.shape[0] - 1,
                                            numpy_random_state)
    else:
        shuffle_index = build_shuffle_index(sample_index.shape[0] - 1, sample_index.shape[0] - 1, numpy_random_state)

    os.makedirs(out_dir, exist_ok=True)
    numpy.save(os.path.join(out_dir, "document_index.npy"), document_index, allow_pickle=True)
    numpy.save(os.path.join(out_dir, "sample_index.npy"), sample_index, allow_pickle=True)
    numpy.save(os.path.join(out_dir, "shuffle_index.npy"), shuffle_index, allow_pickle=True)

    # _query_document_sample_shuffle_indices
    samples = []
    for idx in range(min(num_checked, len(shuffle_index))):
        idx = shuffle_index[idx]
        doc_index_beg, doc_index_beg_offset = sample_index[idx]
        doc_index_end, doc_index_end_offset = sample_index[idx + 1]
        sample_parts = []
        if doc_index_beg == doc_index_end:
            sample_parts.append(dataset.get(document_index[doc_index_beg], offset=doc_index_beg_offset,
                                            length=doc_index_end_offset - doc_index_beg_offset + 1))
        else:
            for i in range(doc_index_beg, doc_index_end + 1):
                offset = 0 if i > doc_index_beg else doc_index_beg_offset
                length = None if i < doc_index_end else doc_index_end_offset + 1
                sample_parts.append(dataset.get(document_index[i], offset=offset, length=length))
        samples.append(numpy.concatenate(sample_parts, dtype=numpy.int64))
    numpy.save(os.path.join(out_dir, "samples.npy"), numpy.array(samples, dtype=numpy.int64).reshape(-1, sequence_length + 1))
    with open(os.path.join(out_dir, "info.txt"), "w") as info:
        info.write(f"{num_epochs} {int(separate_final_epoch)}\n")


if __name__ == "__main__":
    main()
