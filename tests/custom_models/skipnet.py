"""A model written the way a user outside dapple_launch would: its layers pass a tuple across
stage boundaries (hidden states, a floating skip summary of another shape, and the integer token
ids) and its output projection is tied to its token embedding.

    python -m dapple_launch model=custom model.target=tests.custom_models.skipnet:build \\
        model.args={hidden:16,layers:4}
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
        self.position = nn.Parameter(torch.randn(seq_len, hidden) * 0.02)

    def forward(self, ids):
        h = self.token(ids) + self.position[: ids.shape[1]]
        return h, h.mean(1), ids  # float [n, t, d], float [n, d], int64 [n, t]


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        self.gate = nn.Linear(hidden, hidden)

    def forward(self, h, skip, ids):
        keep = (ids != 0).unsqueeze(-1).to(h.dtype)  # padding (id 0) positions get no update
        h = h + keep * (self.ff(self.norm(h)) + self.gate(skip).unsqueeze(1))
        return h, skip + 0.5 * h.mean(1), ids


class Head(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)  # its weight is the embedding's (tied_parameters)

    def forward(self, h, skip, ids):
        return self.out(self.norm(h + skip.unsqueeze(1)))


class SkipNet(PipelineModel):
    name = "skipnet"

    def __init__(self, vocab: int = 32, hidden: int = 16, layers: int = 4, seq_len: int = 8, tie: bool = True):
        self.vocab_size, self.hidden, self.num_layers, self.seq_len, self.tie = vocab, hidden, layers, seq_len, tie

    def layers(self):
        v, d = self.vocab_size, self.hidden
        return (
            [LayerSpec("embed", lambda: Embed(v, d, self.seq_len))]
            + [LayerSpec(f"block{i}", lambda: Block(d)) for i in range(self.num_layers)]
            + [LayerSpec("head", lambda: Head(v, d))]
        )

    def tied_parameters(self):
        return [["layers.0.token.weight", f"layers.{self.num_layers + 1}.out.weight"]] if self.tie else []

    def loss(self, output, target):
        per_token = F.cross_entropy(output.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)
        return per_token.mean(1)

    def batch(self, n, generator=None, device="cpu"):
        ids = torch.randint(1, self.vocab_size, (n, self.seq_len + 1), generator=generator)
        ids[:, 0] = 0  # a padding position: the integer member changes what the blocks do
        return ids[:, :-1].to(device), ids[:, 1:].to(device)

    def describe(self):
        return {
            "name": self.name,
            "vocab": self.vocab_size,
            "hidden": self.hidden,
            "layers": self.num_layers,
            "seq_len": self.seq_len,
            "tie": self.tie,
        }


def build(vocab: int = 32, hidden: int = 16, layers: int = 4, seq_len: int = 8, tie: bool = True) -> SkipNet:
    return SkipNet(vocab, hidden, layers, seq_len, tie)
