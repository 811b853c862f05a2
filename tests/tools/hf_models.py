#!/usr/bin/env python3
"""Hugging Face transformers' own models, the reference for bridge's Hugging Face bridges (bridge/hf/). Never
downloads: each model is a tiny random one that transformers itself builds.

  hf_models.py make FAMILY DIR              a tiny model of FAMILY (every weight perturbed, so a swapped bias or norm
                                           shows) saved with save_pretrained to DIR/hf, llama's with a byte-level BPE
                                           tokenizer (tokenizer.json, tokenizer_config.json) made here; random token
                                           ids [2, 32] to DIR/ids.safetensors, the model's logits for them to
                                           DIR/logits.safetensors and the greedy continuation of PROMPT (its bytes, or
                                           its tokens where the model has a tokenizer) by 6 tokens (as `generate`;
                                           tests/dist/gpt_worker.cpp's TextGenerator prompt) to
                                           DIR/generated.safetensors ("ids", "tokens")
  hf_models.py logits DIR IDS LOGITS        AutoModelForCausalLM.from_pretrained(DIR)'s logits for the ids of IDS
  hf_models.py exported SOURCE DIR IDS LOGITS
                                           logits as above for DIR, an export of a model trained from SOURCE, and
                                           checks that DIR keeps what SOURCE had beside the weights: the context
                                           (max_position_embeddings), bos/eos ids, generation_config and, where SOURCE
                                           has one, a tokenizer that AutoTokenizer loads and that encodes TEXT as
                                           SOURCE's does; prints each difference and exits 1 if there is one
  hf_models.py generate DIR IDS OUT N       greedy continuation of IDS' first row by N tokens ("tokens" in OUT),
                                           never an id of 257 or more (bridge's byte-level TextGenerator's rule)
  hf_models.py rope OUT DIR...              transformers' own RoPE parameters of each DIR's config.json
                                           (AutoConfig, then modeling_rope_utils' ROPE_INIT_FUNCTIONS of its
                                           rope_type): "inv_freq<i>" [dim / 2] fp32 and "attention_factor<i>" [1]
                                           fp64 of the i-th DIR to OUT
  hf_models.py fused SOURCE DIR             SOURCE saved to DIR as transformers 5.x holds it in memory
                                           (save_original_format=False): an MoE model's experts fused,
                                           mlp.experts.gate_up_proj [E, 2F, H] and down_proj [E, H, F], its router
                                           mlp.gate (Mixtral's too)

FAMILY: gpt2; llama (grouped-query attention, untied, Llama 3's rope_theta, a tokenizer); llama31 (Llama 3.1's
rope scaling, tied embeddings, a context of 128); mistral; qwen2 (QKV biases); qwen3 (q/k norms, a head width of its
own); qwen3_yarn (Qwen3 with
YaRN's rope_parameters as Qwen3's long-context configs carry them: factor 4 over an original 4096 positions, so the
attention factor 0.1 ln 4 + 1 scales every score); and the Mixture-of-Experts families, each with 4 experts of which a token takes 2: qwen3_moe (renormalised
weights, layer 1 dense), qwen2_moe (weights not renormalised, a gated shared expert, every second layer MoE),
mixtral and olmoe (q/k norms over all heads: model.qk_layernorm_across_heads). Their routers' weights are scaled up (x10) after
the perturbation, so that no token's k-th and (k+1)-th experts are near a tie that round-off could swap between
transformers and bridge; their experts run transformers' eager loop (experts_implementation="eager").
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
import transformers  # noqa: E402

VOCAB, POSITIONS = 301, 32  # a vocabulary that no tensor-parallel padding divides
PROMPT = "Once upon a time"  # what the TextGenerator continues in tests/dist/gpt_worker.cpp
TEXT = "Once upon a time, the tokenizer of an export read this text."  # what `exported` encodes with both
# What llama's tokenizer is trained on: 256 byte tokens, two special ones and 43 merges make VOCAB.
CORPUS = ["Once upon a time there was a tiny model that learned to read.",
          "The quick brown fox jumps over the lazy dog, and the dog sleeps on.",
          "Hugging Face directories hold config.json, the weights and the tokenizer files."] * 4

# Four layers, hidden 64, 4 query heads in 2 key/value groups (at tp2 each rank holds one group).
LLAMA_SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS,
                   rms_norm_eps=1e-5, attention_dropout=0.0)
MOE = dict(num_experts=4, num_experts_per_tok=2)  # 4 experts: expert parallelism 2 holds 2 on each rank
ROUTER_SCALE = 10.0  # the routers' weights after the perturbation: wide margins between the k-th and next expert


def config_of(family):
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=64, n_layer=4, n_head=4,
                                       activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    if family == "llama":  # bos and eos are its tokenizer's
        return transformers.LlamaConfig(**LLAMA_SHAPE, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                                        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    if family == "llama31":
        # Small original context so that every band of the scaling (kept, blended, divided) has frequencies.
        return transformers.LlamaConfig(**{**LLAMA_SHAPE, "max_position_embeddings": 128}, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 64})
    if family == "mistral":
        return transformers.MistralConfig(**LLAMA_SHAPE, sliding_window=None, tie_word_embeddings=False)
    if family == "qwen2":
        return transformers.Qwen2Config(**LLAMA_SHAPE, tie_word_embeddings=False, use_sliding_window=False)
    if family == "qwen3":
        return transformers.Qwen3Config(**LLAMA_SHAPE, head_dim=24, tie_word_embeddings=False,
                                        use_sliding_window=False)
    if family == "qwen3_yarn":  # the context the factor gives; the ramp's band is dimensions 3 to 9 of 12
        return transformers.Qwen3Config(**{**LLAMA_SHAPE, "max_position_embeddings": 4 * 4096}, head_dim=24,
                                        tie_word_embeddings=False, use_sliding_window=False,
                                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                         "original_max_position_embeddings": 4096})
    if family == "qwen3_moe":  # layer 1 in mlp_only_layers: a dense MLP of intermediate_size between MoE layers
        return transformers.Qwen3MoeConfig(**LLAMA_SHAPE, **MOE, head_dim=24, moe_intermediate_size=32,
                                           norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False,
                                           use_sliding_window=False)
    if family == "qwen2_moe":  # decoder_sparse_step 2: layers 1 and 3 MoE, 0 and 2 dense
        return transformers.Qwen2MoeConfig(**LLAMA_SHAPE, **MOE, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, norm_topk_prob=False,
                                           decoder_sparse_step=2, tie_word_embeddings=False, use_sliding_window=False)
    if family == "mixtral":  # intermediate_size is each expert's
        return transformers.MixtralConfig(**{**LLAMA_SHAPE, "intermediate_size": 32}, num_local_experts=4,
                                          num_experts_per_tok=2, router_aux_loss_coef=0.01, sliding_window=None,
                                          tie_word_embeddings=False)
    if family == "olmoe":
        return transformers.OlmoeConfig(**{**LLAMA_SHAPE, "intermediate_size": 32}, **MOE, tie_word_embeddings=False,
                                        pad_token_id=None, eos_token_id=None)
    raise SystemExit(f"unknown family {family}")


def tokenizer_of(family):
    """A Llama-3-like tokenizer (byte-level BPE, BOS added by TemplateProcessing) trained here, or None."""
    if family != "llama":
        return None
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 0)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                                eos_token="<|end_of_text|>")


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits.float().contiguous()


def make(family, directory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_of(family), attn_implementation="eager",
                                                          experts_implementation="eager").eval()
    with torch.no_grad():
        for parameter in model.parameters():  # a tied lm_head once
            parameter.add_(0.05 * torch.randn_like(parameter))
        for name, parameter in model.named_parameters():  # the routers (transformers 5.x names every family's so)
            if name.endswith(".mlp.gate.weight"):
                parameter.mul_(ROUTER_SCALE)
    model.save_pretrained(os.path.join(directory, "hf"))
    tokenizer = tokenizer_of(family)
    if tokenizer is not None:
        tokenizer.save_pretrained(os.path.join(directory, "hf"))
    ids = torch.randint(0, VOCAB, (2, POSITIONS))
    save_file({"ids": ids}, os.path.join(directory, "ids.safetensors"))
    save_file({"logits": logits_of(model, ids)}, os.path.join(directory, "logits.safetensors"))
    # The TextGenerator encodes the prompt with the run's tokenizer (an hf: start's tokenizer.json), else as bytes.
    prompt = torch.tensor([tokenizer(PROMPT).input_ids if tokenizer is not None else list(PROMPT.encode())])
    tokens = greedy(model, prompt, 6, len(tokenizer) if tokenizer is not None else 257)
    save_file({"ids": prompt, "tokens": tokens}, os.path.join(directory, "generated.safetensors"))


def load(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                             attn_implementation="eager",
                                                             experts_implementation="eager").float().eval()


def logits(directory, ids_path, logits_path):
    save_file({"logits": logits_of(load(directory), load_file(ids_path)["ids"])}, logits_path)


def greedy(model, prompt, tokens, known=257):
    with torch.no_grad():
        # bridge's TextGenerator never picks ids its tokenizer lacks (the byte-level one's: 257 and up): neither may
        # this.
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                             suppress_tokens=list(range(known, VOCAB)) or None, eos_token_id=None)
    return out[0, prompt.shape[1]:].contiguous()


def exported(source, directory, ids_path, logits_path):
    logits(directory, ids_path, logits_path)
    differences = []

    def same(what, theirs, ours):
        if theirs != ours:
            differences.append(f"{what}: the source's {theirs!r}, the export's {ours!r}")

    theirs, ours = (transformers.AutoConfig.from_pretrained(d, local_files_only=True) for d in (source, directory))
    for key in ("max_position_embeddings", "n_positions", "bos_token_id", "eos_token_id", "pad_token_id"):
        same(f"config.json's {key}", getattr(theirs, key, None), getattr(ours, key, None))
    if not os.path.exists(os.path.join(directory, "generation_config.json")):
        differences.append("the export has no generation_config.json")
    else:
        generation = [transformers.GenerationConfig.from_pretrained(d, local_files_only=True).to_diff_dict()
                      for d in (source, directory)]
        same("generation_config.json", *generation)
    if os.path.exists(os.path.join(source, "tokenizer.json")):
        theirs = transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
        try:
            ours = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as error:
            differences.append(f"AutoTokenizer does not load the export: {error}")
        else:
            same(f"the ids of {TEXT!r}", theirs(TEXT).input_ids, ours(TEXT).input_ids)
            same("the tokenizer's bos/eos", (theirs.bos_token_id, theirs.eos_token_id),
                 (ours.bos_token_id, ours.eos_token_id))
            same("the tokenizer's size", len(theirs), len(ours))
    for difference in differences:
        print(difference)
    if differences:
        raise SystemExit(1)
    print("the export keeps the context, token ids, generation_config and tokenizer of", source)


def generate(directory, ids_path, out_path, tokens):
    save_file({"tokens": greedy(load(directory), load_file(ids_path)["ids"][:1], int(tokens))}, out_path)


def rope(out_path, *directories):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    tensors = {}
    for i, directory in enumerate(directories):
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu")
        tensors[f"inv_freq{i}"] = inv_freq.float().contiguous()
        tensors[f"attention_factor{i}"] = torch.tensor([attention_factor], dtype=torch.float64)
    save_file(tensors, out_path)


def fused(source, directory):
    load(source).save_pretrained(directory, save_original_format=False)


if __name__ == "__main__":
    commands = {"make": make, "logits": logits, "exported": exported, "generate": generate, "fused": fused,
                "rope": rope}
    commands[sys.argv[1]](*sys.argv[2:])
