#!/usr/bin/env python3
"""Megatron-Core's blend arithmetic in NumPy, the reference for bridge's BlendedDataset: the weight normalisation
(megatron/core/datasets/utils.py normalize: w / numpy.sum(w)), the per-dataset sample counts of
BlendedMegatronDatasetBuilder (ceil(ceil(n * w) * (1 + surplus))) and helpers.cpp's two blending-index builders.

Usage:
  megatron_blend_indices.py weighted SURPLUS N W1 W2 ...   one split of N samples over datasets of weights W
                                                           (decimal, or hex as C's %a writes them)
  megatron_blend_indices.py exhaustive S1 S2 ...           every sample of datasets of sizes S once
Prints one JSON object: the normalised weights as float.hex strings (bit-exact), and for `weighted` the counts each
dataset is built with, the blend's size and its indices; for `exhaustive` the indices.
"""
import json
import math
import sys

import numpy


def normalize(weights):
    array = numpy.array(weights, dtype=numpy.float64)
    return (array / numpy.sum(array)).tolist()


def blending_indices(weights, size):
    """The dataset furthest behind its share at each step; the lowest index wins a tie."""
    taken = [0] * len(weights)
    dataset_index, sample_index = [], []
    for step in range(size):
        progress = max(float(step), 1.0)
        errors = [weights[d] * progress - taken[d] for d in range(len(weights))]
        best = 0
        for d in range(1, len(weights)):
            if errors[d] > errors[best]:
                best = d
        dataset_index.append(best)
        sample_index.append(taken[best])
        taken[best] += 1
    return dataset_index, sample_index


def exhaustive_indices(sizes):
    total = sum(sizes)
    weights = [size / float(total) for size in sizes]
    taken = [0] * len(sizes)
    left = [d for d in range(len(sizes)) if sizes[d] > 0]
    dataset_index, sample_index = [], []
    step = 0
    while left:
        progress = max(float(step), 1.0)
        best = max(left, key=lambda d: (weights[d] * progress - taken[d], -d))
        dataset_index.append(best)
        sample_index.append(taken[best])
        taken[best] += 1
        if taken[best] == sizes[best]:
            left.remove(best)
        step += 1
    return dataset_index, sample_index


def number(text):
    """A weight as written: decimal, or C's %a hex (exact)."""
    return float.fromhex(text) if "0x" in text.lower() else float(text)


def main():
    if sys.argv[1] == "weighted":
        surplus, size = float(sys.argv[2]), int(sys.argv[3])
        weights = normalize([number(w) for w in sys.argv[4:]])
        shares = [math.ceil(size * w) for w in weights]
        built = [int(math.ceil(share * (1 + surplus))) for share in shares]
        dataset_index, sample_index = blending_indices(normalize(weights), sum(shares))
        result = {"weights": [w.hex() for w in weights], "built": built, "size": sum(shares),
                  "dataset_index": dataset_index, "dataset_sample_index": sample_index}
    else:
        dataset_index, sample_index = exhaustive_indices([int(s) for s in sys.argv[2:]])
        result = {"dataset_index": dataset_index, "dataset_sample_index": sample_index}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
