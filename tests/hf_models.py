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
        # Families whose parts sit elsewhere, each found by the family's own code rather than by name:
        # OPT keeps its layers one level deeper (model.decoder.layers) and projects its embeddings;
        # Bloom normalises its embeddings before the first layer (the embedding stage owns that norm);
        # Gemma 3's text model names a base-model prefix it does not have; GPT-Neo's layer takes
        # `layer_id`; GPT-BigCode reads a layer's output as a tuple; Mixtral's layers hold experts.
        "opt": t.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=16,
            dropout=0.0,
            pad_token_id=0,
        ),
        "bloom": t.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=3, n_head=4, pad_token_id=0),
        "gemma3": t.Gemma3TextConfig(**small, head_dim=8, sliding_window=4, pad_token_id=0),
        "gpt_neo": t.GPTNeoConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=3,
            num_heads=4,
            attention_types=[[["global", "local"], 1], [["global"], 1]],
            max_position_embeddings=64,
            window_size=4,
            resid_dropout=0.0,
            embed_dropout=0.0,
            attention_dropout=0.0,
        ),
        "gpt_bigcode": t.GPTBigCodeConfig(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=3,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
        "mixtral": t.MixtralConfig(**small, num_local_experts=3, num_experts_per_tok=2),
    }


def save(name: str, where: Path, seed: int = 0, shard: str | None = None) -> Path:
    import torch

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs()[name])
    out = where / name
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    return out
