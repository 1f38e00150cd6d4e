"""Synthetic images whose class is where a bright square sits: learnable, not noise."""

from __future__ import annotations

import math

import torch


def pattern_images(
    n: int, size: int, num_classes: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    x = 0.3 * torch.randn(n, 3, size, size, generator=generator)
    grid = math.ceil(math.sqrt(num_classes))
    cell = size // grid
    for i, c in enumerate(labels.tolist()):
        r, q = divmod(c, grid)
        x[i, c % 3, r * cell : (r + 1) * cell, q * cell : (q + 1) * cell] += 1.5
    return x, labels
