"""Opens a bridge checkpoint file (a rank's model_optim_rng.pt or common.pt) with PyTorch's own loader, as a Megatron or PyTorch user would, and prints a JSON
summary: the top-level keys, every model tensor's shape and sum (float64), the iteration and the optimizer state's
names, the callbacks' and the scheduler's state. Fails (exit 1) when torch.load(weights_only=True) refuses the file.
Run by the tests with the venv's torch 2.x and Debian's torch 1.13.

    python read_checkpoint.py <save>/iter_0000004/mp_rank_00/model_optim_rng.pt
"""
import json
import sys

import torch


def plain(value):
    """JSON-ready: tensors as lists (floats are stored as 0-dim float64 tensors), containers recursively."""
    if torch.is_tensor(value):
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def main(path):
    state = torch.load(path, map_location="cpu", weights_only=True)
    summary = {
        "torch_version": torch.__version__,
        "keys": sorted(state.keys()),
        "iteration": state["iteration"],
        "checkpoint_version": plain(state["checkpoint_version"]),
        "model": {name: {"shape": list(t.shape), "dtype": str(t.dtype), "sum": float(t.double().sum())}
                  for name, t in state.get("model", {}).items()},
        "optimizer_state": sorted(state["optimizer"]["optimizer"]["state"].keys()) if "optimizer" in state else [],
        "tensors": sorted(state.get("tensors", {}).keys()),
        "config_has_model_section": "model:" in state["config"],
        "callbacks": plain(state.get("callbacks", {})),
        "opt_param_scheduler": plain(state.get("opt_param_scheduler", {})),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1])
