"""PyTorch's own Distributed Checkpoint (torch.distributed.checkpoint) as the reference of bridge's C++ DCP writer and
reader (utils/dcp.h), in one process without a process group. Run by tests/unit/dcp_test.cpp with the venv's torch.

    python dcp_reference.py check DIR EXPECTED.safetensors
        FileSystemReader(DIR).read_metadata() and dcp.load into preallocated tensors (all of them, then a subset):
        every tensor must equal EXPECTED's, and the bytes item "common" must be [{"iteration": 7}]. Prints a JSON
        summary of the metadata as torch parsed it.
    python dcp_reference.py save DIR EXPECTED.safetensors
        dcp.save of tensors of several dtypes and shapes (a transposed view, a 0-dim tensor) and two non-tensor
        objects; EXPECTED gets the same tensors for the C++ side to compare with. Prints the fqns of the bytes items.
Exits 1 with a message on stderr when a check fails.
"""
import json
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

# "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to save in a single process"
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def check(directory, expected_path):
    expected = load_file(expected_path)
    metadata = dcp.FileSystemReader(directory).read_metadata()
    summary = {"version": metadata.version, "tensors": {}, "bytes": []}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            summary["bytes"].append(fqn)
            continue
        if not isinstance(item, TensorStorageMetadata):
            fail(f"{fqn}: {type(item)}")
        summary["tensors"][fqn] = {
            "dtype": str(item.properties.dtype).replace("torch.", ""),
            "size": list(item.size),
            "chunks": [[list(c.offsets), list(c.sizes)] for c in item.chunks],
            "strides": list(item.properties.strides) if item.properties.strides is not None else None,
        }
    if sorted(summary["tensors"]) != sorted(expected):
        fail(f"the checkpoint's tensors {sorted(summary['tensors'])} are not the expected {sorted(expected)}")

    # Everything, into preallocated tensors of the right shape but the wrong values; the bytes item by name.
    state = {name: torch.full_like(tensor, 3) if tensor.dtype != torch.bool else torch.zeros_like(tensor)
             for name, tensor in expected.items()}
    state["common"] = None
    dcp.load(state, checkpoint_id=directory)
    for name, tensor in expected.items():
        if state[name].dtype != tensor.dtype or not torch.equal(state[name], tensor):
            fail(f"{name}: dcp.load gave {state[name]}, expected {tensor}")
    if state["common"] != [{"iteration": 7}]:
        fail(f"common: dcp.load gave {state['common']!r}, expected [{{'iteration': 7}}]")

    # A subset (a resharded reader asks for what it needs; plain tensors are read whole).
    subset = {name: torch.zeros_like(tensor) for name, tensor in list(expected.items())[:2]}
    dcp.load(subset, checkpoint_id=directory)
    for name, tensor in subset.items():
        if not torch.equal(tensor, expected[name]):
            fail(f"{name}: the partial dcp.load gave {tensor}")
    summary["loaded"] = sorted(expected)
    print(json.dumps(summary))


def save(directory, expected_path):
    torch.manual_seed(0)
    tensors = {
        "layers.weight": torch.randn(3, 5, 4),
        "embedding": torch.randn(7, 6).to(torch.bfloat16),
        "counts": torch.arange(10, dtype=torch.int64) * 1000003,
        "mask": torch.rand(4, 4) > 0.5,
        "half": torch.randn(5).to(torch.float16),
        "bytes_u8": torch.arange(9, dtype=torch.uint8) * 27,
        "small_i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "ints": torch.arange(6, dtype=torch.int32).reshape(2, 3) - 3,
        "doubles": torch.randn(2, 2, dtype=torch.float64),
        "transposed": torch.arange(24, dtype=torch.float32).reshape(4, 6).t(),
        "scalar": torch.tensor(2.5),
    }
    state = dict(tensors)
    state["note"] = "hello"
    state["extra"] = {"iteration": 7}  # flattened by DCP's planner into the bytes item "extra.iteration"
    dcp.save(state, checkpoint_id=directory)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, expected_path)
    metadata = dcp.FileSystemReader(directory).read_metadata()
    print(json.dumps({"bytes": sorted(fqn for fqn, item in metadata.state_dict_metadata.items()
                                      if isinstance(item, BytesStorageMetadata))}))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("check", "save"):
        fail(__doc__)
    (check if sys.argv[1] == "check" else save)(sys.argv[2], sys.argv[3])
