#!/usr/bin/env python3
"""Hugging Face transformers' own models, the reference for bridge's Hugging Face bridges (bridge/hf/). Never
downloads: each model is a tiny random one that transformers itself builds.

  hf_models.py make FAMILY DIR              a tiny model of FAMILY (every weight perturbed, so a swapped bias or norm
                                           shows) saved with save_pretrained to DIR/hf; random token ids [2, 32] to
                                           DIR/ids.safetensors, the model's logits for them to DIR/logits.safetensors
                                           and the greedy continuation of PROMPT's bytes by 6 tokens (as `generate`;
                                           tests/dist/gpt_worker.cpp's TextGenerator prompt) to
                                           DIR/generated.safetensors ("ids", "tokens")
  hf_models.py logits DIR IDS LOGITS        AutoModelForCausalLM.from_pretrained(DIR)'s logits for the ids of IDS
  hf_models.py generate DIR IDS OUT N       greedy continuation of IDS' first row by N tokens ("tokens" in OUT),
                                           never an id of 257 or more (bridge's byte-level TextGenerator's rule)

FAMILY: gpt2; llama (grouped-query attention, untied, Llama 3's rope_theta); llama31 (Llama 3.1's rope scaling,
tied embeddings); mistral; qwen2 (QKV biases); qwen3 (q/k norms, a head width of its own).
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
import transformers  # noqa: E402

VOCAB, POSITIONS = 301, 32  # a vocabulary that no tensor-parallel padding divides
PROMPT = "Once upon a time"  # what the TextGenerator continues in tests/dist/gpt_worker.cpp, byte by byte

# Four layers, hidden 64, 4 query heads in 2 key/value groups (at tp2 each rank holds one group).
LLAMA_SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS,
                   rms_norm_eps=1e-5, attention_dropout=0.0)


def config_of(family):
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=64, n_layer=4, n_head=4,
                                       activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    if family == "llama":
        return transformers.LlamaConfig(**LLAMA_SHAPE, tie_word_embeddings=False,
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
    raise SystemExit(f"unknown family {family}")


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits.float().contiguous()


def make(family, directory):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_of(family), attn_implementation="eager").eval()
    with torch.no_grad():
        for parameter in model.parameters():  # a tied lm_head once
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(os.path.join(directory, "hf"))
    ids = torch.randint(0, VOCAB, (2, POSITIONS))
    save_file({"ids": ids}, os.path.join(directory, "ids.safetensors"))
    save_file({"logits": logits_of(model, ids)}, os.path.join(directory, "logits.safetensors"))
    prompt = torch.tensor([list(PROMPT.encode())])
    save_file({"ids": prompt, "tokens": greedy(model, prompt, 6)}, os.path.join(directory, "generated.safetensors"))


def load(directory):
    return transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True,
                                                             attn_implementation="eager").float().eval()


def logits(directory, ids_path, logits_path):
    save_file({"logits": logits_of(load(directory), load_file(ids_path)["ids"])}, logits_path)


def greedy(model, prompt, tokens):
    with torch.no_grad():
        # bridge's byte-level TextGenerator never picks ids its tokenizer lacks (257 and up): neither may this.
        out = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0,
                             suppress_tokens=list(range(257, VOCAB)), eos_token_id=None)
    return out[0, prompt.shape[1]:].contiguous()


def generate(directory, ids_path, out_path, tokens):
    save_file({"tokens": greedy(load(directory), load_file(ids_path)["ids"][:1], int(tokens))}, out_path)


if __name__ == "__main__":
    commands = {"make": make, "logits": logits, "generate": generate}
    commands[sys.argv[1]](*sys.argv[2:])
