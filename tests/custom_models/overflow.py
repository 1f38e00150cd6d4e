"""A model whose fp16 forward overflows: under 16-mixed every step's loss is inf or NaN, so every
step must be skipped on every rank with the weights untouched (tests/test_precision.py)."""

from __future__ import annotations

import torch
from torch import nn

from dapple_launch.models import LayerSpec, PipelineModel


class Amplify(nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.gain = nn.Parameter(torch.full((8,), factor))

    def forward(self, x):
        return x * self.gain  # beyond fp16's 65504 under autocast: inf


class Overflow(PipelineModel):
    name = "overflow"

    def layers(self):
        return [
            LayerSpec("in", lambda: nn.Linear(8, 8)),
            LayerSpec("amplify", lambda: Amplify(1e6)),
            LayerSpec("mix", lambda: nn.Linear(8, 8)),
            LayerSpec("out", lambda: nn.Linear(8, 1)),
        ]

    def loss(self, output, target):
        return (output.squeeze(-1).float() - target) ** 2

    def batch(self, n, generator=None, device="cpu"):
        x = torch.randn(n, 8, generator=generator) + 10.0
        return x.to(device), x.sum(1).to(device)


def build() -> Overflow:
    return Overflow()
