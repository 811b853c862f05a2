"""PyTorch's own torch.distributed.checkpoint as an independent reader of bridge's torch_dist checkpoints
(training/checkpointing/torch_dist_strategy.cpp). Run by tests/dist/checkpoint_dist_test.cpp with the venv's torch,
in one process without a process group:

    python read_torch_dist.py ITERATION_DIR OUT.safetensors
        FileSystemReader(ITERATION_DIR).read_metadata(), a preallocated tensor of each saved tensor's global shape and
        dtype, dcp.load(..., no_dist=True), and every tensor outside the optimizer's state written to OUT under its
        saved key (Megatron-Core's sharded key: decoder.layers.<rest> stacked on a layer axis, ...). Prints a JSON
        summary: the keys of the tensors and of the bytes items.
Exits 1 with a message on stderr when the checkpoint does not load.
"""
import json
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def main(directory, out_path):
    metadata = dcp.FileSystemReader(directory).read_metadata()
    state = {}
    bytes_items = []
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            bytes_items.append(fqn)
        elif isinstance(item, TensorStorageMetadata):
            # NaN-filled: an element that no chunk covers would show in the comparison.
            dtype = item.properties.dtype
            state[fqn] = torch.full(tuple(item.size), float("nan") if dtype.is_floating_point else -1, dtype=dtype)
        else:
            print(f"{fqn}: unexpected metadata {type(item)}", file=sys.stderr)
            sys.exit(1)
    dcp.load(state, storage_reader=dcp.FileSystemReader(directory), no_dist=True)
    model = {key: tensor.contiguous() for key, tensor in state.items() if not key.startswith("optimizer.")}
    save_file(model, out_path)
    print(json.dumps({"tensors": sorted(state), "bytes": sorted(bytes_items)}))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
