"""Rewrites a checkpoint of bridge's (torch_dist, the optimizer in model space) as Megatron-Bridge writes one, with
PyTorch's own torch.distributed.checkpoint, in one process without a process group. bridge must load the result and
train on exactly as from its own save (tests/dist/checkpoint_dist_test.cpp). What differs from bridge's files is what
Megatron-Bridge's default model (Transformer Engine's layers) and Megatron-Core's save put there
(../shared/reference/dist_checkpoint.md):

    python megatron_bridge_checkpoint.py SRC_ITERATION_DIR DST_SAVE_DIR

  - the layer norms before QKV and fc1 under Transformer Engine's fused names
    (decoder.layers.self_attention.linear_qkv.layer_norm_weight, decoder.layers.mlp.linear_fc1.layer_norm_weight),
    the optimizer's tensors (optimizer.state.{param,exp_avg,exp_avg_sq}.<key>) following them, and the fp32 main
    params as `param` where bridge's fp32 run keeps none;
  - every linear layer's `_extra_state` object (None, a local layer's, one per layer) that a Megatron-Core model
    asks for;
Non-tensor values are DCP bytes items holding torch.save of the value, as DCP's default planner writes them.
  - the RNG objects as Megatron-Bridge fills them (Python's and NumPy's generator states beside torch's);
  - Megatron-Core's common state (checkpoint_version 3.0, iteration, opt_param_scheduler, content_metadata, the
    optimizer's param_groups with their step, rerun_state_machine): no bridge config, counters or parallel layout;
  - Megatron-Bridge's train_state.pt (the counters), run_config.yaml (its own config, not bridge's), metadata.json,
    <save>/latest_train_state.pt and the tracker; no bridge_checksums.json.
Exits 1 with a message on stderr when SRC does not load.
"""
import json
import random
import shutil
import sys
import warnings
from pathlib import Path

import numpy
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

# bridge's (Megatron-Core's local layers') names -> Transformer Engine's fused ones.
TE_NAMES = {
    "decoder.layers.input_layernorm.": "decoder.layers.self_attention.linear_qkv.layer_norm_",
    "decoder.layers.pre_mlp_layernorm.": "decoder.layers.mlp.linear_fc1.layer_norm_",
}
OPTIMIZER_STATE = "optimizer.state."
LINEARS = ["self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"]


def te_name(key):
    for local, fused in TE_NAMES.items():
        if key.startswith(local):
            return fused + key[len(local):]  # weight -> layer_norm_weight, bias -> layer_norm_bias
    return key


def main(source, destination):
    source, destination = Path(source), Path(destination)
    metadata = dcp.FileSystemReader(str(source)).read_metadata()
    state = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            state[fqn] = torch.empty(tuple(item.size), dtype=item.properties.dtype)
        elif isinstance(item, BytesStorageMetadata) and fqn == "common_state/shard_0_1":
            state[fqn] = None
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(source)), no_dist=True)
    common = state.pop("common_state/shard_0_1")
    common = common[0] if isinstance(common, list) else common
    if common["content_metadata"]["distrib_optim_sharding_type"] != "fully_reshardable":
        print(f"{source}: the optimizer is not in model space (save with fully_reshardable)", file=sys.stderr)
        sys.exit(1)

    out = {}
    model_keys = []
    for key, tensor in state.items():
        if key.startswith(OPTIMIZER_STATE):
            kind, rest = key[len(OPTIMIZER_STATE):].split(".", 1)
            out[OPTIMIZER_STATE + kind + "." + te_name(rest)] = tensor
        else:
            out[te_name(key)] = tensor
            model_keys.append(key)
    for key in model_keys:  # Megatron-Core's distributed optimizer keeps fp32 main params even for fp32 weights
        main = OPTIMIZER_STATE + "param." + te_name(key)
        if main not in out:
            out[main] = state[key].float().clone()

    layers = state["decoder.layers.self_attention.linear_qkv.weight"].shape[0]
    for linear in LINEARS:
        for layer in range(layers):
            out[f"decoder.layers.{linear}._extra_state/shard_{layer}_{layers}"] = None
    if "output_layer.weight" in state:
        out["output_layer._extra_state/shard_0_1"] = None
    layout = common["parallel_layout"]
    pp, tp = layout["pipeline_model_parallel_size"], layout["tensor_model_parallel_size"]
    for p in range(pp):
        for t in range(tp):
            rng = {"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
                   "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": None, "rng_tracker_states": {}}
            out[f"rng_state/shard_{p}.{t}_{pp}.{tp}"] = [rng]

    step = common["optimizer"]["step"]
    scheduler = dict(common["opt_param_scheduler"])
    scheduler.update({"start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant", "wd_incr_steps": 0})
    megatron_common = {
        "checkpoint_version": 3.0,
        "iteration": common["iteration"],
        "opt_param_scheduler": scheduler,
        "content_metadata": {"distrib_optim_sharding_type": "fully_reshardable", "singleton_local_shards": False,
                             "chained_optim_avoid_prefix": True},
        "optimizer": {"optimizer": {"param_groups": [
            {"lr": scheduler["max_lr"], "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "step": step,
             "wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False},
            {"lr": scheduler["max_lr"], "weight_decay": 0.0, "betas": (0.9, 0.999), "eps": 1e-8, "step": step,
             "wd_mult": 0.0, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False}]},
            "param_state_sharding_type": "fully_reshardable"},
        "rerun_state_machine": None,
    }
    out["common_state/shard_0_1"] = [megatron_common]

    iteration = destination / source.name
    if iteration.exists():
        shutil.rmtree(iteration)
    # Megatron-Core saves without flattening nested values (its objects stay whole bytes items).
    dcp.save(out, storage_writer=dcp.FileSystemWriter(str(iteration)),
             planner=dcp.DefaultSavePlanner(flatten_state_dict=False), no_dist=True)
    (iteration / "metadata.json").write_text(json.dumps(
        {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
         "common_backend_version": 1}))
    train_state = torch.load(source / "train_state.pt")
    torch.save(train_state, iteration / "train_state.pt")
    torch.save(train_state, destination / "latest_train_state.pt")
    (iteration / "run_config.yaml").write_text(
        "_target_: megatron.bridge.training.config.ConfigContainer\n"
        f"model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n"
        f"  tensor_model_parallel_size: {tp}\n  pipeline_model_parallel_size: {pp}\n"
        "checkpoint:\n  ckpt_format: torch_dist\n  save_optim: true\n  save_rng: true\n  fully_parallel_save: true\n")
    (destination / "latest_checkpointed_iteration.txt").write_text(str(common["iteration"]))
    print(json.dumps({"tensors": len([k for k, v in out.items() if isinstance(v, torch.Tensor)]),
                      "objects": sorted(k for k, v in out.items() if not isinstance(v, torch.Tensor))}))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
