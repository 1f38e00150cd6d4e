"""Tiny Hugging Face models made with `transformers` and saved with `save_pretrained`, as a user's
directory would hold them (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")

VOCAB = 61
# A three-layer model of width 32, in each family's own argument names (also benchmarks/hf_families.py's)
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
GPT = dict(
    vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
)
GPT_NEO = dict(
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
)
OPT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    ffn_dim=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=64,
    word_embed_proj_dim=16,
    dropout=0.0,
    pad_token_id=0,
)
BLOOM = dict(vocab_size=VOCAB, hidden_size=32, n_layer=3, n_head=4, pad_token_id=0)


def configs() -> dict:
    t = transformers
    return {
        "llama": t.LlamaConfig(**SMALL, tie_word_embeddings=False),
        "llama-tied": t.LlamaConfig(**SMALL, tie_word_embeddings=True),
        "gpt2": t.GPT2Config(**GPT),
        # full and sliding-window layers mixed, soft-capped logits, a scaled embedding: the family's own code
        "gemma2": t.Gemma2Config(**SMALL, head_dim=8, sliding_window=4),
        "qwen2": t.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1),
        # Families whose parts sit elsewhere, each found by the family's own code rather than by name:
        # OPT keeps its layers one level deeper (model.decoder.layers) and projects its embeddings;
        # Bloom normalises its embeddings before the first layer (the embedding stage owns that norm);
        # Gemma 3's text model names a base-model prefix it does not have; GPT-Neo's layer takes
        # `layer_id`; GPT-BigCode reads a layer's output as a tuple; Mixtral's layers hold experts.
        "opt": t.OPTConfig(**OPT),
        "bloom": t.BloomConfig(**BLOOM),
        "gemma3": t.Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=4, pad_token_id=0),
        "gpt_neo": t.GPTNeoConfig(**GPT_NEO),
        "gpt_bigcode": t.GPTBigCodeConfig(**GPT),
        "mixtral": t.MixtralConfig(**SMALL, num_local_experts=3, num_experts_per_tok=2),
    }


def layers_against_hf(path: Path, seq_len: int = 8, batch: int = 3) -> dict:
    """The model in `path` cut into the pipeline's layers (model=hf) and run one after another in one
    process, and HF's own model, on the same batch: each one's loss, logits and gradients by HF's
    parameter names (a tied head's gradient added to the embedding's, as the runtime sums them).
    Both losses are the pipeline's per-sample loss on the logits (not every family takes
    shift_labels)."""
    import torch

    from dapple_launch.models.contract import build_layer, run_layers
    from dapple_launch.models.hf import HFCausalLM

    model = HFCausalLM(path=str(path), seq_len=seq_len)
    x, y = model.batch(batch, torch.Generator().manual_seed(1))
    ref = transformers.AutoModelForCausalLM.from_pretrained(path).train()
    hf_logits = ref(input_ids=x).logits
    hf_loss = model.loss(hf_logits, y).mean()
    hf_loss.backward()
    hf_grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}

    layers = [build_layer(spec, i, 0).train() for i, spec in enumerate(model.layers())]
    logits = run_layers(layers, x)
    loss = model.loss(logits, y).mean()
    loss.backward()
    grads: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters():
            hf = model.hf_name(i, name)
            if hf not in hf_grads and model.anatomy.tied:
                hf = f"{model.anatomy.input_name}.weight"  # the tied head is HF's embedding: its gradients add
            if p.grad is not None:
                grads[hf] = grads[hf] + p.grad if hf in grads else p.grad
    return {
        "model": model,
        "loss": loss.item(),
        "hf_loss": hf_loss.item(),
        "logits": logits.detach(),
        "hf_logits": hf_logits.detach(),
        "grads": grads,
        "hf_grads": hf_grads,
    }


def save(name: str, where: Path, seed: int = 0, shard: str | None = None) -> Path:
    import torch

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs()[name])
    out = where / name
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    return out
