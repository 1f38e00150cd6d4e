"""Your own model for dapple_launch: a small causal language model over bytes.

Copy this file next to your data, change it, and run it as a custom model:

    python -m dapple_launch model=custom model.target=tiny_lm:build \\
        model.args={hidden:128,layers:4} data=text_file data.path=my_book.txt

A model is an ordered list of layers plus a per-sample loss (dapple_launch/models/contract.py).
Each layer is built only on the ranks whose pipeline stage holds it; what one layer returns is
what the next one takes (a tensor, or a tuple of tensors), across stages too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dapple_launch.models import LayerSpec, PipelineModel


class Embed(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq_len: int):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq_len, hidden)
        nn.init.normal_(self.token.weight, std=0.02)  # tied to the output: keep the first logits small
        nn.init.normal_(self.position.weight, std=0.01)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.token(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(n, t, h))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class TinyLM(PipelineModel):
    name = "tiny_lm"
    seq_len: int
    vocab_size: int

    def __init__(self, vocab: int = 256, hidden: int = 128, heads: int = 4, layers: int = 4, seq_len: int = 128):
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
        self.vocab_size, self.hidden, self.heads, self.num_layers, self.seq_len = vocab, hidden, heads, layers, seq_len

    def layers(self) -> list[LayerSpec]:
        v, h, s = self.vocab_size, self.hidden, self.seq_len
        return (
            [LayerSpec("embed", lambda: Embed(v, h, s))]
            + [LayerSpec(f"block{i}", lambda: Block(h, self.heads)) for i in range(self.num_layers)]
            + [LayerSpec("head", lambda: Head(v, h))]
        )

    def tied_parameters(self) -> list[list[str]]:
        # the output projection is the token embedding (as in GPT-2): one weight, stored once
        return [["layers.0.token.weight", f"layers.{self.num_layers + 1}.out.weight"]]

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        per_token = F.cross_entropy(output.flatten(0, 1), target.flatten(), reduction="none")
        return per_token.view(target.shape).mean(1)  # one loss per sample

    def batch(self, n: int, generator: torch.Generator | None = None, device="cpu"):
        ids = torch.randint(0, self.vocab_size, (n, self.seq_len + 1), generator=generator).to(device)
        return ids[:, :-1], ids[:, 1:]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "vocab": self.vocab_size,
            "hidden": self.hidden,
            "heads": self.heads,
            "layers": self.num_layers,
            "seq_len": self.seq_len,
        }


def build(vocab: int = 256, hidden: int = 128, heads: int = 4, layers: int = 4, seq_len: int = 128) -> TinyLM:
    return TinyLM(vocab, hidden, heads, layers, seq_len)
