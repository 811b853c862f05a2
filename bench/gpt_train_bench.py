"""The Python PyTorch reference for gpt_train_bench.cpp: the same GPT and training step as bridge's pretrain() with
tp = pp = dp = 1, op for op and shape for shape, on the same LibTorch (Debian's python3-torch 1.13), so that the
ratio of the two isolates what bridge's C++ loop costs or saves. run_gpt_train_bench.sh runs both side by side.
Attention is scaled_dot_product_attention where the LibTorch has it (2.x), as bridge's AttnBackend::kAuto, or the
explicit softmax with --attention unfused; --adamw picks torch.optim.AdamW's implementation (fused by default, the
kernel bridge's FusedAdamW runs on LibTorch 2.x; 1.x has only the loop); --dtype bf16 keeps the model and optimizer in
bfloat16; --compile runs the model under torch.compile; --profile TRACE.json records the timed steps with torch.profiler
(bench/trace_ops.py sums such a trace by operator, beside one of bridge's Profiler callback).
Prints one machine-readable line ("python_compile" under --compile):
  python tokens_per_s=<x> step_ms=<median> best_ms=<fastest step> steps=<n> threads=<t> params=<count> ...
      peak_rss_mb=<peak resident>

  /usr/bin/python3 bench/gpt_train_bench.py --layers 12 --hidden 768 --heads 12 --seq 64 --vocab 50257 \
      --micro-batch 4 --steps 4
"""
import argparse
import math
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, std, out_std, sdpa):
        super().__init__()
        self.heads, self.head_dim, self.sdpa = heads, hidden // heads, sdpa
        self.linear_qkv = nn.Linear(hidden, 3 * hidden)
        self.linear_proj = nn.Linear(hidden, hidden)
        init_linear(self.linear_qkv, std)
        init_linear(self.linear_proj, out_std)

    def forward(self, x):  # x: [s, b, h]
        s, b, h = x.shape
        # Megatron-Core's layout, grouped by head ([q k v] per head), as bridge's view/narrow/select/permute.
        qkv = self.linear_qkv(x).view(s, b, self.heads, 3, self.head_dim)
        q = qkv.narrow(3, 0, 1).reshape(s, b, self.heads, self.head_dim).permute(1, 2, 0, 3)
        k, v = qkv.select(3, 1).permute(1, 2, 0, 3), qkv.select(3, 2).permute(1, 2, 0, 3)
        if self.sdpa:
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.linear_proj(context.permute(2, 0, 1, 3).reshape(s, b, h))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        # Built every call, as bridge does, so both pay for it.
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        context = torch.matmul(probs, v).permute(2, 0, 1, 3).reshape(s, b, h)
        return self.linear_proj(context)


class TransformerLayer(nn.Module):
    def __init__(self, hidden, heads, ffn, std, out_std, eps, sdpa):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden, eps=eps)
        self.self_attention = SelfAttention(hidden, heads, std, out_std, sdpa)
        self.pre_mlp_layernorm = nn.LayerNorm(hidden, eps=eps)
        self.linear_fc1 = nn.Linear(hidden, ffn)
        self.linear_fc2 = nn.Linear(ffn, hidden)
        init_linear(self.linear_fc1, std)
        init_linear(self.linear_fc2, out_std)

    def forward(self, x):
        residual = x + self.self_attention(self.input_layernorm(x))
        return residual + self.linear_fc2(F.gelu(self.linear_fc1(self.pre_mlp_layernorm(residual))))


def init_linear(linear, std):
    # Megatron's init, as bridge: normal weights (std / sqrt(2L) for output projections), zero biases.
    nn.init.normal_(linear.weight, 0.0, std)
    nn.init.zeros_(linear.bias)


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, padded_vocab, sdpa, eps=1e-5, std=0.02):
        super().__init__()
        out_std = std / math.sqrt(2.0 * layers)
        self.word_embeddings = nn.Embedding(padded_vocab, hidden)
        self.position_embeddings = nn.Embedding(seq, hidden)
        nn.init.normal_(self.word_embeddings.weight, 0.0, std)
        nn.init.normal_(self.position_embeddings.weight, 0.0, std)
        self.layers = nn.ModuleList(
            TransformerLayer(hidden, heads, 4 * hidden, std, out_std, eps, sdpa) for _ in range(layers))
        self.final_layernorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, tokens, position_ids, labels):  # [b, s] each; returns the per-token loss [b, s]
        x = (self.word_embeddings(tokens) + self.position_embeddings(position_ids)).transpose(0, 1).contiguous()
        for layer in self.layers:
            x = layer(x)
        logits = F.linear(self.final_layernorm(x), self.word_embeddings.weight)  # tied: [s, b, V]
        s, b, v = logits.shape
        losses = F.cross_entropy(logits.view(s * b, v), labels.transpose(0, 1).reshape(-1), reduction="none")
        return losses.view(s, b).transpose(0, 1).contiguous()


def add_common_arguments(parser):
    """The flags every Python side of run_gpt_train_bench.sh takes, as gpt_train_bench.cpp's."""
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention", choices=["auto", "unfused"], default="auto",
                        help="auto: scaled_dot_product_attention where torch has it; unfused: explicit softmax")
    parser.add_argument("--adamw", choices=["loop", "foreach", "fused"], default=None,
                        help="torch.optim.AdamW's implementation (default: fused on torch 2.x, as bridge; else loop)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--compile", action="store_true",
                        help="the model under torch.compile (its first steps, untimed, compile it)")
    parser.add_argument("--profile", metavar="TRACE.json", default=None,
                        help="record the timed steps with torch.profiler into a Chrome trace (slows them: for where "
                             "the time goes, not for tokens/s); bench/trace_ops.py sums it by operator")


def time_training(parser, args, model, sdpa, who="python", extra=""):
    """Trains `model` (forward(tokens, position_ids, labels) -> per-token losses [b, s]) as bridge's pretrain() step
    does and prints the timing lines; `who` starts them, `extra` is appended to the last."""
    if args.adamw is None:
        args.adamw = "fused" if torch.__version__.startswith("2") else "loop"
    if args.adamw != "loop" and not torch.__version__.startswith("2"):
        parser.error(f"--adamw {args.adamw} needs torch 2.x, this is {torch.__version__}")
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    params = list(model.parameters())
    # bridge's build_optimizer: decay on matrices, none on biases and norm weights; config.optimizer's defaults.
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    implementation = {} if args.adamw == "loop" and not torch.__version__.startswith("2") else {
        "foreach": args.adamw == "foreach", "fused": args.adamw == "fused"}
    optimizer = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, **implementation)
    num_params = sum(p.numel() for p in params)

    b, s = args.micro_batch, args.seq
    generator = torch.Generator().manual_seed(1234)
    phases = ["zero", "fwd", "bwd", "clip", "opt", "rest"]  # as gpt_train_bench.cpp's phases_ms
    step_ms, phase_ms = [], {phase: [] for phase in phases}
    first_loss = float("nan")
    profiler = None
    for step in range(args.warmup_steps + args.steps):
        if args.profile and step == args.warmup_steps:
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            profiler.__enter__()
        step_range = torch.profiler.record_function(f"ProfilerStep#{step + 1}") if profiler else None
        if step_range:
            step_range.__enter__()
        marks = [time.perf_counter()]
        # In place, as bridge's zero_grad_buffer (torch 2.x's default would free them): backward then accumulates.
        optimizer.zero_grad(set_to_none=False)
        marks.append(time.perf_counter())
        # Drawn inside the step, as bridge's gpt_forward_step draws its micro-batch.
        text = torch.randint(args.vocab, (b, s + 1), generator=generator)
        tokens, labels = text[:, :s].contiguous(), text[:, 1:].contiguous()
        loss_mask = torch.ones(b, s)
        position_ids = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
        losses = model(tokens, position_ids, labels)
        loss_sum, num_tokens = (losses.float() * loss_mask).sum(), loss_mask.sum()
        loss = loss_sum / num_tokens
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        marks.append(time.perf_counter())
        optimizer.step()
        marks.append(time.perf_counter())
        # bridge reads the reported loss back inside its step (reduce_losses); so does this.
        loss = loss_sum.item() / num_tokens.item()
        marks.append(time.perf_counter())
        if step_range:
            step_range.__exit__(None, None, None)
        if step == 0:
            first_loss = loss
        if step >= args.warmup_steps:
            step_ms.append((marks[-1] - marks[0]) * 1000)
            for phase, (a, z) in zip(phases, zip(marks, marks[1:])):
                phase_ms[phase].append((z - a) * 1000)

    if profiler is not None:
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(args.profile)
    ms = statistics.median(step_ms)
    print(f"{who} first_loss={first_loss:.4f} ln_vocab={math.log(args.vocab):.4f}")
    print(f"{who} phases_ms " + " ".join(f"{p}={statistics.median(v):.2f}" for p, v in phase_ms.items()))
    print(f"{who} tokens_per_s={b * s / (ms / 1000):.1f} step_ms={ms:.2f} best_ms={min(step_ms):.2f} "
          f"steps={len(step_ms)} threads={args.threads} params={num_params} attention={'sdpa' if sdpa else 'unfused'} "
          f"adamw={args.adamw} dtype={args.dtype} torch={torch.__version__.split('+')[0]} "
          f"peak_rss_mb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}{extra}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    args = parser.parse_args()
    sdpa = args.attention == "auto" and hasattr(F, "scaled_dot_product_attention")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    padded_vocab = (args.vocab + 127) // 128 * 128  # make_vocab_size_divisible_by 128, tp 1
    model = GPT(args.layers, args.hidden, args.heads, args.seq, padded_vocab, sdpa)
    time_training(parser, args, torch.compile(model) if args.compile else model, sdpa,
                  who="python_compile" if args.compile else "python")


if __name__ == "__main__":
    main()
