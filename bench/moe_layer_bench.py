"""The Python side of moe_layer_bench.cpp: transformers' Qwen3MoeSparseMoeBlock (router, experts) of the shape of
gpt_train_bench --block qwen3_moe, forward and backward on [b, s, h] random input, timed whole and piece by piece
(the router; the experts with the routing fixed), with each experts_implementation transformers has on CPU
(grouped_mm, its default; eager, the loop over the experts hit; --implementations adds batched_mm). Prints one line
per piece:
  python_moe piece=<name> fwd_ms=<median> bwd_ms=<median> threads=<t> tokens=<T> ...

  .venv/bin/python3 bench/moe_layer_bench.py --hidden 768 --experts 8 --topk 2 --moe-ffn 384 --seq 64 \\
      --micro-batch 4 --threads 2
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402


def timed(forward, grad, iters):
    forward_ms, backward_ms = [], []
    for i in range(iters + 2):
        start = time.perf_counter()
        out = forward()
        middle = time.perf_counter()
        out.backward(grad.view(out.shape))
        end = time.perf_counter()
        if i >= 2:
            forward_ms.append((middle - start) * 1000)
            backward_ms.append((end - middle) * 1000)
    return statistics.median(forward_ms), statistics.median(backward_ms)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--topk", type=int, default=2)
    parser.add_argument("--moe-ffn", type=int, default=384)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--implementations", default="grouped_mm eager",
                        help="also batched_mm: one weight copy per token, seconds a layer")
    args, _ = parser.parse_known_args()  # gpt_train_bench's other shape flags are accepted and ignored
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    b, s, h = args.micro_batch, args.seq, args.hidden
    x = torch.randn(b, s, h)
    grad = torch.randn(b, s, h)
    for implementation in args.implementations.split():
        config = transformers.Qwen3MoeConfig(
            hidden_size=h, moe_intermediate_size=args.moe_ffn, num_experts=args.experts,
            num_experts_per_tok=args.topk, norm_topk_prob=True, num_hidden_layers=1, num_attention_heads=12,
            num_key_value_heads=4, vocab_size=128)
        config._experts_implementation = implementation
        block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config)
        for p in block.parameters():
            torch.nn.init.normal_(p, 0.0, 0.02)
        block.train()
        flat = x.view(-1, h)
        with torch.no_grad():
            _, weights, indices = block.gate(flat)

        def leaf(t):
            return t.detach().clone().requires_grad_(True)

        pieces = [("layer", lambda: block(leaf(x)), grad),
                  ("router", lambda: block.gate(leaf(flat))[1], torch.randn(b * s, args.topk)),
                  ("experts", lambda: block.experts(leaf(flat), indices, leaf(weights)), grad)]
        for name, forward, g in pieces:
            if name == "router" and implementation != args.implementations.split()[0]:
                continue
            fwd, bwd = timed(forward, g, args.iters)
            print(f"python_moe piece={name} fwd_ms={fwd:.3f} bwd_ms={bwd:.3f} threads={args.threads} "
                  f"tokens={b * s} experts={args.experts} implementation={implementation} "
                  f"torch={torch.__version__.split('+')[0]}", flush=True)


if __name__ == "__main__":
    main()
