"""The Python reference for gpt_train_bench.cpp --block llama: transformers' own LlamaForCausalLM (RMSNorm, RoPE,
SwiGLU, grouped-query attention through scaled_dot_product_attention, untied output layer, no biases) trained with
the step of gpt_train_bench.py (fused AdamW, clipping, the loss read back), eager or under torch.compile. The model
is the one bridge builds from the same flags: the same parameter count, the vocabulary padded to a multiple of 128.
Prints gpt_train_bench.py's lines, starting with "python" (eager) or "python_compile".

  .venv/bin/python3 bench/llama_train_bench.py --layers 12 --hidden 768 --heads 12 --query-groups 4 --ffn 2048 \\
      --seq 64 --vocab 50257 --micro-batch 4 --steps 4 [--compile]
"""
import argparse
import os

os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

from gpt_train_bench import add_common_arguments, time_training  # noqa: E402


class Llama(nn.Module):
    """LlamaForCausalLM behind gpt_train_bench.py's forward: per-token losses against given labels, as bridge's
    gpt_forward_step (no shift inside the model)."""

    def __init__(self, args, padded_vocab):
        super().__init__()
        config = transformers.LlamaConfig(
            vocab_size=padded_vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
            num_hidden_layers=args.layers, num_attention_heads=args.heads,
            num_key_value_heads=args.query_groups or args.heads, max_position_embeddings=args.seq,
            rms_norm_eps=1e-5, attention_dropout=0.0, tie_word_embeddings=False, attention_bias=False,
            mlp_bias=False, use_cache=False)
        self.llama = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")

    def forward(self, tokens, position_ids, labels):
        logits = self.llama(input_ids=tokens, position_ids=position_ids, use_cache=False).logits  # [b, s, V]
        b, s, v = logits.shape
        return F.cross_entropy(logits.view(b * s, v), labels.view(-1), reduction="none").view(b, s)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--query-groups", type=int, default=0, help="key/value heads (0: one per query head)")
    parser.add_argument("--ffn", type=int, default=2048, help="the SwiGLU's intermediate size")
    args = parser.parse_args()
    if args.attention != "auto":
        parser.error("transformers' Llama is timed with SDPA only (--attention auto)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    padded_vocab = (args.vocab + 127) // 128 * 128  # make_vocab_size_divisible_by 128, tp 1
    model = Llama(args, padded_vocab)
    if args.compile:
        model = torch.compile(model)
    time_training(parser, args, model, sdpa=True, who="python_compile" if args.compile else "python",
                  extra=" block=llama")


if __name__ == "__main__":
    main()
