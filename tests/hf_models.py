"""Tiny Hugging Face models made with `transformers` and saved with `save_pretrained`, as a user's
directory would hold them (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

VOCAB = 61


def configs() -> dict:
    t = transformers
    small = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return {
        "llama": t.LlamaConfig(**small, tie_word_embeddings=False),
        "llama-tied": t.LlamaConfig(**small, tie_word_embeddings=True),
        "gpt2": t.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
        # full and sliding-window layers mixed, soft-capped logits, a scaled embedding: the family's own code
        "gemma2": t.Gemma2Config(**small, head_dim=8, sliding_window=4),
        "qwen2": t.Qwen2Config(**small, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    }


def save(name: str, where: Path, seed: int = 0, shard: str | None = None) -> Path:
    import torch

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs()[name])
    out = where / name
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    return out
