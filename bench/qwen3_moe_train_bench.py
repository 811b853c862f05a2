"""The Python reference for gpt_train_bench.cpp --block qwen3_moe: transformers' own Qwen3MoeForCausalLM (RMSNorm with
q/k RMSNorm, RoPE, grouped-query attention through scaled_dot_product_attention, every MLP a top-k mixture of SwiGLU
experts with the chosen probabilities renormalised, untied output layer, no biases) trained with the step of
gpt_train_bench.py (fused AdamW, clipping, the loss read back), in eager PyTorch. The load-balancing loss is
transformers' own (output_router_logits, router_aux_loss_coef, as Qwen3MoeForCausalLM adds it to the loss when it has
labels), added to the step's loss as bridge adds Megatron's (--aux-loss 0: none on either side). The model is the one
bridge builds from the same flags: the same parameter count, the vocabulary padded to a multiple of 128.
--experts-implementation picks transformers' experts kernel: default (what transformers chooses: grouped_mm where
torch has it), grouped_mm (one torch.nn.functional.grouped_mm over all experts), eager (the loop over the experts hit,
index_add_ back), batched_mm. Prints gpt_train_bench.py's lines, starting with "python" for the default and
"python_<implementation>" for an implementation named.

  .venv/bin/python3 bench/qwen3_moe_train_bench.py --layers 12 --hidden 768 --heads 12 --query-groups 4 \\
      --moe-ffn 384 --experts 8 --topk 2 --seq 64 --vocab 32000 --micro-batch 4 --steps 4 \\
      [--experts-implementation eager]
"""
import argparse
import os

os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

from gpt_train_bench import add_common_arguments, time_training  # noqa: E402


class Qwen3Moe(nn.Module):
    """Qwen3MoeForCausalLM behind gpt_train_bench.py's forward: per-token losses against given labels, as bridge's
    gpt_forward_step (no shift inside the model), each with the load-balancing loss added (the step's mean of them is
    then the language-model loss plus coeff x aux loss, Qwen3MoeForCausalLM's loss)."""

    def __init__(self, args, padded_vocab, experts_implementation):
        super().__init__()
        config = transformers.Qwen3MoeConfig(
            vocab_size=padded_vocab, hidden_size=args.hidden, intermediate_size=args.moe_ffn,
            moe_intermediate_size=args.moe_ffn, num_hidden_layers=args.layers, num_attention_heads=args.heads,
            num_key_value_heads=args.query_groups or args.heads, head_dim=args.hidden // args.heads,
            max_position_embeddings=args.seq, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 1000000.0},
            attention_dropout=0.0, tie_word_embeddings=False, attention_bias=False, num_experts=args.experts,
            num_experts_per_tok=args.topk, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            output_router_logits=args.aux_loss > 0, router_aux_loss_coef=args.aux_loss, use_cache=False)
        kwargs = {} if experts_implementation is None else {"experts_implementation": experts_implementation}
        self.qwen = transformers.Qwen3MoeForCausalLM._from_config(config, attn_implementation="sdpa", **kwargs)
        self.aux_loss_coeff = args.aux_loss

    def forward(self, tokens, position_ids, labels):
        out = self.qwen(input_ids=tokens, position_ids=position_ids, use_cache=False,
                        output_router_logits=self.aux_loss_coeff > 0)
        logits = out.logits  # [b, s, V]
        b, s, v = logits.shape
        losses = F.cross_entropy(logits.view(b * s, v), labels.view(-1), reduction="none").view(b, s)
        return losses + self.aux_loss_coeff * out.aux_loss if self.aux_loss_coeff > 0 else losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--query-groups", type=int, default=0, help="key/value heads (0: one per query head)")
    parser.add_argument("--experts", type=int, default=8, help="routed experts per layer")
    parser.add_argument("--topk", type=int, default=2, help="experts per token")
    parser.add_argument("--moe-ffn", type=int, default=384, help="one expert's SwiGLU width")
    parser.add_argument("--aux-loss", type=float, default=1e-3, help="the load-balancing loss's coefficient (0: none)")
    parser.add_argument("--experts-implementation", default="default",
                        choices=["default", "eager", "grouped_mm", "batched_mm"],
                        help="transformers' experts kernel (default: transformers' choice)")
    args = parser.parse_args()
    if args.attention != "auto":
        parser.error("transformers' Qwen3-MoE is timed with SDPA only (--attention auto)")
    if args.compile:
        parser.error("the MoE comparison is eager PyTorch only")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    padded_vocab = (args.vocab + 127) // 128 * 128  # make_vocab_size_divisible_by 128, tp 1
    requested = None if args.experts_implementation == "default" else args.experts_implementation
    model = Qwen3Moe(args, padded_vocab, requested)
    chosen = model.qwen.config._experts_implementation
    who = "python" if requested is None else f"python_{requested}"
    time_training(parser, args, model, sdpa=True, who=who, extra=f" block=qwen3_moe experts={chosen}")


if __name__ == "__main__":
    main()
