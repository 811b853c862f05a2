"""The Python side of adamw_step_bench.cpp: torch.optim.AdamW's step on GPT-2 124M's parameters (same shapes, two
groups), for each implementation this torch has: "loop" (per parameter, what torch::optim::AdamW does), "foreach"
and "fused" (torch 2.x). Alternates them step by step. Prints one line per implementation:
  python_adamw impl=<loop|foreach|fused> step_ms=<median> min_ms=<min> max_ms=<max> steps=<n> threads=<t> params=<n>
"""
import argparse
import statistics
import time

import torch


def gpt_parameters(layers, hidden, seq, padded_vocab):
    shapes = [(padded_vocab, hidden), (seq, hidden)]
    for _ in range(layers):
        shapes += [(hidden,), (hidden,), (3 * hidden, hidden), (3 * hidden,), (hidden, hidden), (hidden,), (hidden,),
                   (hidden,), (4 * hidden, hidden), (4 * hidden,), (hidden, 4 * hidden), (hidden,)]
    shapes += [(hidden,), (hidden,)]
    return [(0.02 * torch.randn(shape)).requires_grad_(True) for shape in shapes]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    params = gpt_parameters(args.layers, args.hidden, args.seq, args.vocab)
    for p in params:
        p.grad = 1e-3 * torch.randn_like(p)
    impls = ["loop"] + (["foreach", "fused"] if torch.__version__.startswith("2") else [])
    optimizers = {}
    for impl in impls:
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        kwargs = {} if impl == "loop" and len(impls) == 1 else {"foreach": impl == "foreach", "fused": impl == "fused"}
        optimizers[impl] = torch.optim.AdamW(groups, lr=1e-4, **kwargs)
    times = {impl: [] for impl in impls}
    with torch.no_grad():
        for step in range(-1, args.steps):  # step -1: state allocation, untimed
            for impl, optimizer in optimizers.items():
                start = time.perf_counter()
                optimizer.step()
                if step >= 0:
                    times[impl].append((time.perf_counter() - start) * 1000)
    count = sum(p.numel() for p in params)
    for impl, ms in times.items():
        print(f"python_adamw impl={impl} step_ms={statistics.median(ms):.2f} min_ms={min(ms):.2f} max_ms={max(ms):.2f} "
              f"steps={len(ms)} threads={args.threads} params={count}", flush=True)


if __name__ == "__main__":
    main()
