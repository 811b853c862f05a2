"""Opens a bridge checkpoint file (a rank's model_optim_rng.pt or common.pt) with PyTorch's own loader, as a Megatron or PyTorch user would, and prints a JSON
summary: the top-level keys, every model tensor's shape and sum (float64), the iteration and the optimizer state's
names. Fails (exit 1) when torch.load(weights_only=True) refuses the file.

    python read_checkpoint.py <save>/iter_0000004/mp_rank_00/model_optim_rng.pt
"""
import json
import sys

import torch


def main(path):
    state = torch.load(path, map_location="cpu", weights_only=True)
    summary = {
        "torch_version": torch.__version__,
        "keys": sorted(state.keys()),
        "iteration": state["iteration"],
        "checkpoint_version": state["checkpoint_version"],
        "model": {name: {"shape": list(t.shape), "dtype": str(t.dtype), "sum": float(t.double().sum())}
                  for name, t in state.get("model", {}).items()},
        "optimizer_state": sorted(state["optimizer"]["optimizer"]["state"].keys()) if "optimizer" in state else [],
        "tensors": sorted(state.get("tensors", {}).keys()),
        "config_has_model_section": "model:" in state["config"],
        "callbacks": {key: {k: (v.tolist() if torch.is_tensor(v) else v) for k, v in value.items()}
                      for key, value in state.get("callbacks", {}).items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1])
