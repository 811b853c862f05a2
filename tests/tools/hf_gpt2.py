#!/usr/bin/env python3
"""Hugging Face transformers' own GPT-2, the reference for bridge's GPT-2 bridge (bridge/hf/gpt2.h). Never downloads:
the model is a tiny random one that transformers itself builds.

  hf_gpt2.py make DIR IDS LOGITS    a tiny GPT2LMHeadModel (every weight perturbed, so a swapped bias or norm shows)
                                    saved with save_pretrained to DIR; random token ids [2, 32] to IDS and the
                                    model's logits for them to LOGITS (safetensors files: "ids", "logits")
  hf_gpt2.py logits DIR IDS LOGITS  GPT2LMHeadModel.from_pretrained(DIR)'s logits for the ids of IDS
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

VOCAB, POSITIONS = 301, 32  # a vocabulary that no tensor-parallel padding divides


def logits_of(model, ids):
    with torch.no_grad():
        return model(ids).logits.float().contiguous()


def make(directory, ids_path, logits_path):
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=64, n_layer=4, n_head=4,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # the tied lm_head once
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(directory)
    ids = torch.randint(0, VOCAB, (2, POSITIONS))
    save_file({"ids": ids}, ids_path)
    save_file({"logits": logits_of(model, ids)}, logits_path)


def logits(directory, ids_path, logits_path):
    model = GPT2LMHeadModel.from_pretrained(directory, local_files_only=True).float().eval()
    save_file({"logits": logits_of(model, load_file(ids_path)["ids"])}, logits_path)


if __name__ == "__main__":
    {"make": make, "logits": logits}[sys.argv[1]](*sys.argv[2:5])
